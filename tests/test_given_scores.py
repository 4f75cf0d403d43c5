"""A growth handed the current scores (``grow(..., scores=)``), as the forward pass that gave ``G`` made them: the
same step as forming them, no second product over the batch, and a mistaken tensor refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import anisotropic_X, attention_loss, causal, factors, grad_of, scores

from growbench import strategies
from growbench.strategies import growth

SPECS = ["default", "gram/ridge/full+metric/normal+holdout+shrink:bracket", "gram/solve/full+metric/fast:quadratic"]


def _problem(b: int = 8, d_s: int = 7, d_e: int = 5, d_k: int = 2, masked: bool = True):
    mask = causal(d_s) if masked else None
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=3)
    W_Q, W_K = factors(d_e, d_k, seed=4)
    c = 1 / math.sqrt(d_k)
    loss = attention_loss(b, d_s, seed=5, mask=mask)
    S = scores(X, c * W_Q @ W_K.T)  # sample by sample: another order of the products than the growth's
    return X, grad_of(loss, S), W_Q, W_K, c, loss, mask, S


@pytest.mark.parametrize("spec", SPECS)
def test_the_step_from_given_scores_is_the_step_from_formed_ones(spec):
    X, G, W_Q, W_K, c, loss, mask, S = _problem()
    grow = strategies.make(spec).grow
    formed = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask)
    same = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask,
                scores=strategies.current_scores(X, W_Q, W_K, c))
    given = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask, scores=S)
    assert formed.lam > 0
    assert same.lam == formed.lam and torch.equal(same.dZ, formed.dZ)  # the very numbers it would form: bit for bit
    assert given.lam == pytest.approx(formed.lam, rel=1e-9)
    torch.testing.assert_close(given.dZ, formed.dZ, rtol=1e-9, atol=1e-12)
    assert given.loss_before == pytest.approx(float(loss(S)), rel=1e-15)


def test_given_scores_are_not_formed_again(monkeypatch):
    # Only the first sample's are formed, to check them against the factors.
    X, G, W_Q, W_K, c, loss, mask, S = _problem()
    formed = []
    monkeypatch.setattr(growth, "current_scores",
                        lambda X, *a: formed.append(X.shape[0]) or strategies.current_scores(X, *a))
    strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask, scores=S)
    assert formed == [1]
    strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask)
    assert formed == [1, X.shape[0]]


@pytest.mark.parametrize("mistake, message", [
    (lambda S, mask: S.mT, "differ from scale"),  # the transpose: keys and queries swapped
    (lambda S, mask: S.masked_fill(~mask, float("-inf")), "differ from scale"),  # after the mask
    (lambda S, mask: torch.softmax(S.masked_fill(~mask, float("-inf")), -1), "differ from scale"),
    (lambda S, mask: 1.01 * S, "differ from scale"),  # another scale
    (lambda S, mask: S[:-1], r"must have shape \(b, d_s, d_s\)"),
    (lambda S, mask: S.to(torch.int64), "float16, bfloat16, float32 or float64"),
    (lambda S, mask: torch.cat([S[:1], torch.full_like(S[1:], math.nan)]), "scores contains .* NaN/Inf"),
])
def test_mistaken_scores_are_refused_by_name(mistake, message):
    X, G, W_Q, W_K, c, loss, mask, S = _problem()
    with pytest.raises(ValueError, match=message):
        strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask,
                                        scores=mistake(S, mask))


def test_half_precision_scores_are_checked_at_their_own_precision():
    # A bfloat16 forward's scores differ from float32 products by bfloat16's rounding: accepted, and the step is
    # the one from scores formed in float32.
    X, G, W_Q, W_K, c, loss, mask, S = _problem(masked=False)
    X, G, W_Q, W_K, S = (t.to(torch.bfloat16) for t in (X, G, W_Q, W_K, S))

    def loss16(S16: torch.Tensor) -> torch.Tensor:
        return loss(S16.double()).to(torch.bfloat16)

    r = strategies.make("gram/solve/full+metric/fast:quadratic").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss16,
                                                                       scale=c, scores=S)
    assert r.W_Q.dtype == torch.bfloat16 and torch.isfinite(r.W_Q).all()
