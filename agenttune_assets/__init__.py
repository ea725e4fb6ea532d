"""Dagster definitions for AgentTune Platform (assets, checks, sensors, schedules, resources, jobs)."""
