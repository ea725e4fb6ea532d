"""Jobs beyond ``main_job`` (which ``definitions.py`` builds from the loaded assets)."""
from __future__ import annotations

JOBS: list = []
