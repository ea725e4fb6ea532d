"""A two-step Dagster job whose second step's process is killed by SIGKILL (as the out-of-memory killer does)."""
import os
import signal

import dagster as dg


@dg.op
def fine() -> int:
    return 1


@dg.op
def killed(value: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return value


@dg.op
def broken(value: int) -> int:
    raise RuntimeError(f"bad input {value}: the step's own error")


@dg.job(executor_def=dg.multiprocess_executor)
def killed_job():
    killed(fine())
    broken(fine())
