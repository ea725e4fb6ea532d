"""Dagster definitions split by kind, as in the Dagster example projects."""
