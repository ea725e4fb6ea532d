"""Token-weighted SFT: paper Table 3's per-segment weights (tool call 2.0, text/reasoning 1.0, tool results 0) in the loss.

Why a subclass: TRL's SFTTrainer computes an unweighted mean NLL over the completion mask,
so a tool-call token would count the same as a text token. ``WeightedSFTTrainer`` keeps
TRL's data preparation, LoRA and optimisation and replaces only the loss with
``sum(w_t * nll_t) / sum(w_t)`` over tokens with ``w_t > 0``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl import SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

__all__ = ["WeightedSFTTrainer", "WeightedCollator", "weighted_token_loss", "weighted_rows"]


def weighted_token_loss(logits: Any, labels: Any, weights: Any) -> Any:
    """Weighted mean next-token NLL: position t predicts ``labels[t+1]`` with weight ``weights[t+1]``; -100 labels carry none."""
    import torch
    import torch.nn.functional as F

    shift_logits = logits[..., :-1, :].float()
    shift_labels = labels[..., 1:]
    shift_w = weights[..., 1:].to(shift_logits.dtype)
    valid = shift_labels != -100
    shift_w = torch.where(valid, shift_w, torch.zeros_like(shift_w))
    nll = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.clamp(min=0).reshape(-1), reduction="none"
    ).view_as(shift_w)
    return (nll * shift_w).sum() / shift_w.sum().clamp(min=1e-8)


def weighted_rows(rows: Sequence[dict[str, Any]], max_length: int | None = None) -> list[dict[str, Any]]:
    """Token rows (``input_ids``, ``token_weights``) as trainer rows: labels are -100 wherever the weight is 0."""
    out = []
    for row in rows:
        ids, w = list(row["input_ids"]), [float(x) for x in row["token_weights"]]
        if len(ids) != len(w):
            raise ValueError(f"row {row.get('id', '?')!r}: {len(ids)} input_ids but {len(w)} token_weights")
        if max_length is not None:
            ids, w = ids[:max_length], w[:max_length]
        if not any(x > 0 for x in w):
            continue
        out.append({"input_ids": ids, "labels": [t if x > 0 else -100 for t, x in zip(ids, w)], "token_weights": w})
    return out


class WeightedCollator:
    """TRL's padding collator plus a ``token_weights`` tensor padded with 0."""

    def __init__(self, pad_token_id: int) -> None:
        self.base = DataCollatorForLanguageModeling(pad_token_id=pad_token_id)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = self.base([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
        width = batch["input_ids"].shape[1]
        weights = torch.zeros((len(examples), width), dtype=torch.float32)
        for i, e in enumerate(examples):
            w = torch.tensor(e["token_weights"], dtype=torch.float32)
            weights[i, : len(w)] = w
        batch["token_weights"] = weights
        return batch


class WeightedSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss weights each target token by its Table 3 segment weight (dataset column ``token_weights``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        processing_class = kwargs.get("processing_class")
        if kwargs.get("data_collator") is None and processing_class is not None:
            pad = processing_class.pad_token_id if processing_class.pad_token_id is not None else processing_class.eos_token_id
            kwargs["data_collator"] = WeightedCollator(pad)
        super().__init__(*args, **kwargs)

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "labels", "token_weights"]

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        weights = inputs.pop("token_weights")
        labels = inputs.pop("labels")
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), use_cache=False)
        loss = weighted_token_loss(outputs.logits, labels, weights)
        return (loss, outputs) if return_outputs else loss
