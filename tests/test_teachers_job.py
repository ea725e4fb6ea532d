"""The teacher job's settings: the Dagster config maps onto them field for field, and bad names are refused."""
from __future__ import annotations

import dataclasses

import pytest

from agenttune_assets.defs.assets.collect import TeacherTrajectoriesConfig
from agenttune_lib.teachers.job import TeacherJob


def test_the_asset_config_and_the_job_have_the_same_fields_and_defaults():
    job_fields = {f.name: f.default for f in dataclasses.fields(TeacherJob)}
    config = TeacherTrajectoriesConfig()
    assert set(TeacherTrajectoriesConfig.model_fields) == set(job_fields)
    assert TeacherJob.from_config(config) == TeacherJob()
    assert {name: getattr(config, name) for name in job_fields} == {**job_fields, "tau2_task_ids": []}


def test_from_config_carries_every_value_and_the_expert_replays_without_sampling():
    job = TeacherJob.from_config(TeacherTrajectoriesConfig(teacher="model", task_source="qa", tau2_task_ids=["t1", "t2"], n_qa=3,
                                                           strategy="plan", few_shot=True, rejection_attempts=5, max_tool_chars=0))
    assert (job.teacher, job.task_source, job.tau2_task_ids, job.n_qa) == ("model", "qa", ("t1", "t2"), 3)
    model = job.teacher_config()
    assert (model.strategy, model.few_shot, model.rejection_attempts, model.max_tool_chars, model.keep_rejected) == ("plan", True, 5, None, True)
    expert = dataclasses.replace(job, teacher="expert").teacher_config()
    assert (expert.strategy, expert.few_shot, expert.rejection_attempts) == ("react", False, 0)
    assert dataclasses.replace(job, teacher="endpoint").teacher_config().rejection_attempts == 0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("teacher", "oracle", r"teacher must be one of \('expert', 'model', 'endpoint'\), got 'oracle'"),
    ("task_source", "web", r"task_source must be 'tau2', 'qa' or 'both', got 'web'"),
])
def test_a_bad_teacher_or_task_source_is_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TeacherJob(**{field: value})
