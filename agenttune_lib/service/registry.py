"""Which weights a request's ``model`` names: the deployed alias (``DEPLOYED.json`` read on every request), a named
adapter (the warehouse's ``adapters`` table or a release under the deploy root), or the bare base."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from agenttune_lib.models.serving import ServedModel, base_adapter_id, resolve_served_model
from agenttune_lib.service.errors import APIError

__all__ = ["ModelRegistry", "DEPLOYED_ALIAS"]

#: The model name that always means "what DEPLOYED.json names now".
DEPLOYED_ALIAS = "deployed"


@dataclasses.dataclass
class ModelRegistry:
    """Resolves model names per request; nothing is cached but the loaded weights (``ServedModel.load``)."""

    base_path: Path
    deploy_root: Path
    warehouse: Any = None

    @property
    def base_id(self) -> str:
        return base_adapter_id(self.base_path)

    def deployed(self) -> ServedModel:
        """The pointer, read now: a deploy or a rollback is seen by the very next request."""
        return resolve_served_model(self.deploy_root, self.base_path)

    def named_adapters(self) -> dict[str, Path]:
        """adapter id -> directory, for every adapter that has a PEFT directory on disk."""
        found: dict[str, Path] = {}
        releases = self.deploy_root / "releases"
        if releases.exists():
            for d in sorted(releases.iterdir()):
                if not d.name.startswith(".") and (d / "adapter_config.json").exists():
                    found[d.name] = d
        if self.warehouse is not None and self.warehouse.has_table("adapters"):
            for adapter_id, path in self.warehouse.execute("SELECT adapter_id, path FROM adapters ORDER BY created_at"):
                if path and (Path(path) / "adapter_config.json").exists():
                    found.setdefault(str(adapter_id), Path(path))
        return found

    def resolve(self, name: str) -> ServedModel:
        """The ServedModel for ``name``; an unknown name is a 404 naming the models that exist."""
        if name in (DEPLOYED_ALIAS, ""):
            try:
                return self.deployed()
            except (ValueError, FileNotFoundError) as exc:
                raise APIError(503, f"the deployment pointer cannot be served: {exc}", "deployment_unavailable", type="server_error") from None
        if name in (self.base_id, self.base_path.name):
            return ServedModel(self.base_path, None, None)
        current = self._current_or_none()
        if current is not None and current.adapter_id == name:
            return current
        adapters = self.named_adapters()
        if name in adapters:
            return ServedModel(self.base_path, name, adapters[name])
        known = [DEPLOYED_ALIAS, self.base_id, *adapters]
        raise APIError(404, f"model {name!r} does not exist; served models: {known}", "model_not_found", param="model")

    def _current_or_none(self) -> ServedModel | None:
        try:
            served = self.deployed()
        except (ValueError, FileNotFoundError):
            return None
        return served if served.adapter_id else None

    def list_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models`` entries: the deployed alias (naming what it serves now), the base, each named adapter."""
        now = int(time.time())
        current = self._current_or_none()
        out = [{"id": DEPLOYED_ALIAS, "object": "model", "created": now, "owned_by": "agenttune",
                "served_adapter_id": current.served_adapter_id if current else self.base_id,
                "decision_id": current.decision_id if current else None},
               {"id": self.base_id, "object": "model", "created": now, "owned_by": "agenttune", "served_adapter_id": self.base_id}]
        adapters = self.named_adapters()
        if current is not None:
            adapters.setdefault(current.adapter_id, current.adapter_path)
        for adapter_id in adapters:
            out.append({"id": adapter_id, "object": "model", "created": now, "owned_by": "agenttune", "served_adapter_id": adapter_id,
                        "deployed": bool(current and current.adapter_id == adapter_id)})
        return out
