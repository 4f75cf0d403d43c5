"""Hostile cases of the sweep runner (issue 38): a stuck lock holder, a run that ends its process, a key that moved.

(a) A site lock held by a stuck process: the sweep says what it waits for (the lock file and its
    holder's pid) and goes on without a holder that shows no sign of life; waits run on a simulated
    clock, and once for real through the command line against a stuck process.
(b) A component that calls ``os._exit(3)`` (or ``sys.exit``) under ``--jobs 1``: the run is a failed
    row naming the call, the sweep goes on, the command ends normally and names the run.
(c) A run's key is the same on every machine for the same code and configuration: not the
    checkout's place, the file system's order, line ends, caches, hidden files or the provenance
    that ``recommend --write`` records in ``default.json``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import GROWBENCH, ROOT

import growbench.harness.locks as locks
import growbench.strategies.spec as reg
from growbench.harness.cli import main as cli_main
from growbench.harness.env import config_key, tree_version
from growbench.harness.measure import RunConfig, site_lock_path
from growbench.harness.runner.sweep import expand
from growbench.harness.train import TrainConfig

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock, /proc/locks and os._exit as on Linux")

#: The command line's tiny sweep: one run of formula2 on teacher.
TINY = ["--strategies", "formula2", "--datasets", "teacher", "--d-s", "8", "--d-e", "8", "--b", "4", "--d-k", "2",
        "--p", "2", "--warmup-steps", "2", "--repeats", "1", "--n-batches", "1", "--no-progress"]
TINY_CONFIG = dict(strategies=["formula2"], datasets=["teacher"], d_s=[8], d_e=[8], b=[4], d_k=[2], p=[2], seeds=[0],
                   devices=["cpu"], warmup_steps=2, repeats=1, n_batches=1)


def cli_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), extra.pop("PYTHONPATH", "")])),
            **extra}


# ------------------------------------------------------------------ (a) a stuck lock holder
class Clock:
    """Wall-clock seconds that move only when the waiter sleeps (comparable with files' modification times)."""

    def __init__(self, on_sleep=None) -> None:
        self.now, self.slept, self.on_sleep = time.time(), 0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1
        if self.on_sleep:
            self.on_sleep(self)


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A lock file held by another open of it (flock locks conflict between open files, even in one process)."""
    monkeypatch.setattr(locks, "_PASSED", {})
    path = tmp_path / "site-x.lock"
    holder = open(path, "a")  # noqa: SIM115 - closed below
    fcntl.flock(holder, fcntl.LOCK_EX)
    yield path, holder
    holder.close()


def wait(path: Path, clock: Clock, lines: list[str]) -> bool:
    with open(path, "a+") as handle:
        return locks.wait_for(handle, path, "its holder builds the model", clock=clock, sleep=clock.sleep,
                              say=lines.append)


def test_a_waiter_names_the_lock_and_its_holder_and_passes_a_silent_one(held):
    path, _ = held
    clock, lines = Clock(), []
    os.utime(path, (clock.now - 3600, clock.now - 3600))  # no sign of life for an hour
    assert wait(path, clock, lines) is False
    assert lines[0] == f"growbench: waiting for {path}, held by pid {os.getpid()}: its holder builds the model"
    assert "going on without" in lines[1] and "no sign of life for 36" in lines[1] and str(path) in lines[1]
    assert clock.slept * locks.POLL_S <= locks.GRACE_S + 1  # passed once the grace is over, not after minutes
    # The next run of the site, the holder still stuck, passes at once and says nothing more.
    more: list[str] = []
    assert wait(path, Clock(), more) is False and more == []


def test_a_holder_that_shows_life_is_waited_for_up_to_the_limit_then_passed(held):
    path, _ = held
    clock, lines = Clock(on_sleep=lambda c: os.utime(path, (c.now, c.now))), []  # a heartbeat at every poll
    assert wait(path, clock, lines) is False
    assert clock.now - time.time() >= locks.MAX_WAIT_S - 5  # the simulated wait, not a real one
    assert f"has held it for more than {locks.MAX_WAIT_S:.0f} s" in lines[-1]
    # Alive but hung: the site's next run passes it without waiting again.
    assert wait(path, Clock(), []) is False


@pytest.mark.parametrize("polls", [5, 60])
def test_a_waiter_takes_the_lock_when_the_holder_lets_go_and_names_a_long_wait_once(held, polls):
    path, holder = held

    def release(clock: Clock) -> None:
        os.utime(path, (clock.now, clock.now))
        if clock.slept == polls:
            fcntl.flock(holder, fcntl.LOCK_UN)

    clock, lines = Clock(on_sleep=release), []
    assert wait(path, clock, lines) is True
    assert clock.slept == polls
    if polls * locks.POLL_S < locks.NOTICE_S:
        assert lines == []  # a site's first run, waited for in every sweep with two workers: the lock's work
    else:
        assert lines == [f"growbench: waiting for {path}, held by pid {os.getpid()}: its holder builds the model"]


def test_the_lock_holder_writes_its_pid_and_leaves_none_behind(tmp_path):
    path = tmp_path / "site-y.lock"
    with locks.work_lock(path, "work") as held:
        assert held and path.read_text().split()[0] == str(os.getpid())
        assert locks.holder_pid(path) == os.getpid()
    assert path.read_text() == ""


def test_a_lock_that_cannot_be_opened_lets_the_work_go_on(tmp_path):
    with locks.work_lock(tmp_path / "missing-folder" / "x.lock", "work") as held:
        assert held is False


def test_a_sweep_passes_a_stuck_holder_of_its_site_lock_and_says_so(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    lock = site_lock_path(expand([TINY_CONFIG])[0], str(cache))
    stuck = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import fcntl, sys, time
        handle = open(sys.argv[1], "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
    """), str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout.readline().strip() == "held"
        os.utime(lock, (time.time() - 3600, time.time() - 3600))  # stuck for an hour: no sign of life since
        db = tmp_path / "r.sqlite"
        done = subprocess.run([*GROWBENCH, "run", *TINY, "--db", str(db), "--cache-dir", str(cache)], cwd=ROOT,
                              env=cli_env(), capture_output=True, text=True, timeout=300)
    finally:
        stuck.kill()
        stuck.wait()
    assert done.returncode == 0, done.stderr
    assert f"waiting for {lock}, held by pid {stuck.pid}" in done.stderr
    assert f"going on without {lock}" in done.stderr and "Traceback" not in done.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("ok",)]


# ------------------------------------------------------------------ (b) a run that ends its process
EXIT_PLUGIN = '''
import os
import sys

from growbench import strategies
from growbench.strategies.averaging import Gram


@strategies.register("averaging")
class Quits(Gram):
    """Gram's direction, after ending the process the way the environment variable says."""

    name = "quits"

    def direction(self, stats, log, info):
        if os.environ.get("QUIT_WITH") == "sys.exit":
            sys.exit(4)
        os._exit(3)
'''
QUIT_SPEC = "quits/solve/full/normal:newton"


@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_a_run_that_ends_its_process_under_one_job_is_a_failed_row_and_the_sweep_goes_on(how, tmp_path):
    (tmp_path / "quitting_plugin.py").write_text(EXIT_PLUGIN)
    db = tmp_path / "r.sqlite"
    done = subprocess.run([*GROWBENCH, "run", *TINY, "--strategies", f"{QUIT_SPEC},formula4", "--seeds", "0,1",
                           "--jobs", "1", "--db", str(db), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          env=cli_env(PYTHONPATH=str(tmp_path), GROWBENCH_PLUGINS="quitting_plugin", QUIT_WITH=how),
                          timeout=300)
    call = "os._exit(3)" if how == "os._exit" else "sys.exit(4)"
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT strategy, seed, status, error FROM runs").fetchall()
    assert sorted((s, seed, status) for s, seed, status, _ in rows) == [
        ("gram/solve/full/normal:grid", 0, "ok"), ("gram/solve/full/normal:grid", 1, "ok"),
        (QUIT_SPEC, 0, "failed"), (QUIT_SPEC, 1, "failed")]
    assert all(call in error for s, _, _, error in rows if s == QUIT_SPEC)
    # The command names the run and what it did, in one line.
    named = [ln for ln in done.stderr.splitlines() if "failed runs recorded" in ln]
    assert len(named) == 1 and QUIT_SPEC in named[0] and call in named[0], done.stderr
    assert "Traceback" not in done.stderr


def test_an_exit_in_a_run_leaves_this_process_s_exit_as_it_was(tmp_path, monkeypatch):
    # In this process (--jobs 1), os._exit is contained only while a run runs: afterwards it is the real one again.
    real = os._exit
    (tmp_path / "quitting_plugin_here.py").write_text(EXIT_PLUGIN.replace('name = "quits"', 'name = "quits-here"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    from growbench.strategies.registry import REGISTRY

    saved = {axis: dict(table) for axis, table in REGISTRY.items()}
    try:
        importlib.import_module("quitting_plugin_here")
        code = cli_main(["run", *TINY, "--strategies", "quits-here/solve/full/normal:newton", "--jobs", "1",
                         "--db", str(tmp_path / "r.sqlite"), "--no-cache"])
    finally:
        for axis, table in saved.items():
            REGISTRY[axis].clear()
            REGISTRY[axis].update(table)
        sys.modules.pop("quitting_plugin_here", None)
    assert code == 0 and os._exit is real


# ------------------------------------------------------------------ (c) the same key on every machine
def copy_source(to: Path) -> Path:
    for pkg in ("strategies", "harness", "datasets", "models"):
        shutil.copytree(ROOT / pkg, to / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_the_code_version_depends_on_the_code_only(tmp_path):
    a = copy_source(tmp_path / "one" / "checkout")
    b = copy_source(tmp_path / "elsewhere" / "deeper" / "clone")
    assert tree_version(a) == tree_version(b)  # the place of the checkout
    # What one machine has and another not: caches, an editor's and a notebook's files, Windows line ends, and the
    # provenance and evidence of a default.json that `growbench recommend --write` rewrote there.
    (b / "harness" / "__pycache__").mkdir(exist_ok=True)
    (b / "harness" / "__pycache__" / "stray.py").write_text("x = 1\n")
    (b / "strategies" / ".ipynb_checkpoints").mkdir()
    (b / "strategies" / ".ipynb_checkpoints" / "growth-checkpoint.py").write_text("y = 2\n")
    (b / "datasets" / ".#base.py").write_text("lock\n")
    env_py = b / "harness" / "env.py"
    env_py.write_bytes(env_py.read_bytes().replace(b"\n", b"\r\n"))
    default = json.loads((b / "strategies" / "default.json").read_text())
    default.update(db="/tmp/someone-elses/results.sqlite", generated="2031-01-01T00:00:00+00:00")
    (b / "strategies" / "default.json").write_text(json.dumps(default, indent=1))
    assert tree_version(b) == tree_version(a)
    # The code itself: an edit, or a new module.
    (b / "models" / "extra.py").write_text("z = 3\n")
    assert tree_version(b) != tree_version(a)
    (b / "models" / "extra.py").unlink()
    (b / "strategies" / "growth.py").write_text((b / "strategies" / "growth.py").read_text() + "\n# edited\n")
    assert tree_version(b) != tree_version(a)


def test_a_key_is_the_same_from_another_folder_and_home(tmp_path):
    script = ("from growbench.harness.env import code_version\nfrom growbench.harness.measure import RunConfig\n"
              "print(RunConfig('gram/solve/full/normal:grid', 'teacher', 8, 8, 4, 2, 2, seed=3).key(code_version()))")
    keys = []
    for where in (ROOT, tmp_path):  # two fresh processes: this one's version was read when it started
        done = subprocess.run([sys.executable, "-c", script], cwd=where, capture_output=True, text=True, timeout=120,
                              env=cli_env(HOME=str(where), TMPDIR=str(tmp_path)))
        assert done.returncode == 0, done.stderr
        keys.append(done.stdout.strip())
    assert keys[0] == keys[1] and len(keys[0]) == 24


def test_the_committed_runs_keys_are_recomputed_from_their_rows():
    # A fresh export joins the committed one on key when the code is the same: each key is its row's configuration
    # and code version, nothing of the machine that ran it.
    runs = pd.read_csv(ROOT / "reports" / "runs.csv")
    names = [f for f in RunConfig.__dataclass_fields__]
    for row in runs.to_dict("records"):
        config = {n: (row[n].item() if hasattr(row[n], "item") else row[n]) for n in names}
        assert config_key(RunConfig(**config).as_dict(), row["code_version"]) == row["key"], row["key"]


def test_a_default_run_s_key_holds_what_it_takes_from_default_json_not_its_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(reg, "_WARNED", set())
    shipped = json.loads((ROOT / "strategies" / "default.json").read_text())
    cfg = TrainConfig(method="default", dataset="teacher", d_s=8, d_e=8, b=8, d_k0=2, d_k_max=4, p=2, grow_every=5,
                      steps=10)
    other = TrainConfig(method="fixed-small", dataset="teacher", d_s=8, d_e=8, b=8, d_k0=2, d_k_max=4, p=2,
                        grow_every=5, steps=10)

    def keys_with(content: dict) -> tuple[str, str]:
        path = tmp_path / f"default-{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(content))
        monkeypatch.setattr(reg, "DEFAULT_FILE", str(path))
        return cfg.key("v"), other.key("v")

    first = keys_with(shipped)
    moved = json.loads(json.dumps(shipped))
    moved.update(db="/elsewhere/r.sqlite", generated="2031-01-01T00:00:00+00:00")
    for entry in moved["regimes"].values():
        entry.update(db="/elsewhere/r.sqlite", generated="2031-01-01T00:00:00+00:00", evidence={})
    assert keys_with(moved) == first
    chosen = json.loads(json.dumps(shipped))
    chosen["regimes"]["cpu/small"]["spec"] = "gram/solve/full+metric/normal:bracket"
    changed = keys_with(chosen)
    assert changed[0] != first[0]  # the default's choice: what the run runs
    assert changed[1] == first[1]  # a run that never reads the file keeps its key
