"""Jobs: the main job materializes the whole asset graph on the embedded default."""
from __future__ import annotations

import dagster as dg

main_job = dg.define_asset_job(
    "main_job",
    selection=dg.AssetSelection.all(),
    description="Materialize the whole AgentTune asset graph: corpus to deployed adapter.",
)

JOBS = [main_job]
