"""The code location the real-daemon test (test_dead_run_daemon.py) serves: the product's retrain assets, its T5 sensor
logic and its retrain_job (executor, selection), sized for the tiny model; paths come from the environment the test sets."""
from __future__ import annotations

import os

import dagster as dg

from agenttune_assets.defs.assets.deploy import deployed_adapter, gate_decision
from agenttune_assets.defs.assets.evaluate import evaluation_report
from agenttune_assets.defs.assets.train import trained_adapter
from agenttune_assets.defs.jobs import retrain_job as product_retrain_job
from agenttune_assets.defs.resources import (
    ArtifactsResource, ClosedLoopResource, DecideModelResource, ModelsResource, RayResource, ServingResource, WarehouseResource,
)
from agenttune_assets.defs.sensors import RETRAIN_JOB, evaluate_trigger_sensor

HOME = os.environ["AGENTTUNE_HOME"]
BASE = os.environ["AGENTTUNE_TEST_BASE"]
AUDIT = os.environ["AGENTTUNE_TEST_AUDIT"]
RUN_CONFIG = {"ops": {
    "trained_adapter": {"config": {"batch_size": 6, "retrain": {"algorithm": "dpo", "max_steps": 20, "learning_rate": 0.01, "max_length": 512}}},
    "evaluation_report": {"config": {"qa_limit": 0, "tau2_n_tasks": 1, "max_new_tokens": 8}},
}}

retrain_job = dg.define_asset_job(
    RETRAIN_JOB, selection=product_retrain_job.selection, executor_def=product_retrain_job.executor_def, config=RUN_CONFIG,
)


# The product's T5 sensor body; ticks every 2 s here instead of 60 s so the test stays short.
@dg.sensor(name="retrain_t5_sensor", job_name=RETRAIN_JOB, minimum_interval_seconds=2, default_status=dg.DefaultSensorStatus.RUNNING)
def retrain_t5_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource):
    return evaluate_trigger_sensor("T5", context.instance, context.cursor, warehouse, closed_loop)


defs = dg.Definitions(
    assets=[trained_adapter, evaluation_report, gate_decision, deployed_adapter],
    jobs=[retrain_job],
    sensors=[retrain_t5_sensor],
    resources={
        "warehouse": WarehouseResource(path=os.path.join(HOME, "warehouse.duckdb")),
        "models": ModelsResource(path=os.path.join(HOME, "models")),
        "artifacts": ArtifactsResource(path=os.path.join(HOME, "artifacts")),
        "ray": RayResource(enabled=False),
        "decide_model": DecideModelResource(max_new_tokens=64),
        "serving": ServingResource(deploy_root=os.path.join(HOME, "models", "deployed"), base_checkpoint=BASE),
        # The gate's replay, target, provenance and trajectory arms as shipped; no guard suites: guards need >= 10 held-out
        # DECIDE items or 20 paired suite items, more than this traffic (2 held-out runs) and evaluation (one τ² task) give.
        "closed_loop": ClosedLoopResource(audit_paths=[AUDIT], gate_holdout_size=2, gate_require_trajectory_arm=False, gate_guards=[]),
    },
)
