"""Jobs beyond ``main_job`` (which ``definitions.py`` builds from the loaded assets)."""
from __future__ import annotations

import dagster as dg

#: The retraining job the six trigger sensors request; selected by key so it loads before every asset exists.
retrain_job = dg.define_asset_job(
    "retrain_job",
    selection=dg.AssetSelection.from_string('key:"trained_adapter" or key:"evaluation_report" or key:"gate_decision" or key:"deployed_adapter"').materializable(),
    description="Closed-loop retrain: trained_adapter -> evaluation_report -> gate_decision -> deployed_adapter on the drained buffer batch.",
    # One process per run: the steps run one after another anyway (all in the `warehouse` pool), and a killed run worker
    # takes its steps with it; the multiprocess executor's step children would outlive it and go on writing the warehouse.
    executor_def=dg.in_process_executor,
)

#: What ``failure_buffer_sensor`` requests when served feedback or DECIDE audit lines arrive.
failure_buffer_job = dg.define_asset_job(
    "failure_buffer_job", selection=dg.AssetSelection.from_string('key:"failure_buffer"').materializable(),
    description="Detect, classify and buffer new failures from served-traffic feedback and the DECIDE audit logs.",
)

JOBS: list = [retrain_job, failure_buffer_job]
