"""ConfigLoader: template files → validated TemplateConfig (extends chain, global config, edge list).

Template identifiers are paths under the templates directory without the ``.yaml``
suffix (``bfsi/kyc_triage``); anything with ``..``, an absolute path, backslashes or other
path tricks is rejected before a file is opened.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agenttune_lib.decide.errors import RuleError, TemplateError
from agenttune_lib.decide.rules import Rule, compile_rule

__all__ = [
    "EXPECTED_LABEL_KEY",
    "expected_labels",
    "split_expected",
    "split_expected_rows",
    "ConfigLoader",
    "TemplateConfig",
    "STAGE_TYPES",
    "ROUTE_KEYS",
    "deep_merge",
    "default_templates_dir",
    "validate_identifier",
]

STAGE_TYPES: tuple[str, ...] = (
    "llm_call",
    "router",
    "llm_judge",
    "rules",
    "parallel",
    "tool_call",
    "human_review",
    "output",
)
#: Stage keys whose value names the next stage.
ROUTE_KEYS: tuple[str, ...] = ("next", "on_failed", "on_pass", "on_fail", "on_approved", "on_denied")
#: Stage types a parallel branch may have: independent work without routing of its own.
BRANCH_TYPES: tuple[str, ...] = ("llm_call", "llm_judge", "tool_call")

GLOBAL_CONFIG = "_global"
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
_STAGE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_RESERVED_IDS = {"input", "input_text", "verdict", "run_id", "template_id", "injected", "visits", "true", "false", "null"}


def default_templates_dir() -> Path:
    """The ``decide_templates`` package directory (works from a source tree and an installed wheel)."""
    import decide_templates

    if getattr(decide_templates, "__file__", None):
        return Path(decide_templates.__file__).resolve().parent
    return Path(next(iter(decide_templates.__path__))).resolve()  # an editable install may map it as a namespace


def validate_identifier(identifier: Any, what: str = "template identifier") -> str:
    """Return ``identifier`` if it is a safe relative name (``a/b_c``); raise TemplateError otherwise."""
    if not isinstance(identifier, str) or not identifier:
        raise TemplateError(f"{what} must be a non-empty string, got {identifier!r}")
    ident = identifier[:-5] if identifier.endswith(".yaml") else identifier
    problems = []
    if "\x00" in ident:
        problems.append("contains a NUL byte")
    if ".." in ident:
        problems.append("contains '..'")
    if ident.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", ident):
        problems.append("is an absolute path")
    if "\\" in ident:
        problems.append("contains a backslash")
    if not problems:
        for segment in ident.split("/"):
            if not _SEGMENT.match(segment):
                problems.append(f"has an invalid path segment {segment!r} (letters, digits, '_' and '-' only)")
                break
    if problems:
        raise TemplateError(f"{what} {identifier!r} rejected: {'; '.join(problems)}")
    return ident


def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key (override wins); anything else is replaced by the override."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in override.items():
            out[key] = deep_merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def _union_redact(merged: dict[str, Any], base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """``redact.input_fields`` accumulate along the extends chain: a child adds fields, it never drops its base's
    (a child that lists only its own would otherwise stop redacting the base's email and phone)."""
    fields: list[Any] = []
    for part in (base, child):
        red = part.get("redact") if isinstance(part, Mapping) else None
        listed = red.get("input_fields") if isinstance(red, Mapping) else None
        if isinstance(listed, list):
            fields += [f for f in listed if f not in fields]
    if fields or isinstance(merged.get("redact"), Mapping):
        merged = dict(merged)
        merged["redact"] = {**(merged.get("redact") or {}), "input_fields": fields}
    return merged


def _merge_stages(parent: list[dict[str, Any]], child: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A child stage with a parent's id deep-merges into it in place; new stages append."""
    merged = [copy.deepcopy(s) for s in parent]
    index = {s.get("id"): i for i, s in enumerate(merged)}
    for stage in child:
        sid = stage.get("id") if isinstance(stage, Mapping) else None
        if sid in index:
            merged[index[sid]] = deep_merge(merged[index[sid]], stage)
        else:
            merged.append(copy.deepcopy(stage))
    return merged


@dataclasses.dataclass
class TemplateConfig:
    """A resolved template: merged settings, ordered stages, entry stage and the generated edge list."""

    id: str
    path: Path
    raw: dict[str, Any]
    stages: list[dict[str, Any]]
    entry: str
    edges: list[dict[str, str]]
    settings: dict[str, Any]
    rules: dict[str, list[Rule]] = dataclasses.field(default_factory=dict)
    chain: list[str] = dataclasses.field(default_factory=list)

    @property
    def stage_map(self) -> dict[str, dict[str, Any]]:
        return {s["id"]: s for s in self.stages}

    @property
    def description(self) -> str:
        return str(self.raw.get("description", "")).strip()

    @property
    def domain(self) -> str:
        return str(self.raw.get("domain", self.id.split("/")[0] if "/" in self.id else ""))

    @property
    def max_steps(self) -> int:
        return int(self.settings.get("max_steps", 25))

    @property
    def redact_fields(self) -> list[str]:
        return list((self.raw.get("redact") or {}).get("input_fields") or [])

    @property
    def examples(self) -> list[Any]:
        """The example inputs, each without its ``expected_label`` (a run never sees the answer)."""
        return [inp for inp, _ in self.labelled_examples]

    @property
    def labelled_examples(self) -> list[tuple[Any, tuple[str, ...] | None]]:
        """``(input, accepted verdict labels or None)`` per example row: the template author's answer where stated."""
        return [split_expected(e) for e in self.raw.get("examples") or []]

    @property
    def destinations(self) -> list[dict[str, Any]]:
        """The template's top-level ``destinations`` plus every output stage's, without duplicates."""
        import json

        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        specs = list(self.raw.get("destinations") or [])
        for stage in self.stages:
            if stage["type"] == "output":
                specs.extend(stage.get("destinations") or [])
        for spec in specs:
            key = json.dumps(spec, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                out.append(dict(spec))
        return out

    def targets(self, stage_id: str) -> list[str]:
        """Every stage ``stage_id`` can route to."""
        return sorted({e["target"] for e in self.edges if e["source"] == stage_id})


class ConfigLoader:
    """Reads templates from one directory, resolving ``extends`` and merging ``_global.yaml``."""

    def __init__(self, templates_dir: str | Path | None = None) -> None:
        self.templates_dir = Path(templates_dir).resolve() if templates_dir is not None else default_templates_dir()
        if not self.templates_dir.is_dir():
            raise TemplateError(f"templates directory {str(self.templates_dir)!r} does not exist")

    # -- files -------------------------------------------------------------------
    def path_for(self, identifier: str) -> Path:
        """The file of a validated identifier; refuses anything resolving outside the directory."""
        ident = validate_identifier(identifier)
        path = (self.templates_dir / f"{ident}.yaml").resolve()
        if not path.is_relative_to(self.templates_dir):
            raise TemplateError(f"template identifier {identifier!r} rejected: resolves outside the templates directory")
        return path

    def read_yaml(self, identifier: str) -> dict[str, Any]:
        """Parse one file; a syntax error names the line and column."""
        path = self.path_for(identifier)
        if not path.is_file():
            raise TemplateError(f"no template file {path.name!r} under {str(self.templates_dir)!r}", template=identifier)
        text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            if mark is not None:
                raise TemplateError(
                    f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}", template=identifier
                ) from None
            raise TemplateError(f"YAML syntax error: {problem}", template=identifier) from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise TemplateError(f"top level must be a mapping, got {type(data).__name__}", template=identifier)
        return data

    def global_config(self) -> dict[str, Any]:
        if (self.templates_dir / f"{GLOBAL_CONFIG}.yaml").is_file():
            return self.read_yaml(GLOBAL_CONFIG)
        return {}

    def _resolve_chain(self, identifier: str, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
        ident = validate_identifier(identifier)
        if ident in seen:
            raise TemplateError(f"extends chain loops: {' -> '.join(seen + (ident,))}", template=seen[0])
        data = self.read_yaml(ident)
        parent_id = data.pop("extends", None)
        if parent_id is None:
            return data, [ident]
        try:
            parent_ident = validate_identifier(parent_id, what="extends target")
        except TemplateError as exc:
            raise TemplateError(exc.bare_message, template=ident) from None
        parent, chain = self._resolve_chain(parent_ident, seen + (ident,))
        merged = deep_merge({k: v for k, v in parent.items() if k != "stages"}, {k: v for k, v in data.items() if k != "stages"})
        merged["stages"] = _merge_stages(list(parent.get("stages") or []), list(data.get("stages") or []))
        merged = _union_redact(merged, parent, data)
        return merged, chain + [ident]

    # -- load --------------------------------------------------------------------
    def load(self, identifier: str) -> TemplateConfig:
        """Resolve, merge and validate one template."""
        ident = validate_identifier(identifier)
        data, chain = self._resolve_chain(ident)
        global_cfg = self.global_config()
        settings = deep_merge(global_cfg.get("settings") or {}, data.get("settings") or {})
        raw = deep_merge({k: v for k, v in global_cfg.items() if k not in ("settings", "stages")}, data)
        raw = _union_redact(raw, global_cfg, data)
        raw["settings"] = settings
        return build_config(ident, self.path_for(ident), raw, chain)

    def load_mapping(self, identifier: str, data: Mapping[str, Any]) -> TemplateConfig:
        """Validate an in-memory template (merged with the global config) under ``identifier``."""
        global_cfg = self.global_config()
        raw = deep_merge({k: v for k, v in global_cfg.items() if k not in ("settings", "stages")}, dict(data))
        raw.pop("extends", None)
        raw["settings"] = deep_merge(global_cfg.get("settings") or {}, data.get("settings") or {})
        return build_config(identifier, self.templates_dir / f"{identifier}.yaml", raw, [identifier])

    def identifiers(self) -> list[str]:
        """Every template under the directory, skipping ``_``-prefixed bases and the global config."""
        out = []
        for path in sorted(self.templates_dir.rglob("*.yaml")):
            rel = path.relative_to(self.templates_dir).with_suffix("")
            if any(part.startswith("_") for part in rel.parts):
                continue
            out.append(rel.as_posix())
        return out


def _stage_error(template: str, stage: str | None, message: str) -> TemplateError:
    return TemplateError(message, template=template, stage=stage)


def _compile_rule(template: str, stage: str, source: Any) -> Rule:
    try:
        return compile_rule(source)
    except RuleError as exc:
        raise _stage_error(template, stage, exc.bare_message) from None


def _check_stage(template: str, stage: Any, index: int, seen: set[str], branch: bool = False) -> dict[str, Any]:
    if not isinstance(stage, Mapping):
        raise _stage_error(template, None, f"stage #{index} must be a mapping, got {type(stage).__name__}")
    sid = stage.get("id")
    if not isinstance(sid, str) or not _STAGE_ID.match(sid) or sid in _RESERVED_IDS:
        raise _stage_error(template, None, f"stage #{index} has an invalid id {sid!r} (a letter, then letters, digits or '_'; not a reserved name)")
    if sid in seen:
        raise _stage_error(template, sid, "duplicate stage id")
    seen.add(sid)
    stype = stage.get("type")
    if stype not in STAGE_TYPES:
        raise _stage_error(template, sid, f"unknown stage type {stype!r}; known types: {list(STAGE_TYPES)}")
    if branch and stype not in BRANCH_TYPES:
        raise _stage_error(template, sid, f"a parallel branch must be one of {list(BRANCH_TYPES)}, got {stype!r}")
    need = {
        "llm_call": ("prompt",),
        "llm_judge": ("prompt",),
        "tool_call": ("tool",),
        "rules": ("rules",),
        "parallel": ("branches",),
        "router": ("on_result",),
    }.get(stype, ())
    for key in need:
        if key not in stage:
            raise _stage_error(template, sid, f"{stype} stage needs {key!r}")
    for key in ("prompt", "system"):
        if key in stage and not isinstance(stage[key], str):
            raise _stage_error(template, sid, f"{key!r} must be a string")
    if "output_schema" in stage:
        schema = stage["output_schema"]
        if not isinstance(schema, Mapping):
            raise _stage_error(template, sid, "output_schema must be a mapping (a JSON schema)")
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise _stage_error(template, sid, f"output_schema is not a valid JSON schema: {exc.message}") from None
    if stype == "tool_call":
        if not isinstance(stage["tool"], str):
            raise _stage_error(template, sid, "tool must be a tool name")
        if not isinstance(stage.get("args", {}), Mapping):
            raise _stage_error(template, sid, "args must be a mapping")
    for key in ("timeout_seconds", "threshold"):
        if key in stage and (isinstance(stage[key], bool) or not isinstance(stage[key], (int, float))):
            raise _stage_error(template, sid, f"{key} must be a number, got {stage[key]!r}")
    return dict(stage)


#: The key of an input row (a template example, an evaluation or input file row) holding its expected verdict label(s).
EXPECTED_LABEL_KEY = "expected_label"


def expected_labels(value: Any) -> tuple[str, ...]:
    """The verdict labels an expectation accepts: one label, or a non-empty list of them (an ambiguous input)."""
    labels = [value] if isinstance(value, str) else value
    if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(x, str) and x.strip() for x in labels):
        raise ValueError(f"{EXPECTED_LABEL_KEY} must be a verdict label or a non-empty list of labels, got {value!r}")
    return tuple(labels)


def split_expected(row: Any) -> tuple[Any, tuple[str, ...] | None]:
    """``(input without its expected_label, accepted labels or None)`` for one input row."""
    if not isinstance(row, Mapping) or EXPECTED_LABEL_KEY not in row:
        return row, None
    return {k: v for k, v in row.items() if k != EXPECTED_LABEL_KEY}, expected_labels(row[EXPECTED_LABEL_KEY])


def split_expected_rows(rows: list[Any], where: str) -> list[tuple[Any, tuple[str, ...] | None]]:
    """``split_expected`` over input rows; a bad expectation raises ValueError naming ``where`` and the row."""
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(split_expected(row))
        except ValueError as exc:
            raise ValueError(f"{where} row {i}: {exc}") from None
    return out


def _verdict_labels(stages: list[dict[str, Any]]) -> set[str] | None:
    """Every label a run of these stages can end with (``human_review:<id>`` for a parked review), or None when an
    output's label is interpolated (``{stage.output.x}``) and cannot be listed."""
    labels = {f"human_review:{s['id']}" for s in stages if s["type"] == "human_review"} | {"error"}
    for s in stages:
        if s["type"] == "output":
            label = (s.get("verdict") or {}).get("label")
            if not isinstance(label, str) or "{" in label:
                return None
            labels.add(label)
    return labels


def _check_examples(template: str, raw: dict[str, Any], stages: list[dict[str, Any]]) -> None:
    """Each example's expected_label is well formed and, where the outputs' labels are literal, one they can give."""
    known = _verdict_labels(stages)
    for i, row in enumerate(raw.get("examples") or []):
        try:
            _, accepted = split_expected(row)
        except ValueError as exc:
            raise TemplateError(f"example {i}: {exc}", template=template) from None
        unknown = sorted(set(accepted or ()) - known) if known is not None else []
        if unknown:
            raise TemplateError(f"example {i}: expected_label {unknown} is no verdict this template can give; "
                                f"its verdicts: {sorted(known)}", template=template)


def build_config(template: str, path: Path, raw: dict[str, Any], chain: list[str]) -> TemplateConfig:
    """Validate stages and routes and generate the edge list; every problem names template and stage."""
    import networkx as nx

    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise TemplateError("'stages' must be a non-empty list", template=template)
    seen: set[str] = set()
    stages = [_check_stage(template, s, i, seen) for i, s in enumerate(stages_raw)]
    ids = [s["id"] for s in stages]
    rules: dict[str, list[Rule]] = {}
    for stage in stages:
        if stage["type"] == "parallel":
            branches = stage["branches"]
            if not isinstance(branches, list) or not branches:
                raise _stage_error(template, stage["id"], "branches must be a non-empty list of stages")
            stage["branches"] = [_check_stage(template, b, i, seen, branch=True) for i, b in enumerate(branches)]
    edges: list[dict[str, str]] = []

    def add(source: str, target: Any, condition: str) -> None:
        if not isinstance(target, str) or target not in ids:
            raise _stage_error(
                template, source, f"{condition} points at {target!r}, which is no stage; stages: {ids}"
            )
        edges.append({"source": source, "target": target, "condition": condition})

    for position, stage in enumerate(stages):
        sid, stype = stage["id"], stage["type"]
        if stype == "output":
            for key in ROUTE_KEYS:
                if key in stage:
                    raise _stage_error(template, sid, f"an output stage ends the run and cannot have {key!r}")
            continue
        if "next" not in stage and stype not in ("router",):
            if stype == "human_review" and "on_approved" in stage:
                pass
            elif stype == "llm_judge" and "on_pass" in stage and "on_fail" in stage:
                pass
            elif position + 1 < len(stages):
                stage["next"] = stages[position + 1]["id"]
            else:
                raise _stage_error(template, sid, "the last stage must be an output stage or name its next stage")
        for key in ROUTE_KEYS:
            if key in stage:
                add(sid, stage[key], key)
        if stype == "router":
            on_result = stage["on_result"]
            if not isinstance(on_result, Mapping) or not on_result:
                raise _stage_error(template, sid, "on_result must map each result label to a stage")
            for label, target in on_result.items():
                add(sid, target, f"on_result:{label}")
            labels = [str(k) for k in on_result]
            if "default" in stage and str(stage["default"]) not in labels:
                raise _stage_error(template, sid, f"default {stage['default']!r} is not one of the on_result labels {labels}")
            if "model" not in stage:
                if "field" not in stage and "conditions" not in stage:
                    raise _stage_error(template, sid, "a rules-based router (no model:) needs 'field' or 'conditions'")
                compiled = []
                for i, cond in enumerate(stage.get("conditions") or []):
                    if not isinstance(cond, Mapping) or "when" not in cond or "result" not in cond:
                        raise _stage_error(template, sid, f"condition #{i} needs 'when' and 'result'")
                    if str(cond["result"]) not in labels:
                        raise _stage_error(template, sid, f"condition #{i} result {cond['result']!r} is not an on_result label {labels}")
                    compiled.append(_compile_rule(template, sid, cond["when"]))
                rules[sid] = compiled
            elif "prompt" not in stage:
                raise _stage_error(template, sid, "an LLM router (model:) needs a 'prompt'")
        if stype == "rules":
            items = stage["rules"]
            if not isinstance(items, list) or not items:
                raise _stage_error(template, sid, "rules must be a non-empty list")
            compiled = []
            for i, rule in enumerate(items):
                if isinstance(rule, str):
                    rule = {"condition": rule}
                    items[i] = rule
                if not isinstance(rule, Mapping) or "condition" not in rule:
                    raise _stage_error(template, sid, f"rule #{i} needs a 'condition'")
                compiled.append(_compile_rule(template, sid, rule["condition"]))
                target = rule.get("goto", stage.get("on_fail"))
                if target is None:
                    raise _stage_error(template, sid, f"rule #{i} ({rule['condition']!r}) needs 'goto' (or the stage an 'on_fail')")
                add(sid, target, f"rule:{rule.get('name', i)}")
                if "inject" in rule and not isinstance(rule["inject"], Mapping):
                    raise _stage_error(template, sid, f"rule #{i}: inject must be a mapping")
            rules[sid] = compiled
        if stype == "human_review" and "on_denied" not in stage:
            raise _stage_error(template, sid, "human_review needs 'on_denied' (a review that times out is denied)")
    entry = raw.get("entry", ids[0])
    if entry not in ids:
        raise TemplateError(f"entry {entry!r} is no stage; stages: {ids}", template=template)
    graph = nx.DiGraph()
    graph.add_nodes_from(ids)
    graph.add_edges_from((e["source"], e["target"]) for e in edges)
    terminals = [s["id"] for s in stages if s["type"] == "output"]
    if not terminals:
        raise TemplateError("has no output stage, so no run can finish", template=template)
    reachable = nx.descendants(graph, entry) | {entry}
    can_finish: set[str] = set(terminals)
    for t in terminals:
        can_finish |= nx.ancestors(graph, t)
    stuck = [s for s in ids if s not in can_finish and s in reachable]
    if stuck:
        cycles = [c for c in nx.simple_cycles(graph.subgraph(stuck))]
        what = f"a cycle with no exit ({' -> '.join(cycles[0] + [cycles[0][0]])})" if cycles else "no path to an output stage"
        raise TemplateError(f"stages {stuck} can never finish: {what}", template=template, stage=stuck[0])
    unreachable = [s for s in ids if s not in reachable]
    if unreachable:
        raise TemplateError(f"stages {unreachable} are unreachable from entry {entry!r}", template=template)
    settings = dict(raw.get("settings") or {})
    max_steps = settings.get("max_steps", 25)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise TemplateError(f"settings.max_steps must be a positive integer, got {max_steps!r}", template=template)
    dest_specs = list(raw.get("destinations") or []) + [d for st in stages if st["type"] == "output" for d in (st.get("destinations") or [])]
    for spec in dest_specs:
        if not isinstance(spec, Mapping) or spec.get("type") not in ("file", "duckdb", "postgres"):
            raise TemplateError(f"destination {spec!r} needs a type of file, duckdb or postgres", template=template)
    redact = raw.get("redact") or {}
    if not isinstance(redact, Mapping) or not isinstance(redact.get("input_fields", []), list):
        raise TemplateError("redact must be a mapping with an 'input_fields' list", template=template)
    _check_examples(template, raw, stages)
    return TemplateConfig(
        id=template, path=path, raw=raw, stages=stages, entry=entry, edges=edges, settings=settings, rules=rules, chain=chain
    )
