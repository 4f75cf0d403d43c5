"""Run functions for tests/test_pool_failures.py, in a module of their own: worker processes import them by name.

Each run's fate is chosen by its seed (:data:`FATE`); any other seed returns an ``ok`` row at once.
"""

from __future__ import annotations

import os
import signal
import time

from growbench.harness.env import recorded
from growbench.harness.measure import RunConfig

#: What the run of a seed does instead of returning: die by a signal (a segfault, the out-of-memory killer)
#: or never end.
FATE = {1: "SIGSEGV", 2: "SIGKILL", 3: "hang"}


def run_by_seed(config: dict, threads: int | None = None) -> dict:
    """The run's row, or its worker's death or hang as :data:`FATE` says for its seed."""
    fate = FATE.get(config["seed"])
    if fate == "hang":
        time.sleep(3600)
    elif fate:
        os.kill(os.getpid(), getattr(signal, fate))
    return recorded(RunConfig(**config), lambda: {"optimality": 1.0}, threads)
