"""Model-backed stages: llm_call (schema-validated reply), llm_judge (rubric score), router (LLM or rules)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from agenttune_lib.decide.errors import RuleError
from agenttune_lib.decide.models import ModelRequest
from agenttune_lib.decide.rules import MISSING, evaluate_rule, lookup_path
from agenttune_lib.decide.stages.base import Stage, StageContext, StageResult, extract_json, jsonable
from agenttune_lib.decide.state import PipelineState

__all__ = ["LLMCallStage", "LLMJudgeStage", "RouterStage", "JUDGE_SCHEMA", "schema_shape"]

JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}, "reason": {"type": "string"}},
    "required": ["score"],
}


def _schema_errors(schema: Mapping[str, Any], value: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    ]


def schema_shape(schema: Mapping[str, Any]) -> str:
    """A fill-in template of a JSON schema: ``{"age": <integer 0-120>, "band": <"low" | "high">}``."""
    if "enum" in schema:
        return "<" + " | ".join(json.dumps(v) for v in schema["enum"]) + ">"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if not props:
            return "{...}"
        return "{" + ", ".join(f"{json.dumps(k)}: {schema_shape(v)}" for k, v in props.items()) + "}"
    if kind == "array":
        return f"[{schema_shape(schema.get('items') or {})}, ...]"
    if kind == "boolean":
        return "<true or false>"
    if kind in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        span = f" {lo:g}-{hi:g}" if lo is not None and hi is not None else f" >= {lo:g}" if lo is not None else f" <= {hi:g}" if hi is not None else ""
        return f"<{kind}{span}>"
    if kind == "null":
        return "null"
    return "<string>" if kind == "string" else "<value>"


class _ModelStage(Stage):
    """Shared call-validate-retry loop."""

    def model_name(self) -> str:
        name = self.spec.get("model", "default")
        return "default" if name in (True, None) else str(name)

    def check(self, ctx: StageContext) -> None:
        if self.model_name() not in ctx.models:
            raise self.error(f"needs model {self.model_name()!r}, but the runner has {sorted(ctx.models) or 'no models'}")

    def call(
        self,
        state: PipelineState,
        ctx: StageContext,
        prompt: str,
        parse: Callable[[str], Any],
        schema: Mapping[str, Any] | None = None,
        choices: tuple[str, ...] | None = None,
    ) -> StageResult:
        model = ctx.models[self.model_name()]
        retries = ctx.max_retries if ctx.max_retries is not None else int(ctx.llm_setting(self.spec, "retries", 1))
        max_new = ctx.max_new_tokens or int(ctx.llm_setting(self.spec, "max_new_tokens", 256))
        system = self.spec.get("system", (ctx.settings.get("llm") or {}).get("system"))
        system = self.interpolate(system, state) if isinstance(system, str) else None
        attempts: list[dict[str, Any]] = []
        current = prompt
        for attempt in range(1, retries + 2):
            request = ModelRequest(
                prompt=current,
                system=system,
                stage_id=self.id,
                stage_type=self.type,
                template_id=self.config.id,
                attempt=attempt,
                max_new_tokens=max_new,
                temperature=float(ctx.llm_setting(self.spec, "temperature", 0.0)),
                output_schema=dict(schema) if schema is not None else None,
                choices=choices,
            )
            try:
                reply = model.generate(request)
            except Exception as exc:  # a backend failure is this stage's failure, never a crash of the run
                attempts.append({"prompt": current, "reply": None, "error": f"model call failed: {type(exc).__name__}: {exc}"})
                raise self.error(f"model call failed: {type(exc).__name__}: {exc}", detail=attempts) from None
            try:
                value = parse(reply)
            except ValueError as exc:
                attempts.append({"prompt": current, "reply": reply, "error": str(exc)})
                current = (
                    f"{prompt}\n\nYour previous reply was rejected ({exc}). "
                    "Reply again with only what was asked for."
                )
                continue
            attempts.append({"prompt": current, "reply": reply, "error": None})
            return StageResult(output=jsonable(value), prompt=prompt, attempts=attempts)
        last = attempts[-1]["error"]
        raise self.error(f"model reply rejected after {len(attempts)} attempt(s): {last}", detail=attempts)

    def json_parser(self, schema: Mapping[str, Any] | None) -> Callable[[str], Any]:
        def parse(reply: str) -> Any:
            value = extract_json(reply)
            if schema is not None:
                problems = _schema_errors(schema, value)
                if problems:
                    raise ValueError(f"reply does not match output_schema: {'; '.join(problems[:3])}")
            return value

        return parse

    def with_format(self, prompt: str, schema: Mapping[str, Any] | None, ctx: StageContext) -> str:
        """Append the reply format: a fill-in shape (default; small models copy it well) or the raw JSON schema."""
        if schema is None:
            return prompt
        llm = ctx.settings.get("llm") or {}
        if llm.get("schema_format", "shape") == "json_schema":
            instruction = llm.get("json_instruction", "Respond with only a JSON object matching this JSON schema:")
            return f"{prompt}\n\n{instruction}\n{json.dumps(schema, sort_keys=True)}"
        instruction = llm.get("shape_instruction", "Reply with only a JSON object of this shape, filling in the values:")
        return f"{prompt}\n\n{instruction}\n{schema_shape(schema)}"


class LLMCallStage(_ModelStage):
    """One model call; the reply must be JSON valid against ``output_schema`` (retried, then the stage fails)."""

    type = "llm_call"

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        schema = self.spec.get("output_schema")
        prompt = self.with_format(self.interpolate(self.spec["prompt"], state), schema, ctx)
        if schema is None:
            result = self.call(state, ctx, prompt, lambda reply: {"text": reply.strip()})
        else:
            result = self.call(state, ctx, prompt, self.json_parser(schema), schema=schema)
        return result


class LLMJudgeStage(_ModelStage):
    """Scores an upstream output on a rubric: ``{"score": 0..1, "reason"}``; routes on_pass / on_fail by threshold."""

    type = "llm_judge"

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        rubric = self.spec.get("rubric")
        prompt = self.interpolate(self.spec["prompt"], state)
        if rubric:
            prompt = f"{prompt}\n\nRubric:\n{self.interpolate(str(rubric), state)}"
        schema = self.spec.get("output_schema", JUDGE_SCHEMA)
        result = self.call(state, ctx, self.with_format(prompt, schema, ctx), self.json_parser(schema), schema=schema)
        score = result.output.get("score") if isinstance(result.output, Mapping) else None
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise self.error(f"judge reply has no numeric score: {result.output!r}")
        threshold = float(self.spec.get("threshold", (ctx.settings.get("judge") or {}).get("threshold", 0.5)))
        passed = float(score) >= threshold
        result.score = float(score)
        result.output = {**result.output, "passed": passed, "threshold": threshold}
        result.next = self.spec.get("on_pass") if passed else self.spec.get("on_fail")
        return result


class RouterStage(_ModelStage):
    """Dispatch to one ``on_result`` target: by a model's choice (``model:``) or by rules (``field``/``conditions``)."""

    type = "router"

    def labels(self) -> tuple[str, ...]:
        return tuple(str(k) for k in self.spec["on_result"])

    def check(self, ctx: StageContext) -> None:
        if "model" in self.spec:
            super().check(ctx)

    def _target(self, label: str) -> str:
        return {str(k): v for k, v in self.spec["on_result"].items()}[label]

    def _parse_choice(self, reply: str) -> str:
        labels = self.labels()
        candidates = []
        try:
            value = extract_json(reply)
            if isinstance(value, Mapping):
                candidates += [str(value[k]) for k in ("route", "label", "result", "category") if k in value]
            elif isinstance(value, str):
                candidates.append(value)
        except ValueError:
            pass
        candidates.append(reply.strip().strip("\"'`.").strip())
        for cand in candidates:
            for label in labels:
                if cand.lower() == label.lower():
                    return label
        raise ValueError(f"reply names none of the routes {list(labels)}: {reply.strip()[:80]!r}")

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        labels = self.labels()
        if "model" in self.spec:
            prompt = self.interpolate(self.spec["prompt"], state)
            prompt += f"\n\nAnswer with exactly one of: {', '.join(labels)}."
            result = self.call(state, ctx, prompt, self._parse_choice, choices=labels)
            label = result.output
            result.output = {"route": label}
            result.next = self._target(label)
            return result
        ns = state.namespace()
        label: str | None = None
        evaluated = []
        try:
            for cond, rule in zip(self.spec.get("conditions") or [], self.config.rules.get(self.id, [])):
                hit = evaluate_rule(rule, ns)
                evaluated.append({"when": rule.source, "result": str(cond["result"]), "value": hit})
                if hit:
                    label = str(cond["result"])
                    break
        except RuleError as exc:
            raise self.error(exc.bare_message) from None
        if label is None and "field" in self.spec:
            value = lookup_path(ns, str(self.spec["field"]))
            if value is MISSING:
                raise self.error(f"router field {self.spec['field']!r} is not in the pipeline state")
            matches = [lab for lab in labels if lab.lower() == str(value).strip().lower()]
            label = matches[0] if matches else None
        if label is None and "default" in self.spec:
            label = str(self.spec["default"])
        if label is None:
            raise self.error(f"no route matched and no default; routes: {list(labels)}")
        return StageResult(output={"route": label, "evaluated": evaluated}, next=self._target(label))


