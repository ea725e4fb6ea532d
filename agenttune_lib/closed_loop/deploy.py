"""Atomic adapter deployment: immutable releases, a backup of what served, one-step pointer switch, rollback.

Layout under ``root``: ``releases/<adapter_id>/`` (copied in under a temporary name, then
renamed), ``backups/<adapter_id>/`` (the previous release, copied before the switch) and
``DEPLOYED.json`` (the pointer, replaced with ``os.replace``). A crash before the switch
leaves the previous pointer, hence the previous adapter, serving.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.gate import GateDecision

__all__ = ["AdapterDeployer", "Deployment", "GateRefused", "DeployError", "DEPLOY_STEPS", "DEPLOYMENTS_DDL"]

#: The points of ``apply_decision`` where a fault can be injected, in order.
DEPLOY_STEPS = ("copy_release", "release_renamed", "backup_previous", "pointer_written", "switched", "recorded")

DEPLOYMENTS_DDL = """CREATE TABLE IF NOT EXISTS deployments (
    deployment_id VARCHAR PRIMARY KEY, adapter_id VARCHAR, previous_adapter_id VARCHAR, decision_id VARCHAR,
    action VARCHAR, path VARCHAR, run_id VARCHAR, created_at TIMESTAMPTZ)"""


class DeployError(RuntimeError):
    """A deployment that cannot proceed; nothing serving was changed."""


class GateRefused(DeployError):
    """The gate decision did not approve the candidate."""


@dataclasses.dataclass(frozen=True)
class Deployment:
    """What the pointer says: the serving adapter, its predecessor, and the decision that put it there."""

    adapter_id: str
    path: str
    previous: str | None
    previous_path: str | None
    decision_id: str | None
    action: str
    deployed_at: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AdapterDeployer:
    """Deploys approved adapters under ``root``; ``fault(step)`` is called at each step (tests inject crashes)."""

    POINTER = "DEPLOYED.json"

    def __init__(self, root: str | Path, warehouse: Any = None, fault: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        self.warehouse = warehouse
        self.fault = fault

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    @property
    def backups(self) -> Path:
        return self.root / "backups"

    def _step(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)

    def current(self) -> Deployment | None:
        """The serving adapter, from the pointer; None before the first deployment."""
        pointer = self.root / self.POINTER
        if not pointer.exists():
            return None
        return Deployment(**json.loads(pointer.read_text(encoding="utf-8")))

    def _switch(self, deployment: Deployment) -> None:
        pointer = self.root / self.POINTER
        tmp = self.root / f".{self.POINTER}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(deployment.to_dict(), fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            self._step("pointer_written")
            os.replace(tmp, pointer)
        finally:
            if tmp.exists():
                tmp.unlink()
        _fsync_dir(self.root)

    def _record(self, deployment: Deployment, run_id: str | None) -> None:
        if self.warehouse is None:
            return
        with self.warehouse.connect() as con:
            self.warehouse.create_tables(con, DEPLOYMENTS_DDL)
            con.execute(
                "INSERT INTO deployments VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [uuid.uuid4().hex, deployment.adapter_id, deployment.previous, deployment.decision_id,
                 deployment.action, deployment.path, run_id, dt.datetime.fromisoformat(deployment.deployed_at)],
            ).fetchall()

    def apply_decision(self, decision: GateDecision, adapter_path: str | Path, adapter_id: str | None = None, run_id: str | None = None) -> Deployment:
        """Deploy the decision's candidate from ``adapter_path``; refuses anything the gate did not approve."""
        if not decision.approved:
            raise GateRefused(f"gate decision {decision.decision_id} refused {decision.candidate!r}: {'; '.join(decision.reasons)}")
        src = Path(adapter_path)
        if not (src / "adapter_config.json").exists():
            raise DeployError(f"{src} is not a PEFT adapter directory (no adapter_config.json)")
        adapter_id = adapter_id or decision.candidate or src.name
        prev = self.current()
        if prev is not None and prev.adapter_id == adapter_id:
            raise DeployError(f"adapter {adapter_id!r} is already serving")
        self.releases.mkdir(parents=True, exist_ok=True)
        self.backups.mkdir(parents=True, exist_ok=True)
        release = self.releases / adapter_id
        if not release.exists():
            staging = self.releases / f".{adapter_id}.{uuid.uuid4().hex}.staging"
            try:
                shutil.copytree(src, staging)
                self._step("copy_release")
                os.rename(staging, release)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
            _fsync_dir(self.releases)
        self._step("release_renamed")
        if prev is not None:
            backup = self.backups / prev.adapter_id
            if not backup.exists() and Path(prev.path).exists():
                staging = self.backups / f".{prev.adapter_id}.{uuid.uuid4().hex}.staging"
                try:
                    shutil.copytree(prev.path, staging)
                    os.rename(staging, backup)
                finally:
                    if staging.exists():
                        shutil.rmtree(staging, ignore_errors=True)
        self._step("backup_previous")
        deployment = Deployment(
            adapter_id=adapter_id, path=str(release), previous=prev.adapter_id if prev else None,
            previous_path=prev.path if prev else None, decision_id=decision.decision_id, action="deploy",
            deployed_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        )
        self._switch(deployment)
        self._step("switched")
        self._log(deployment)
        self._record(deployment, run_id)
        self._step("recorded")
        return deployment

    def rollback(self, run_id: str | None = None) -> Deployment:
        """Point back at the predecessor (from its release, else its backup) in one step."""
        cur = self.current()
        if cur is None or cur.previous is None:
            raise DeployError(f"nothing to roll back to under {self.root}: {'no deployment' if cur is None else 'no predecessor'}")
        path = Path(cur.previous_path or "")
        if not (path / "adapter_config.json").exists():
            path = self.backups / cur.previous
        if not (path / "adapter_config.json").exists():
            raise DeployError(f"predecessor {cur.previous!r} has neither a release nor a backup under {self.root}")
        history = [d for d in self.history() if d.get("adapter_id") == cur.previous and d.get("action") == "deploy"]
        before = history[-1] if history else {}
        deployment = Deployment(
            adapter_id=cur.previous, path=str(path), previous=before.get("previous"), previous_path=before.get("previous_path"),
            decision_id=before.get("decision_id"), action="rollback", deployed_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        )
        self._switch(deployment)
        self._record(deployment, run_id)
        self._log(deployment)
        return deployment

    def _log(self, deployment: Deployment) -> None:
        with open(self.root / "history.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(deployment.to_dict(), sort_keys=True) + "\n")

    def history(self) -> list[dict[str, Any]]:
        """Every deployment and rollback, oldest first."""
        path = self.root / "history.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def load(self, base_model: Any) -> Any:
        """The serving adapter on ``base_model`` as a PeftModel."""
        from peft import PeftModel

        cur = self.current()
        if cur is None:
            raise DeployError(f"no adapter deployed under {self.root}")
        return PeftModel.from_pretrained(base_model, cur.path)
