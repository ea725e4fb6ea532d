"""Multi-turn tool-calling rollouts and the engines that generate them.

An engine's one public method is ``rollout(prompts, tools=None, reward_fn=None, **reward_kwargs)``
returning the rollout contract of paper Table 15: ``trajectories`` (full-tier EventLogs),
``responses``, ``rewards``, ``prompt_ids``, ``completion_ids``, ``logprobs``,
``tool_call_counts`` and ``env_mask``. Token ids and the loss mask come from each
trajectory's EventLog SFT projection in tokens (``models.chat_tokens.token_rows``), so tool results never carry loss.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.models.chat_tokens import token_rows, tokenize_messages
from agenttune_lib.rl.environments.base import episode_environments
from agenttune_lib.rl.turns import EpisodeTokens, Turn, context_ids_after_turn, observation_messages, render_prompt_ids

__all__ = [
    "RolloutConfig",
    "RolloutEngine",
    "TransformersRolloutEngine",
    "VLLMRolloutEngine",
    "create_rollout_fn",
    "episode_to_eventlog",
    "ROLLOUT_KEYS",
]

ROLLOUT_KEYS = ("trajectories", "responses", "rewards", "prompt_ids", "completion_ids", "logprobs", "tool_call_counts")


@dataclasses.dataclass
class RolloutConfig:
    """Sampling and tool-loop limits for one rollout."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    max_tool_turns: int = 3
    system_prompt: str | None = None
    max_length: int | None = 1024
    tool_format: str = "json"  # how tools are listed when the chat template has no tool format: "json" or "compact"


def split_prompt(prompt: Any, system_prompt: str | None = None) -> tuple[str | None, str]:
    """(system prompt, task text) from a string prompt or a chat-message prompt."""
    if isinstance(prompt, str):
        return system_prompt, prompt
    if isinstance(prompt, Sequence):
        system = next((m.get("content") for m in prompt if m.get("role") == "system"), system_prompt)
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        if not users:
            raise ValueError(f"a chat prompt needs a user message, got roles {[m.get('role') for m in prompt]}")
        return system, str(users[-1])
    raise TypeError(f"a prompt must be text or chat messages, got {type(prompt).__name__}")


def _segments_for_turn(text: str, tools: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Events for one assistant turn (TEXT and TOOL_CALL, in order) and the calls to execute."""
    from agenttune_lib.tools.parsing import ToolCall, parse_tool_calls

    parsed = parse_tool_calls(text) if tools else None
    if not parsed or not parsed.items:
        return [{"kind": "text", "payload": {"content": text}}], []
    events: list[dict[str, Any]] = []
    todo: list[Any] = []
    if parsed.text:
        events.append({"kind": "text", "payload": {"content": parsed.text}})
    for i, item in enumerate(parsed.items):
        if isinstance(item, ToolCall):
            call_id = item.id or f"call_{i}"
            events.append({"kind": "tool_call", "payload": {"name": item.name, "arguments": item.arguments, "id": call_id}})
            todo.append(("call", item, call_id))
        else:
            events.append({"kind": "text", "payload": {"content": item.raw or text}})
            todo.append(("error", item, None))
    return events, todo


def _execute(todo: list[Any], tools: Mapping[str, Any]) -> list[dict[str, Any]]:
    """TOOL_RESULT events for one turn's calls; unknown tools and parse errors become error observations."""
    out = []
    for what, item, call_id in todo:
        if what == "error":
            err = item.to_error()
            out.append({"kind": "tool_result", "payload": {"name": item.name or "", "content": f"error: {item.message}", "error": err}})
            continue
        tool = tools.get(item.name)
        if tool is None:
            msg = f"unknown tool {item.name!r}; available: {sorted(tools)}"
            out.append({"kind": "tool_result", "payload": {"name": item.name, "content": f"error: {msg}", "id": call_id, "error": {"type": "unknown_tool", "message": msg}}})
            continue
        out.append({"kind": "tool_result", "payload": tool.invoke(item.arguments).to_payload(call_id)})
    return out


def _message_of(event: Mapping[str, Any]) -> dict[str, Any]:
    from agenttune_lib.events import render_tool_call

    kind, payload = event["kind"], event["payload"]
    if kind == "tool_call":
        return {"role": "assistant", "content": render_tool_call(payload)}
    if kind == "tool_result":
        return {"role": "tool", "content": payload.get("content", ""), "name": payload.get("name", "")}
    return {"role": "assistant", "content": payload.get("content", "")}


def episode_to_eventlog(
    tokenizer: Any,
    system: str | None,
    task: str,
    events: list[dict[str, Any]],
    reward: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_length: int | None = None,
    id: str | None = None,
) -> tuple[EventLog, dict[str, Any]]:
    """A finished episode as a full-tier EventLog plus its token row.

    The token ids, loss mask and per-event spans come from the log's own SFT projection,
    so the trainer's mask and the warehouse's spans are the same definition.
    """
    traj: dict[str, Any] = {"task": task, "system_prompt": system, "segments": events, "metadata": dict(metadata or {})}
    draft = EventLog.from_trajectory(traj, id=id)
    row = token_rows(draft, tokenizer)[0]
    ids, mask = row["input_ids"], row["completion_mask"]
    sft = draft.as_dataset_rows("sft")[0]
    messages, weights = sft["messages"], sft["segment_weights"]
    # Message boundaries: the projection is prefix-stable, so each prefix's length is a boundary.
    bounds = [len(tokenize_messages(tokenizer, messages[: i + 1], weights[: i + 1])[0]) for i in range(len(messages))]
    first_loss = next((i for i, m in enumerate(mask) if m), len(ids))
    # The prompt is the context (system, task) plus the first turn's assistant header: what generation saw.
    n_context = len(messages) - len(events)
    context_end = bounds[n_context - 1] if n_context > 0 else 0
    first_end = bounds[n_context] if events else context_end
    prompt_len = first_loss if context_end <= first_loss <= first_end else context_end
    segments = []
    for j, ev in enumerate(events):
        start = bounds[n_context + j - 1] if n_context + j > 0 else 0
        end = bounds[n_context + j]
        seg = dict(ev)
        seg["span"] = [max(start - prompt_len, 0), max(end - prompt_len, 0)]
        segments.append(seg)
    if max_length is not None and len(ids) > max_length:
        ids, mask = ids[:max_length], mask[:max_length]
        for seg in segments:
            seg["span"] = [min(s, max_length - prompt_len) for s in seg["span"]]
    traj.update(
        prompt_ids=ids[:prompt_len],
        completion_ids=ids[prompt_len:],
        segments=segments,
        prompt=task,
    )
    if reward is not None:
        traj["reward"] = float(reward)
    log = EventLog.from_trajectory(traj, id=draft.id)
    return log, {"prompt_ids": ids[:prompt_len], "completion_ids": ids[prompt_len:], "env_mask": mask[prompt_len:]}


class RolloutEngine:
    """Base engine: subclasses implement ``generate_turns`` (token level) or ``generate_texts`` (text-only engines).

    ``rollout`` runs the tool loop around it, appending each turn's sampled ids verbatim and
    the environment's context ids (masked) between turns.
    """

    tokenizer: Any
    config: RolloutConfig

    def generate_texts(self, prompt_ids: list[list[int]]) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def generate_turns(self, prompt_ids: list[list[int]]) -> list[Turn]:
        """One sampled turn per prompt. A text-only engine's reply becomes its tokenizer's ids plus end-of-turn
        (contract 7: a scripted text is rendered in the student tokenizer), counted as finished."""
        texts = self.generate_texts(prompt_ids)
        eos = self.tokenizer.eos_token_id
        ids = [list(self.tokenizer(t, add_special_tokens=False)["input_ids"]) + ([eos] if eos is not None else []) for t in texts]
        lps = self.score_logprobs(prompt_ids, ids)
        return [Turn(i, lp, True, t) for i, lp, t in zip(ids, lps, texts)]

    def score_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Per-token logprobs of each completion under the sampling policy (zeros where it cannot score)."""
        return [[0.0] * len(c) for c in completion_ids]

    def rollout(
        self,
        prompts: Sequence[Any],
        tools: Any = None,
        reward_fn: Callable[..., Any] | None = None,
        metadata: Sequence[Mapping[str, Any]] | None = None,
        environments: Sequence[Any] | None = None,
        tasks: Sequence[Mapping[str, Any] | None] | None = None,
        **reward_kwargs: Any,
    ) -> dict[str, Any]:
        """Run one multi-turn tool-calling episode per prompt; return the Table 15 contract.

        ``environments`` (one fresh Environment per prompt, or None) and ``tasks`` (the row's task) make
        the environment own the episode: its reset gives the messages, its tools run, its reward scores.
        """
        from agenttune_lib.tools.base import as_tools

        if not prompts:
            raise ValueError("rollout needs at least one prompt")
        n = len(prompts)
        envs = list(environments) if environments is not None else [None] * n
        task_list = list(tasks) if tasks is not None else [None] * n
        if len(envs) != n or len(task_list) != n:
            raise ValueError(f"rollout: {len(envs)} environments and {len(task_list)} tasks for {n} prompts")
        shared_tools = as_tools(tools) if tools else {}
        cfg = self.config
        tool_maps: list[dict[str, Any]] = []
        convo: list[list[dict[str, Any]]] = []
        template_tools: list[Any] = []
        episodes: list[EpisodeTokens] = []
        parts: list[tuple[str | None, str]] = []
        for i, prompt in enumerate(prompts):
            env = envs[i]
            if env is not None:
                messages = [dict(m) for m in env.reset(task_list[i] or {})]
                tmap = as_tools(env.tools())
            else:
                system, task = split_prompt(prompt, cfg.system_prompt)
                rest = [{"role": "user", "content": task}] if isinstance(prompt, str) else [dict(m) for m in prompt if m.get("role") != "system"]
                messages = ([{"role": "system", "content": system}] if system else []) + rest
                tmap = shared_tools
            parts.append(split_prompt(messages))
            schemas = [t.to_schema() for t in tmap.values()]
            fmt = getattr(env, "tool_format", None) or cfg.tool_format
            ids, rendered, ttools = render_prompt_ids(self.tokenizer, messages, schemas, fmt)
            tool_maps.append(tmap)
            convo.append(rendered)
            template_tools.append(ttools)
            episodes.append(EpisodeTokens(prompt_ids=ids))
        events: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        agent_msgs: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        limits = [
            int(env.max_tool_turns) if env is not None and getattr(env, "max_tool_turns", None) is not None else cfg.max_tool_turns
            for env in envs
        ]
        active = list(range(n))
        tool_counts = [0] * n
        for turn_no in range(max(max(limits), 0) + 1):
            if not active:
                break
            turns = self.generate_turns([episodes[i].next_prompt() for i in active])
            still = []
            for i, turn in zip(active, turns):
                ep = episodes[i]
                span = ep.add_turn(turn)
                assistant = {"role": "assistant", "content": turn.text}
                agent_msgs[i].append(assistant)
                if not turn.finished:  # cut at the token limit: nothing in it is executed, the episode ends
                    events[i].append({"kind": "text", "payload": {"content": turn.text, "truncated": True}, "span": list(span)})
                    continue
                evs, todo = _segments_for_turn(turn.text, tool_maps[i])
                evs[0]["span"] = list(span)
                events[i].extend(evs)
                calls = sum(1 for w, _, _ in todo if w == "call")
                tool_counts[i] += calls
                if not todo or turn_no >= limits[i]:
                    continue
                results = _execute(todo, tool_maps[i])
                obs = observation_messages(results)
                ctx = context_ids_after_turn(self.tokenizer, convo[i], assistant, obs, template_tools[i], sampled_eos=bool(turn.ids) and turn.ids[-1] == self.tokenizer.eos_token_id)
                cspan = ep.add_context(ctx)
                for j, r in enumerate(results):
                    r["span"] = list(cspan) if j == 0 else None
                events[i].extend(results)
                convo[i] = convo[i] + [assistant] + obs
                agent_msgs[i].extend(obs)
                still.append(i)
            active = [i for i in still if cfg.max_length is None or len(episodes[i].next_prompt()) < cfg.max_length]
        for ep in episodes:
            ep.clip(cfg.max_length)
        env_rewards: list[float | None] = [None] * n
        env_success: list[bool | None] = [None] * n
        env_metrics: list[dict[str, Any]] = [{} for _ in range(n)]
        for i, env in enumerate(envs):
            if env is None:
                continue
            env_rewards[i] = _env_call(env, "reward", agent_msgs[i], task_list[i])
            env_success[i] = bool(_env_call(env, "success", agent_msgs[i], task_list[i]))
            env_metrics[i] = dict(env.metrics(agent_msgs[i])) if hasattr(env, "metrics") else {}
        metas = list(metadata) if metadata is not None else [{} for _ in range(n)]
        logs = []
        for i in range(n):
            meta = dict(metas[i])
            meta["truncated"] = episodes[i].truncated
            if envs[i] is not None:
                meta.update(environment=getattr(envs[i], "name", type(envs[i]).__name__), env_reward=env_rewards[i], env_success=env_success[i], **env_metrics[i])
                if task_list[i] and task_list[i].get("task_id") is not None:
                    meta.setdefault("task_id", str(task_list[i]["task_id"]))
            logs.append(_episode_log(parts[i][0], parts[i][1], events[i], episodes[i], meta))
        responses = [self._final_response(evs) for evs in events]
        rewards = [0.0] * n
        if reward_fn is not None:
            from agenttune_lib.rl.rewards.combine import call_reward, combine_rewards

            if isinstance(reward_fn, (list, tuple)):
                reward_fn = combine_rewards(reward_fn)
            extra = {"env_reward": env_rewards} if any(e is not None for e in envs) else {}
            rewards = call_reward(
                reward_fn, agent_msgs, prompts=list(prompts), tool_call_counts=tool_counts, trajectories=logs, **extra, **reward_kwargs
            )
            logs = [_with_reward(log, r) for log, r in zip(logs, rewards)]
        return {
            "trajectories": logs,
            "responses": responses,
            "completions": agent_msgs,
            "rewards": [float(r) for r in rewards],
            "prompt_ids": [ep.prompt_ids for ep in episodes],
            "completion_ids": [ep.completion_ids for ep in episodes],
            "logprobs": [ep.logprobs for ep in episodes],
            "env_mask": [ep.env_mask for ep in episodes],
            "truncated": [ep.truncated for ep in episodes],
            "tool_call_counts": tool_counts,
            "env_reward": env_rewards,
            "env_success": env_success,
            "env_metrics": env_metrics,
        }

    def generate(self, messages: Any) -> dict[str, Any]:
        """One assistant turn for chat ``messages`` (the spine's engine protocol): text, the sampled ids, their logprobs."""
        msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
        ids = self._render(msgs)
        turn = self.generate_turns([ids])[0]
        return {"text": turn.text, "prompt_ids": ids, "completion_ids": list(turn.ids), "logprobs": list(turn.logprobs), "finished": turn.finished}

    def _render(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @staticmethod
    def _final_response(evs: list[dict[str, Any]]) -> str:
        for ev in reversed(evs):
            if ev["kind"] == "text":
                return str(ev["payload"].get("content", ""))
        return ""


def _env_call(env: Any, method: str, completion: list[dict[str, Any]], task: Any) -> Any:
    """An environment's reward/success; a failure is an error naming the environment and the task, never a zero."""
    try:
        value = getattr(env, method)(completion)
    except Exception as exc:
        name = getattr(env, "name", type(env).__name__)
        tid = (task or {}).get("task_id", task) if isinstance(task, Mapping) else task
        from agenttune_lib.rl.rewards.builtin import RewardError

        raise RewardError(f"environment {name!r} {method}() failed on task {tid!r}: {type(exc).__name__}: {exc}") from exc
    if method == "reward":
        import math

        if value is None or not math.isfinite(float(value)):
            raise ValueError(f"environment {getattr(env, 'name', env)!r} returned a non-finite reward {value!r}")
        return float(value)
    return value


def _episode_log(system: str | None, task: str, events: list[dict[str, Any]], ep: EpisodeTokens, metadata: Mapping[str, Any]) -> EventLog:
    """The episode as a full-tier EventLog over exactly the sampled and context ids."""
    segments = []
    for ev in events:
        seg = {k: v for k, v in ev.items() if k != "span"}
        span = ev.get("span")
        if span is not None:
            s, e = min(span[0], len(ep.completion_ids)), min(span[1], len(ep.completion_ids))
            seg["span"] = [s, e]
        segments.append(seg)
    traj = {
        "task": task, "system_prompt": system, "prompt": task, "segments": segments, "metadata": dict(metadata),
        "prompt_ids": ep.prompt_ids, "completion_ids": ep.completion_ids, "logprobs": ep.logprobs,
    }
    return EventLog.from_trajectory(traj)


def _with_reward(log: EventLog, reward: float) -> EventLog:
    from agenttune_lib.events import Event

    events = list(log.events) + [Event(EventKind.REWARD, {"value": float(reward)}, scope="episode")]
    return EventLog(events, tier=log.tier, id=log.id, metadata=log.metadata, token_ids=log.token_ids)


class TransformersRolloutEngine(RolloutEngine):
    """Local batched generation with a transformers causal LM (the policy itself, so it sees every update)."""

    def __init__(self, model: Any, tokenizer: Any, config: RolloutConfig | None = None, batch_size: int = 16) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.batch_size = batch_size

    def generate_texts(self, prompt_ids: list[list[int]]) -> list[str]:
        return [t.text for t in self.generate_turns(prompt_ids)]

    def generate_turns(self, prompt_ids: list[list[int]]) -> list[Turn]:
        """Sample one turn per prompt; keep the sampled ids (through end-of-turn) and their logprobs at the sampling temperature."""
        import torch

        cfg = self.config
        tok = self.tokenizer
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        temperature = float(cfg.temperature) if cfg.do_sample else 1.0
        out: list[Turn] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prompt_ids), self.batch_size):
                chunk = prompt_ids[start : start + self.batch_size]
                width = max(len(c) for c in chunk)
                ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])
                attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])
                device = next(self.model.parameters()).device
                with torch.no_grad():
                    gen = self.model.generate(
                        input_ids=ids.to(device),
                        attention_mask=attn.to(device),
                        max_new_tokens=cfg.max_new_tokens,
                        do_sample=cfg.do_sample,
                        temperature=cfg.temperature if cfg.do_sample else None,
                        top_p=cfg.top_p if cfg.do_sample else None,
                        top_k=0 if cfg.do_sample else None,
                        pad_token_id=pad,
                        eos_token_id=eos,
                        return_dict_in_generate=True,
                        output_logits=True,
                    )
                new = gen.sequences[:, width:]
                logps = torch.stack(gen.logits, dim=1).float().div(temperature).log_softmax(-1)
                for b, row in enumerate(new.tolist()):
                    finished = eos in row
                    keep = row.index(eos) + 1 if finished else len(row)
                    sampled = row[:keep]
                    lp = logps[b, torch.arange(keep), torch.tensor(sampled, dtype=torch.long)].tolist() if keep else []
                    out.append(Turn(sampled, [float(x) for x in lp], finished, tok.decode(sampled, skip_special_tokens=True)))
        finally:
            if was_training:
                self.model.train()
        return out

    def score_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Teacher-forced per-token logprobs of each completion under the current policy."""
        import torch

        out = []
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for p, c in zip(prompt_ids, completion_ids):
                if not c:
                    out.append([])
                    continue
                ids = torch.tensor([p + c], device=device)
                logits = self.model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
                lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(c, device=device)[:, None])[:, 0]
                out.append([float(x) for x in lp.tolist()])
        return out

    def follows_policy(self, model: Any) -> bool:
        """Whether this engine samples with ``model`` itself (PEFT wraps it in place), so it sees every update."""
        inner = getattr(model, "get_base_model", None)
        return self.model is model or (inner is not None and self.model is inner())

    def load_adapter_state(self, state: Mapping[str, Any]) -> None:
        """Load pushed LoRA weights into this engine's PEFT policy; a push that is not exactly its adapter raises."""
        from peft import set_peft_model_state_dict

        from agenttune_lib.rl.lora import adapter_shapes, require_same_adapter_keys

        require_same_adapter_keys(adapter_shapes(self.model), state, where=type(self).__name__)
        set_peft_model_state_dict(self.model, dict(state))


class VLLMRolloutEngine(RolloutEngine):
    """Batched generation with vLLM (colocated); needs the optional ``gpu`` extra.

    For evaluation and teacher rollouts only: it loads ``model_path`` once and never receives a trainer's
    weights, so create_agentic_trainer refuses it as a training engine.
    """

    receives_weights = False

    def __init__(self, model_path: str, tokenizer: Any = None, config: RolloutConfig | None = None, **llm_kwargs: Any) -> None:
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "the vllm rollout engine needs vLLM, which is not installed; install the GPU extra with "
                "`pip install -e '.[gpu]'` on a CUDA machine (vLLM replaces the CPU torch build), or use engine='transformers'"
            ) from exc
        from transformers import AutoTokenizer
        from vllm import LLM

        self.llm = LLM(model=model_path, **llm_kwargs)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.config = config or RolloutConfig()

    def generate_texts(self, prompt_ids: list[list[int]]) -> list[str]:
        from vllm import SamplingParams, TokensPrompt

        cfg = self.config
        params = SamplingParams(
            max_tokens=cfg.max_new_tokens, temperature=cfg.temperature if cfg.do_sample else 0.0, top_p=cfg.top_p
        )
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params)
        return [o.outputs[0].text for o in outs]

    def generate_turns(self, prompt_ids: list[list[int]]) -> list[Turn]:
        """vLLM's own sampled token ids and their logprobs; finished when it stopped on end-of-turn."""
        from vllm import SamplingParams, TokensPrompt

        cfg = self.config
        params = SamplingParams(
            max_tokens=cfg.max_new_tokens, temperature=cfg.temperature if cfg.do_sample else 0.0, top_p=cfg.top_p, logprobs=0
        )
        out = []
        for o in self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[tid].logprob) for step, tid in zip(c.logprobs or [], ids)] if c.logprobs else [0.0] * len(ids)
            out.append(Turn(ids, lps, c.finish_reason == "stop", c.text))
        return out


def _dataset_columns(trainer: Any, prompts: Sequence[Any]) -> list[dict[str, Any]]:
    return [{} for _ in prompts]


def create_rollout_fn(
    engine: RolloutEngine | None = None,
    tools: Any = None,
    reward_fn: Callable[..., Any] | None = None,
    sink: Callable[[list[EventLog]], None] | None = None,
    config: RolloutConfig | None = None,
    environments: Mapping[str, Callable[[], Any]] | None = None,
) -> Callable[..., dict[str, Any]]:
    """A TRL ``rollout_func(prompts, trainer)`` running the tool loop; also callable as ``fn(prompts)``.

    ``environments`` maps an environment name to a factory of fresh instances; a dataset row's
    ``environment`` column picks one per episode and its ``task`` column is what it resets to.

    Without ``engine`` it generates with the trainer's own (current) policy. ``sink``
    receives every rollout's EventLogs (e.g. a warehouse writer). Ray engines get the
    trainer's new LoRA weights whenever the global step has advanced.
    """
    state = {"synced_step": -1, "engine": engine}
    history: list[dict[str, Any]] = []
    pending: dict[str, EventLog] = {}

    def flush(rewards_by_id: Mapping[str, float]) -> None:
        """Write pending rollouts to the sink with their episode rewards."""
        logs = [_with_reward(pending.pop(i), r) for i, r in rewards_by_id.items() if i in pending]
        if logs and sink is not None:
            sink(logs)

    def rollout_func(prompts: Sequence[Any], trainer: Any = None) -> dict[str, Any]:
        eng = state["engine"]
        if eng is None:
            if trainer is None:
                raise ValueError("create_rollout_fn() without an engine must be called by a trainer (rollout_func(prompts, trainer))")
            model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
            eng = TransformersRolloutEngine(model, trainer.processing_class, config or _config_from_trainer(trainer))
            state["engine"] = eng
        elif trainer is not None and hasattr(eng, "push_weights") and trainer.state.global_step != state["synced_step"]:
            from peft import get_peft_model_state_dict

            model = trainer.accelerator.unwrap_model(trainer.model)
            if state["synced_step"] == -1 and hasattr(eng, "require_policy_match"):
                eng.require_policy_match(model)  # a differing adapter would sample from another policy
            eng.push_weights({k: v.detach().cpu() for k, v in get_peft_model_state_dict(model).items()})
            state["synced_step"] = trainer.state.global_step
        rows = getattr(trainer, "_agentic_inputs", None) if trainer is not None else None
        envs, tasks = episode_environments(rows, len(prompts), environments)
        out = eng.rollout(prompts, tools=tools, reward_fn=reward_fn, environments=envs, tasks=tasks)
        if trainer is not None and "weights_version" in out and set(out["weights_version"]) != {getattr(eng, "version", None)}:
            raise RuntimeError(
                f"rollouts were sampled with policy versions {sorted(set(out['weights_version']))} but the engine pushed version "
                f"{getattr(eng, 'version', None)}: some actor did not load the trainer's weights (stale, off-policy samples)"
            )
        if sink is not None:
            if trainer is not None and hasattr(trainer, "attach_rollout_rewards"):
                # The trainer scores rollouts after this returns; it writes them with their rewards.
                pending.update({log.id: log for log in out["trajectories"]})
            else:
                sink(out["trajectories"])
        history.append({"n": len(prompts), "tool_call_counts": list(out["tool_call_counts"]), "rewards": list(out["rewards"])})
        # TRL forwards extra keys to reward functions; EventLogs travel as JSON-able dicts.
        return {
            "prompt_ids": out["prompt_ids"],
            "completion_ids": out["completion_ids"],
            "logprobs": out["logprobs"],
            "env_mask": out["env_mask"],
            "tool_call_counts": out["tool_call_counts"],
            "responses": out["responses"],
            "agent_completions": out["completions"],
            "trajectory_ids": [log.id for log in out["trajectories"]],
            "truncated": out["truncated"],
            "env_reward": out["env_reward"],
            "env_success": out["env_success"],
        }

    rollout_func.history = history  # type: ignore[attr-defined]
    rollout_func.engine = engine  # type: ignore[attr-defined]
    rollout_func.flush = flush  # type: ignore[attr-defined]
    rollout_func.pending = pending  # type: ignore[attr-defined]
    rollout_func.tools = tools  # type: ignore[attr-defined]
    rollout_func.environments = environments  # type: ignore[attr-defined]
    return rollout_func


def _config_from_trainer(trainer: Any) -> RolloutConfig:
    args = trainer.args
    return RolloutConfig(
        max_new_tokens=int(getattr(args, "max_completion_length", 64) or 64),
        temperature=float(getattr(args, "temperature", 1.0) or 1.0),
        top_p=float(getattr(args, "top_p", 1.0) or 1.0),
        max_tool_turns=int(getattr(args, "max_tool_calling_iterations", None) or 3),
        max_length=None,  # each turn is bounded by max_completion_length and the episode by max_tool_turns
    )


def completions_as_text(completions: Sequence[Any]) -> list[str]:
    """Completions (text or messages) as plain text, for logging."""
    return [c if isinstance(c, str) else json.dumps(copy.deepcopy(c)) for c in completions]
