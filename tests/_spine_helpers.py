"""Scripted models for spine tests (test-only fakes of the injected model callable)."""
from __future__ import annotations

import json
from collections.abc import Callable


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


class Scripted:
    """Returns the scripted replies in order (the last one repeats); records every input it saw."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list = []

    def __call__(self, messages):
        self.seen.append(messages)
        index = min(len(self.seen) - 1, len(self.replies) - 1)
        return self.replies[index]


class ByRule:
    """Picks a reply from the conversation with a rule (messages -> text)."""

    def __init__(self, rule: Callable[[list], str]) -> None:
        self.rule = rule
        self.seen: list = []

    def __call__(self, messages):
        self.seen.append(messages)
        return self.rule(messages)


def shared_base_model_dir():
    """Where slow tests keep the converted SmolLM2 checkpoint, so it is converted once per machine, not per test."""
    import os
    import tempfile
    from pathlib import Path

    return Path(os.environ.get("AGENTTUNE_TEST_MODELS", Path(tempfile.gettempdir()) / "agenttune-test-models"))


# -- tools for isolation tests (module level, so a spawned worker can import them) --------

def double(x: int) -> int:
    """Double a number (in whatever process runs it)."""
    import os

    return x * 2 + 0 * os.getpid()


def whoami() -> int:
    """The process id running this tool."""
    import os

    return os.getpid()


def crash(code: int = 3) -> int:
    """Kill the process running it."""
    import os

    os._exit(code)


def hang(seconds: float = 60.0) -> str:
    """Sleep far longer than any timeout."""
    import time

    time.sleep(seconds)
    return "woke"


# The arithmetic tools and task the strategy and record tests share.
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TASK = {"prompt": "What is (2 + 3) * 4?", "answer": "20"}
