"""``--threads``: the torch thread count a run has, recorded in its row, one per worker by default."""

from __future__ import annotations

import sqlite3

import pytest
import torch

import growbench.harness.measure as measure_module
import growbench.harness.runner.train_sweep as train_sweep_module
from growbench.harness.cli import main as cli_main
from growbench.harness.env import DEFAULT_THREADS, recorded, torch_threads
from growbench.harness.runner.sweep import expand, run_sweep
from growbench.harness.train import TrainConfig

TINY = ["--strategies", "formula2", "--datasets", "teacher", "--d-s", "8", "--d-e", "8", "--b", "4", "--d-k", "2",
        "--p", "2", "--warmup-steps", "2", "--repeats", "1", "--n-batches", "1", "--no-progress"]


@pytest.fixture
def seen_in_measure(monkeypatch) -> list[int]:
    """The thread count each run's measurement saw, from inside the work (in-process runs only)."""
    seen: list[int] = []
    real = measure_module.measure

    def measure(cfg, cache_dir):
        seen.append(torch.get_num_threads())
        return real(cfg, cache_dir)

    monkeypatch.setattr(measure_module, "measure", measure)
    return seen


@pytest.fixture
def process_threads():
    """Run the test with the process at 2 threads, so that a run's own count is told apart from it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def rows(db) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT seed, threads, status FROM runs ORDER BY seed").fetchall()


def test_default_is_one_thread():
    assert DEFAULT_THREADS == 1


def test_run_threads_option_sets_the_count_in_the_run_and_the_row(tmp_path, seen_in_measure, process_threads,
                                                                   capsys):
    db = tmp_path / "r.sqlite"
    base = ["run", *TINY, "--db", str(db), "--cache-dir", str(tmp_path / "c")]
    assert cli_main([*base, "--seeds", "0"]) == 0  # default: one thread, whatever the process had
    assert cli_main([*base, "--seeds", "1", "--threads", "3"]) == 0
    capsys.readouterr()
    assert seen_in_measure == [1, 3]
    assert rows(db) == [(0, 1, "ok"), (1, 3, "ok")]
    assert torch.get_num_threads() == process_threads  # the caller's own setting is restored


def test_train_rows_record_the_threads_the_run_had(tmp_path, monkeypatch, process_threads):
    seen: list[int] = []
    real = train_sweep_module.train_run

    def train_run(cfg):
        seen.append(torch.get_num_threads())
        return real(cfg)

    monkeypatch.setattr(train_sweep_module, "train_run", train_run)
    tiny = dict(dataset="teacher", d_s=8, d_e=8, b=8, d_k0=2, d_k_max=2, p=2, grow_every=10, steps=10, eval_every=10)
    db = tmp_path / "t.sqlite"
    runs = train_sweep_module.run_train_sweep([TrainConfig(method="fixed-small", **tiny)], str(db), progress=False,
                                              threads=3)
    assert seen == [3] and list(runs.threads) == [3] and list(runs.status) == ["ok"]
    runs = train_sweep_module.run_train_sweep([TrainConfig(method="fixed-small", seed=1, **tiny)], str(db),
                                              progress=False)
    assert seen == [3, 1] and list(runs.threads) == [1]
    assert torch.get_num_threads() == process_threads


def test_each_worker_gets_one_thread_with_jobs(tmp_path):
    """With ``jobs > 1`` every worker process runs one thread (not a share of the cores, as before)."""
    grid = dict(strategies=["formula2"], datasets=["teacher"], d_s=[8], d_e=[8], b=[4], d_k=[2], p=[2],
                seeds=[0, 1], devices=["cpu"], n_batches=1, repeats=1, warmup_steps=2)
    frame = run_sweep(expand([grid]), str(tmp_path / "r.sqlite"), jobs=2, cache_dir=str(tmp_path / "c"),
                      progress=False)
    assert list(frame.threads) == [1, 1] and set(frame.status) == {"ok"}


def test_recorded_restores_the_count_even_when_the_run_fails(process_threads):
    from growbench.harness.measure import RunConfig

    def boom():
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")

    row = recorded(RunConfig("formula2", "teacher", 8, 8, 4, 2, 2), boom, threads=1)
    assert row["status"] == "failed" and row["threads"] == 1
    assert torch.get_num_threads() == process_threads


def test_torch_threads_none_keeps_the_count(process_threads):
    with torch_threads(None):
        assert torch.get_num_threads() == process_threads
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == process_threads


def test_example_and_targets_accept_threads():
    from growbench.harness.cli import build_parser

    parser = build_parser()
    for command in ("run", "train", "targets", "example"):
        assert parser.parse_args([command]).threads == DEFAULT_THREADS
        assert parser.parse_args([command, "--threads", "2"]).threads == 2


def test_example_runs_with_the_threads_it_was_given(process_threads, capsys):
    args = ["example", "--b", "4", "--d-s", "8", "--d-e", "8", "--d-k", "2", "--p", "2", "--repeats", "1",
            "--presets", "formula2"]
    assert cli_main([*args, "--threads", "3"]) == 0
    assert "threads=3" in capsys.readouterr().out
    assert cli_main(args) == 0
    assert f"threads={DEFAULT_THREADS}" in capsys.readouterr().out
    assert torch.get_num_threads() == process_threads
