"""The summary ``growbench run`` prints reports what the report reports (issue 38, item 5).

Same measure (the held-out gain: the held-out loss decrease as a share of the held-out loss
before growth, mean over seeds with its 95 % interval), same units (percent), same grouping
(per regime, each dataset's reference configuration): checked against the recommendation's
evidence, which the report prints, on the committed reference runs.
"""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import ROOT

from growbench import strategies
from growbench.harness.cli import main as cli_main
from growbench.harness.cli import sweep_summary
from growbench.harness.recommend import clean_timings, recommend_regimes
from growbench.harness.store.schema import RUNS
from growbench.strategies.regimes import Regime


@pytest.fixture(scope="module")
def committed() -> pd.DataFrame:
    return clean_timings(RUNS.complete(pd.read_csv(ROOT / "reports" / "runs.csv")))


def test_each_choice_reads_as_in_the_recommendation(committed):
    table, _ = sweep_summary(committed)
    recs = recommend_regimes(committed)
    checked = 0
    for key, rec in recs.items():
        for dataset, e in rec.evidence.items():
            if not isinstance(e, dict):
                continue
            line = table[(table.regime == Regime.parse(key).describe()) & (table.dataset == dataset)
                         & (table.strategy == rec.spec)]
            assert len(line) == 1, (key, dataset)
            line = line.iloc[0]
            mean, low, high, n = e["heldout_gain"]
            assert line["held-out gain"] == f"{100 * mean:+.3g}% [{100 * low:+.3g}, {100 * high:+.3g}]"
            assert line.gain == pytest.approx(mean) and line.seeds == n
            assert line.optimality == pytest.approx(e["optimality"])
            assert line.time_ms == pytest.approx(e["time_ms"])
            assert line.preset == "default"  # each regime's choice is named so in its own regime
            checked += 1
    assert checked >= 4


def test_the_issue_s_line_now_reads_as_the_report(committed):
    # "digits cpu default" printed optimality 0.0081 and held-out decrease 1.4e-07 (a median over 1, 2 and 4
    # batches, in loss units); the report says +0.702 % [+0.166, +1.24] and an optimality of 0.985.
    table, _ = sweep_summary(committed)
    line = table[(table.dataset == "digits") & (table.preset == "default")].iloc[0]
    assert line["held-out gain"].startswith("+0.702%") and line.optimality == pytest.approx(0.985, abs=5e-4)


def test_runs_of_other_configurations_change_no_line_and_are_counted(committed):
    table, note = sweep_summary(committed)
    # A run of the default on digits at one statistics batch, as the statistics-tokens study has, with a huge gain.
    row = committed[(committed.dataset == "digits") & (committed.status == "ok")].iloc[[0]].copy()
    row["key"], row["n_batches"], row["heldout_decrease"] = "extra", 1, row.heldout_before * 0.9
    more, more_note = sweep_summary(pd.concat([committed, row], ignore_index=True))
    pd.testing.assert_frame_equal(more, table)
    count = int(note.split()[0])
    assert int(more_note.split()[0]) == count + 1
    # Baselines are counted with them: never a line (as in the report's tables).
    assert not table.strategy.isin(strategies.baseline_names()).any()


def test_failed_runs_are_counted_on_their_line_and_a_strategy_that_always_failed_has_one(committed):
    row = committed[(committed.dataset == "teacher") & (committed.status == "ok")].iloc[[0]].copy()
    row["key"], row["status"], row["error"] = "failed-one", "failed", "RuntimeError: boom"
    never = row.assign(key="failed-two", strategy="gram/solve/rsvd/normal:grid")
    table, _ = sweep_summary(pd.concat([committed, row, never], ignore_index=True))
    line = table[(table.dataset == "teacher") & (table.strategy == row.strategy.iloc[0])]
    assert line.failed.tolist() == [1]
    line = table[(table.dataset == "teacher") & (table.strategy == "gram/solve/rsvd/normal:grid")].iloc[0]
    assert line.failed == 1 and line.seeds == 0 and "every run failed" in line["held-out gain"]


def test_the_run_command_prints_the_held_out_gain_in_percent(tmp_path, capsys):
    db = str(tmp_path / "r.sqlite")
    args = ["run", "--strategies", "formula2,formula4", "--datasets", "digits", "--d-s", "4", "--d-e", "8", "--b", "8",
            "--d-k", "2", "--p", "2", "--seeds", "0,1", "--repeats", "1", "--n-batches", "1", "--warmup-steps", "3",
            "--db", db, "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "held-out gain" in out and "mean over seeds [95% interval]" in out
    lines = [ln for ln in out.splitlines() if "digits" in ln]
    assert len(lines) == 2 and all("%" in ln and "[" in ln for ln in lines), out
    assert "heldout_decrease" not in out and "loss_decrease" not in out
