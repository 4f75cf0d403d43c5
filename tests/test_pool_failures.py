"""A sweep survives its workers: a run that kills its worker or never ends is a failed row, the rest are stored.

Issue 29's worker-pool cases: a worker dying under ``--jobs 2`` (a segfault, the
out-of-memory killer's SIGKILL), a run that never ends (``--run-timeout``, with one job or
two), the option's validation, and the progress bar fed each run's cost and position
(its estimate: tests/test_progress.py).
"""

from __future__ import annotations

import importlib
import math
import sqlite3
import sys
import textwrap
import time

import pytest
from pool_workers import FATE, run_by_seed
from test_cli_validation import TINY, refused

import growbench.harness.runner.pool as pool
import growbench.harness.runner.sweep as sweep
from growbench.harness.cli import main as cli_main
from growbench.harness.env import code_version
from growbench.harness.runner.cost import DATASET_COST, sweep_cost
from growbench.harness.runner.pool import pending, run_pending
from growbench.harness.runner.sweep import expand, run_sweep
from growbench.harness.store.results import ResultsDB
from growbench.harness.validate import ConfigError
from growbench.strategies.registry import REGISTRY

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="signals and worker processes as on Linux")

#: Seconds a run may take in these tests: every run that ends takes milliseconds.
TIMEOUT = 2.0


def configs(seeds: list[int]) -> list:
    return expand([dict(strategies=["formula2"], datasets=["teacher"], d_s=[8], d_e=[8], b=[8], d_k=[2], p=[2],
                        seeds=seeds, devices=["cpu"], n_batches=1, repeats=1, warmup_steps=2)])


def stored(db_path) -> dict[int, tuple[str, str | None]]:
    """``seed -> (status, error)`` of every stored run, read directly from the file."""
    with sqlite3.connect(db_path) as con:
        rows = con.execute("SELECT seed, status, error FROM runs").fetchall()
    assert len(rows) == len({r[0] for r in rows}), "one row per run"
    return {seed: (status, error) for seed, status, error in rows}


def test_dead_and_hung_workers_become_failed_rows_and_every_finished_run_is_stored(tmp_path):
    # Seeds 1 and 2 kill their worker (SIGSEGV, SIGKILL), 3 never ends; 0 and 4 finish.
    todo = configs([0, 1, 2, 3, 4])
    db_path = tmp_path / "r.sqlite"
    start = time.monotonic()
    with ResultsDB(db_path) as db:
        run_pending(db, todo, run_by_seed, jobs=2, progress=False, run_timeout=TIMEOUT)
    assert time.monotonic() - start < 60, "the hung run must be stopped at its timeout"
    rows = stored(db_path)
    assert set(rows) == {0, 1, 2, 3, 4}
    assert {s for s, (status, _) in rows.items() if status == "ok"} == {0, 4}
    for seed in (1, 2):
        status, error = rows[seed]
        assert status == "failed" and "died" in error and FATE[seed] in error, error
        assert "Traceback" not in error
    status, error = rows[3]
    assert status == "failed" and f"{TIMEOUT:g} s" in error and "timed out" in error, error
    # The failed rows carry the keys of their configurations: resume skips them, unless failures are retried.
    lost = {c.key(code_version()) for c in todo if c.seed in FATE}
    with ResultsDB(db_path) as db:
        assert db.keys("failed") == lost
        assert not {c.seed for c in pending(todo, db, resume=True, retry_failed=False)[1]} & set(FATE)
        assert {c.seed for c in pending(todo, db, resume=True, retry_failed=True)[1]} >= set(FATE)


def test_run_timeout_stops_a_run_with_one_job_too(tmp_path):
    db_path = tmp_path / "r.sqlite"
    start = time.monotonic()
    with ResultsDB(db_path) as db:
        run_pending(db, configs([3, 0]), run_by_seed, jobs=1, progress=False, run_timeout=TIMEOUT)
    assert time.monotonic() - start < 45
    rows = stored(db_path)
    assert rows[0][0] == "ok"
    assert rows[3][0] == "failed" and "timed out" in rows[3][1]


CRASH_PLUGIN = "growbench_crash_plugin"
CRASH_SPEC = "crash/solve/full/normal:newton"


@pytest.fixture
def crash_plugin(tmp_path, monkeypatch):
    """An averaging component whose direction segfaults its process; the registry restored afterwards."""
    (tmp_path / f"{CRASH_PLUGIN}.py").write_text(textwrap.dedent('''
        import os
        import signal

        from growbench import strategies
        from growbench.strategies.averaging import Gram


        @strategies.register("averaging")
        class Crash(Gram):
            """Gram's direction, after a segfault."""

            name = "crash"

            def direction(self, stats, log, info):
                os.kill(os.getpid(), signal.SIGSEGV)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {axis: dict(table) for axis, table in REGISTRY.items()}
    importlib.import_module(CRASH_PLUGIN)
    yield
    for axis, table in saved.items():
        REGISTRY[axis].clear()
        REGISTRY[axis].update(table)
    sys.modules.pop(CRASH_PLUGIN, None)


def test_cli_records_a_run_that_crashes_its_worker_and_goes_on(crash_plugin, tmp_path, capsys):
    # With --run-timeout the runs go to a worker process even with one job: the crash kills the worker, not the
    # sweep (which it would, were the option not passed through to the pool).
    db_path = tmp_path / "r.sqlite"
    code = cli_main(["run", *TINY, "--strategies", f"formula4,{CRASH_SPEC}", "--jobs", "1", "--run-timeout", "300",
                     "--db", str(db_path), "--no-cache"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    with sqlite3.connect(db_path) as con:
        rows = dict(con.execute("SELECT strategy, status FROM runs").fetchall())
        error = con.execute("SELECT error FROM runs WHERE status = 'failed'").fetchone()[0]
    assert rows == {"gram/solve/full/normal:grid": "ok", CRASH_SPEC: "failed"}
    assert "SIGSEGV" in error and "died" in error


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "ten"])
@pytest.mark.parametrize("command", [["run", *TINY], ["train", "--preset", "smoke", "--no-progress"]])
def test_run_timeout_must_be_a_positive_finite_number(command, value, capsys, tmp_path):
    refused(capsys, tmp_path, [*command, "--run-timeout", value], "--run-timeout")


def test_run_timeout_with_the_dask_backend_is_refused_before_any_work(capsys, tmp_path):
    refused(capsys, tmp_path, ["run", *TINY, "--backend", "dask", "--run-timeout", "5"], "--run-timeout")


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "soon"])
def test_sweep_api_refuses_a_bad_run_timeout_before_any_work(value, tmp_path):
    db_path = tmp_path / "r.sqlite"
    with pytest.raises(ConfigError) as info:
        run_sweep(configs([0]), str(db_path), run_timeout=value, cache_dir=None, progress=False)
    assert info.value.field == "run_timeout"
    assert not db_path.exists()


class RecordingBar(pool.Bar):
    """The progress bar, recording its estimate and every run it was told of."""

    last: RecordingBar | None = None

    def __init__(self, estimate, show=True, what="runs") -> None:
        self.finished: list[tuple[int, bool, str]] = []
        super().__init__(estimate, show, what)
        RecordingBar.last = self

    def finish(self, i, ok, name, seconds=None):
        self.finished.append((i, ok, name))
        assert seconds is not None and seconds >= 0  # measured where the run ran
        return super().finish(i, ok, name, seconds)


def test_the_bar_learns_each_run_at_its_cost_and_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "Bar", RecordingBar)
    # A sweep's default cost (sweep_cost), runs done in this process by a stand-in of the measurement.
    monkeypatch.setattr(sweep, "run_one", lambda config, cache_dir=None, threads=None: run_by_seed(config, threads))
    todo = expand([dict(strategies=["formula2", "formula4"], datasets=["teacher", "text"], d_s=[8], d_e=[8, 16],
                        b=[8], d_k=[2], p=[2], seeds=[0], devices=["cpu"], n_batches=1, repeats=1, warmup_steps=2)])
    run_sweep(todo, str(tmp_path / "r.sqlite"), cache_dir=None, progress=True)
    bar = RecordingBar.last
    ordered = sweep.in_run_order(todo, jobs=1)
    costs = [sweep_cost(c.as_dict()) for c in ordered]
    assert len(set(costs)) > 1, "the test needs runs of different costs"
    assert bar.estimate.costs == pytest.approx(costs)
    assert bar.estimate.classes == [f"{c.dataset} d_e={c.d_e}" for c in ordered]
    # Each site's first run (it trains the site's model) is calibrated apart from the others.
    firsts = [(c.dataset, c.d_e) not in {(o.dataset, o.d_e) for o in ordered[:i]} for i, c in enumerate(ordered)]
    assert [first for _, first in bar.estimate.kinds] == firsts and sum(firsts) == 4
    # One process: runs finish in the order the sweep gives them, each told once, by its position.
    assert [i for i, _, _ in bar.finished] == list(range(len(ordered)))
    for (_, ok, name), config in zip(bar.finished, ordered, strict=True):
        assert ok and config.dataset in name and config.strategy in name
    assert bar.estimate.left() == 0 and bar.estimate.share() == 1
    assert f"{len(ordered)}/{len(ordered)} runs" in bar.text()


def test_the_bar_takes_a_given_cost_and_counts_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "Bar", RecordingBar)
    todo = configs([0, 4, 5])
    with ResultsDB(tmp_path / "r.sqlite") as db:
        run_pending(db, todo, lambda c, threads=None: (run_by_seed(c, threads) if c["seed"] != 5 else
                                                       {**run_by_seed(c, threads), "status": "failed"}),
                    cost=lambda c: c["seed"] + 0.5)
    bar = RecordingBar.last
    assert bar.estimate.costs == pytest.approx([0.5, 4.5, 5.5])
    assert bar.failed == 1 and "1 failed" in bar.text()


def test_sweep_cost_grows_with_the_width_the_batches_and_the_dataset():
    quick = dict(dataset="teacher", n_batches=4, b=64, d_s=32, d_e=32, repeats=3)
    minilm = dict(dataset="minilm-recovery:layer=1:head=3", n_batches=2, b=8, d_s=32, d_e=384, repeats=3)
    assert sweep_cost(quick) == pytest.approx(1.0)
    assert 20 <= sweep_cost(minilm) / sweep_cost(quick) <= 100  # the committed quick sweep: 30-90 times
    assert sweep_cost({**quick, "d_e": 64}) > sweep_cost(quick)
    assert sweep_cost({**quick, "n_batches": 16}) > sweep_cost(quick)
    assert sweep_cost({**quick, "dataset": "no-such-dataset"}) == sweep_cost(quick)
    assert all(cost > 0 for cost in DATASET_COST.values())


def test_workers_key_their_rows_with_the_sweep_s_code_version(tmp_path, monkeypatch):
    # A worker reads the source files later than its sweep: an edit in between (a pull, another terminal) must not
    # give its rows keys the sweep does not know. Here the sweep's version is not the files' at all.
    monkeypatch.setattr(pool, "code_version", lambda: "the-sweep-s")
    todo = configs([0, 4])
    with ResultsDB(tmp_path / "r.sqlite") as db:
        frame = run_pending(db, todo, run_by_seed, jobs=2, progress=False)
    assert sorted(frame.seed) == [0, 4] and set(frame.code_version) == {"the-sweep-s"}
    assert set(frame.key) == {c.key("the-sweep-s") for c in todo}
