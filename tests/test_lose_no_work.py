"""No easy way to lose work (issue 28, item 6): ``run`` resumes like ``train``, and a sweep into a database that
holds other configurations' runs says so and names the option that keeps them apart."""

from __future__ import annotations

import dataclasses
import sqlite3
import time

import pandas as pd

from growbench.harness.cli import main as cli_main
from growbench.harness.runner.sweep import expand, presets_holding, runs_outside, sweep_presets

TINY = ["--d-s", "4", "--d-e", "8", "--b", "8", "--d-k", "2", "--p", "2", "--repeats", "1", "--n-batches", "1",
        "--warmup-steps", "3", "--no-progress"]


def _rows(db) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT key, started_at FROM runs ORDER BY key").fetchall()


def test_run_resumes_by_default_and_reruns_only_when_asked(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    args = ["run", "--strategies", "default,zero", "--datasets", "digits", *TINY, "--db", str(db),
            "--cache-dir", str(tmp_path / "c")]
    assert cli_main(args) == 0
    first = _rows(db)
    assert len(first) == 2
    capsys.readouterr()
    assert cli_main(args) == 0  # the same command again: nothing is measured twice
    assert "resuming: 2 of 2" in capsys.readouterr().err
    assert _rows(db) == first
    time.sleep(1.1)  # started_at is stored to the second: a run measured again has a later one
    assert cli_main([*args, "--no-resume"]) == 0
    assert "resuming" not in capsys.readouterr().err
    again = _rows(db)
    assert [k for k, _ in again] == [k for k, _ in first] and again != first


def test_a_sweep_into_a_database_of_other_runs_warns_and_names_the_option(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    common = [*TINY, "--db", str(db), "--cache-dir", str(tmp_path / "c")]
    assert cli_main(["run", "--strategies", "zero", "--datasets", "digits", *common]) == 0
    assert "warning" not in capsys.readouterr().err
    assert cli_main(["run", "--strategies", "zero", "--datasets", "teacher", *common]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "1 runs of other configurations" in warned[0] and "--db" in warned[0]


def test_other_runs_are_named_by_the_preset_that_holds_them():
    smoke = expand(sweep_presets()["smoke"])
    frame = pd.DataFrame([dataclasses.asdict(c) for c in smoke[:3]])
    assert presets_holding(frame) == ["smoke"]
    assert runs_outside(frame, smoke).empty
    assert len(runs_outside(frame, smoke[3:])) == 3
