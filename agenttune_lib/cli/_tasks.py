"""Task prompts for the training commands: a JSONL file, or the teacher trajectories in the warehouse."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from agenttune_lib.events import EventLog
from agenttune_lib.warehouse import Warehouse


def load_task_logs(tasks: Path | None, warehouse: Warehouse) -> list[EventLog]:
    """``tasks`` lines ``{"task": …, "answer"?: …}`` as empty logs, else the stored full-tier teacher trajectories."""
    if tasks is not None:
        logs = []
        for n, line in enumerate(tasks.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                logs.append(EventLog(metadata={"task": str(row["task"]), **({"answer": row["answer"]} if "answer" in row else {})}))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise typer.BadParameter(f"{tasks}:{n}: each line must be a JSON object with a 'task' ({exc})") from exc
        return logs
    logs = warehouse.read_logs(where="t.tier = 'full' AND t.asset_key = ?", params=["teacher_trajectories"]) if warehouse.has_table("trajectories") else []
    if not logs:
        raise typer.BadParameter("no teacher trajectories in the warehouse; pass --tasks or materialize teacher_trajectories")
    return logs
