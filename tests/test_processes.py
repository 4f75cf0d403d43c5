"""No worker outlives its parent: a SIGKILLed sweep leaves no worker process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
from helpers import GROWBENCH

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL and re-parenting as on Linux")


def stored_rows(db) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_workers_exit_when_the_sweep_is_killed(tmp_path):
    args = [*GROWBENCH, "run", "--strategies", "formula1,formula2,formula3,formula4",
            "--datasets", "teacher", "--d-s", "16,32", "--d-e", "16,24,32", "--b", "64", "--d-k", "2", "--p", "2",
            "--seeds", "0,1,2,3", "--warmup-steps", "20", "--repeats", "3", "--jobs", "2",
            "--db", str(tmp_path / "r.sqlite"), "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    parent = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=os.path.dirname(os.path.dirname(__file__)))
    workers = []
    try:
        # Kill once both workers have finished runs (the stored rows say so): mid-sweep, as a user would.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and stored_rows(tmp_path / "r.sqlite") < 4:
            time.sleep(0.2)
        workers = psutil.Process(parent.pid).children(recursive=True)
        # The workers are forked by a server process (harness.runner.pool.worker_context): its children.
        assert sum(p.ppid() != parent.pid for p in workers) == 2, "expected two worker processes"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, f"workers outlived their parent: {[p.pid for p in alive]}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in workers:  # the sweep's processes only: this process's own helpers are not ours to kill
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
