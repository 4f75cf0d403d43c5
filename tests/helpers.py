"""Helpers shared by test modules (imported as ``helpers``: pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The command line of ``growbench`` in this interpreter, whatever its PATH.
GROWBENCH = (sys.executable, "-m", "growbench.harness.cli")


def kill_cli_after_rows(args: list[str], db: Path, table: str, n: int, timeout: float = 180.0) -> int:
    """Run ``growbench *args``, SIGKILL it once ``table`` of ``db`` has ``n`` rows; return the count seen.

    The count is read just before the kill, so more rows may have landed in between.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*GROWBENCH, *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = 0
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if db.exists():
            with sqlite3.connect(db) as c:
                try:
                    seen = c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                except sqlite3.OperationalError:  # the table is not created yet
                    seen = 0
            if seen >= n:
                break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return seen
