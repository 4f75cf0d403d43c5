"""Issue 38, items 3 and 4: a growth says, one short line each, what did not go as planned, and why it did nothing.

- The default states the statistics its regime's evidence needs (batches, tokens per entry of ``P``), read from
  ``default.json`` and checked here against the file by an independent parse; with fewer, ``fallback`` says so.
- ``+holdout`` with one statistics batch says how it adapted.
- Every growth that takes no step (λ = 0) has exactly one ``no step:`` line; a growth that steps has none.
- The regime's verdict is ``info["default_evidence"]``, one line pointing to ``default.json`` and the report; the
  fallback no longer carries the statement, nor a claim that contradicts it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import anisotropic_X, attention_loss, factors, grad_of

from growbench import strategies
from growbench.strategies import spec as reg

COMMITTED = json.loads((Path(strategies.__file__).parent / "default.json").read_text())["regimes"]
GROWTH = ["default", "gram/ridge/full+metric/normal+holdout+shrink:bracket",
          "gram/ridge/rsvd+metric/normal+holdout:bracket", "gram/solve/full+metric/fast:quadratic",
          "gram/solve/full+metric/normal:newton", "formula1", "formula2", "joint", "gram/ridge/full/normal+damp:grid"]


def problem(b: int = 8, d_s: int = 10, d_e: int = 8, d_k: int = 2, seed: int = 3):
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=seed)
    W_Q, W_K = factors(d_e, d_k, seed=seed + 1)
    loss = attention_loss(b, d_s, seed=seed + 2)
    G = grad_of(loss, X @ (W_Q @ W_K.T / math.sqrt(d_k)) @ X.mT)
    return X, G, W_Q, W_K, loss


def least_statistics(entry: dict) -> tuple[int | None, float | None]:
    """The independent reading: the datasets whose evidence says the choice lowers the held-out loss, their
    ``n_batches`` (from the setup text) and ``tokens_per_d_e2``; the least of each."""
    lowering = [name for name, ev in entry["evidence"].items() if isinstance(ev, dict) and ev.get("lowers") is True]
    batches = [int(re.search(r"n_batches=(\d+)", entry["datasets"][name]).group(1)) for name in lowering]
    tokens = [entry["evidence"][name]["tokens_per_d_e2"] for name in lowering]
    return (min(batches) if batches else None), (min(tokens) if tokens else None)


@pytest.mark.parametrize("key", sorted(COMMITTED))
def test_the_default_states_the_statistics_its_evidence_needs(key):
    regime = strategies.Regime.parse(key)
    choice = reg.default_choice(regime.device, regime.width)
    assert (choice.batches, choice.tokens_per_entry) == least_statistics(COMMITTED[key])
    assert choice.batches is not None and choice.tokens_per_entry > 0


def test_fewer_statistics_than_the_evidence_are_said_in_one_line():
    X, G, W_Q, W_K, loss = problem()  # d_e = 8: cpu, d_e ≤ 128; 80 tokens a batch, 1.25 per entry of P
    need = reg.default_choice("cpu", 8)
    assert (need.batches, need.tokens_per_entry) == (4, 4.0)  # the committed evidence (see the test above)
    d = strategies.make("default")
    few = d.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss)
    assert few.info["statistics_needed"] == {"batches": 4, "tokens_per_d_e2": 4.0}
    assert few.info["statistics_batches"] == 1 and few.info["tokens_per_d_e2"] == 80 / 64
    (line,) = [f for f in few.fallback if f.startswith("statistics:")]
    assert "1 batch" in line and "4 batches" in line and "per entry" in line
    stats = d.new_statistics()
    for k in range(4):
        stats.update(anisotropic_X(8, 10, 8, cond=10.0, seed=20 + k), G)
    stats.update(X, G)  # five batches, 400 tokens: 6.25 per entry of P
    enough = d.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    assert enough.info["statistics_batches"] == 5 and not any(f.startswith("statistics:") for f in enough.fallback)


def test_holdout_on_one_batch_says_how_it_adapted():
    X, G, W_Q, W_K, loss = problem()
    s = strategies.make("gram/ridge/rsvd+metric/normal+holdout:bracket")
    one = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss)
    assert sum(f.startswith("holdout: one statistics batch") for f in one.fallback) == 1
    stats = s.new_statistics().update(X * 1.1, G).update(X, G)
    two = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    assert not any(f.startswith("holdout:") for f in two.fallback), two.fallback


def _cases():
    X, G, W_Q, W_K, loss = problem()
    yield "plain", X, G, W_Q, W_K, loss
    yield "G = 0", X, torch.zeros_like(G), W_Q, W_K, loss
    yield "X = 0", torch.zeros_like(X), G, W_Q, W_K, loss
    # A loss that any step raises: the search finds nothing below the current loss.
    S0 = X @ (W_Q @ W_K.T / math.sqrt(2)) @ X.mT
    yield "pinned", X, G, W_Q, W_K, lambda S: ((S - S0) ** 2).sum() + (G * S).sum().detach() * 0


@pytest.mark.parametrize("spec", GROWTH)
@pytest.mark.parametrize("case", ["plain", "G = 0", "X = 0", "pinned"])
def test_a_growth_that_takes_no_step_says_why_once(spec, case):
    _, X, G, W_Q, W_K, loss = next(c for c in _cases() if c[0] == case)
    r = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss)
    why = [f for f in r.fallback if f.startswith("no step:")]
    if r.lam == 0:
        assert len(why) == 1 and why[0].endswith("the block computes what it did before"), r.fallback
        # ... and it does: the scores move by rounding only (T_r(Z) = Z when rank Z ≤ r, docs/mathematics.md §4.3).
        Z = W_Q @ W_K.T / math.sqrt(2)
        change = torch.linalg.vector_norm(X @ r.dZ @ X.mT)
        assert change <= 1e-9 * max(float(torch.linalg.vector_norm(X @ Z @ X.mT)), 1.0)
    else:
        assert not why, r.fallback
    assert all("\n" not in f for f in r.fallback)


def test_the_evidence_has_its_own_field_and_the_fallback_no_longer_contradicts_it():
    """cpu, d_e = 384: the growth used to append "the strategy that harms least" beside a committed statement that
    named the rule's choice (shown harmless where growth does not generalise)."""
    X, G, W_Q, W_K, loss = problem(b=2, d_s=4, d_e=384, d_k=2, seed=5)
    r = strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss)
    choice = reg.default_choice("cpu", 384)
    assert not choice.generalises
    evidence = r.info["default_evidence"]
    assert evidence == choice.evidence() and "\n" not in evidence and len(evidence) < 500  # two datasets named
    assert "default.json" in evidence and "What to use" in evidence
    # The evidence names the datasets where growth does not generalise, as the committed statement does.
    assert all(ds in evidence for ds in choice.statement.split(": on ", 1)[1].split(", no growth")[0].split(", "))
    default_lines = [f for f in r.fallback if f.startswith("default:")]
    # The fallback says only what the statement says: "harms least" where the statement says it, never beside a
    # statement that names the rule's choice (what it used to do).
    assert len(default_lines) == 1 and ("harms least" in default_lines[0]) <= ("harms least" in choice.statement)
    assert choice.statement not in " ".join(r.fallback)
    assert all(len(f) < 250 for f in r.fallback), [len(f) for f in r.fallback]
