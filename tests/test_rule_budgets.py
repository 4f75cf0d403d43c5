"""The regime's statement names the statistics budget that works (harness/rule/wording.py: budgets_tried)."""

from __future__ import annotations

import pandas as pd
import pytest

from growbench.harness.rule.wording import budgets_tried

GROW, OTHER = "gram/ridge/rsvd+metric/normal+shrink:bracket", "gram/solve/rsvd+metric/normal:bracket"


def frame(gains: dict[tuple[int, str], list[float]], dataset: str = "smollm-lm") -> pd.DataFrame:
    rows = [dict(status="ok", strategy=s, dataset=dataset, statistics_tokens=t, d_e=576, seed=i, heldout_before=2.0,
                 heldout_decrease=2.0 * g)
            for (t, s), seeds in gains.items() for i, g in enumerate(seeds)]
    return pd.DataFrame(rows)


def test_the_fewest_tokens_at_which_a_strategy_lowers_the_loss_on_every_seed_beyond_noise():
    f = frame({(512, GROW): [0.01, -0.02, 0.0], (4096, GROW): [0.010, 0.012, 0.011], (4096, OTHER): [0.02, -0.1, 0.03],
               (16384, OTHER): [0.02, 0.021, 0.019]})
    said = budgets_tried(f, "smollm-lm", 0.95)
    assert said.startswith("with 4096 statistics tokens (0.012 per entry of P) " + GROW)


@pytest.mark.parametrize("gains", [[0.01, 0.02, -0.001], [0.001, 0.2, 0.0005]])
def test_no_budget_works_names_the_largest_tried(gains):
    # A seed that raises the loss, or every seed positive but the interval reaching below 0: neither counts.
    f = frame({(512, GROW): [0.0, 0.0, 0.0], (16384, GROW): gains})
    said = budgets_tried(f, "smollm-lm", 0.95)
    assert said.startswith("no growth strategy does on every seed at any budget these runs tried, up to 16384")


def test_one_budget_says_nothing_more():
    assert budgets_tried(frame({(512, GROW): [0.01, 0.02, 0.03]}), "smollm-lm", 0.95) is None
