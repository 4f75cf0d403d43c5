"""Bad input fails early with a ``ValueError`` that names the problem; singular input falls back instead."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DT, anisotropic_X, causal, factors, random_G

from growbench import strategies
from growbench.strategies import metrics

B, D_S, D_E, D_K = 2, 5, 4, 1


def good():
    X = anisotropic_X(B, D_S, D_E, cond=10.0, seed=0)
    G = random_G(B, D_S, seed=1)
    W_Q, W_K = factors(D_E, D_K, seed=2)
    return X, G, W_Q, W_K


def loss(S):
    return 0.5 * ((S - 1.0) ** 2).mean()


def with_bad(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[3] = value
    return t


ENTRY_POINTS = {
    "grow": lambda X, G, mask=None: strategies.make("default").grow(
        *factors(D_E, D_K), X, G, p=1, loss_of_scores=loss, mask=mask),
    "direction": lambda X, G, mask=None: strategies.make("formula1").direction(X, G, mask),
    "update": lambda X, G, mask=None: strategies.make("joint").new_statistics().update(X, G, mask),
    "first_order_decrease": lambda X, G, mask=None: metrics.first_order_decrease(G, X, torch.eye(D_E, dtype=DT), mask),
    "optimality": lambda X, G, mask=None: metrics.optimality(G, X, torch.eye(D_E, dtype=DT), mask),
    "bottleneck": lambda X, G, mask=None: metrics.bottleneck(G, X, mask),
    "projected_gradient": lambda X, G, mask=None: metrics.projected_gradient(G, X, mask),
}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("which", ["X", "G"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_non_finite_input_is_rejected(entry, which, value):
    X, G, _, _ = good()
    if which == "X":
        X = with_bad(X, value)
    else:
        G = with_bad(G, value)
    with pytest.raises(ValueError, match=rf"{which} contains 1 NaN/Inf"):
        ENTRY_POINTS[entry](X, G)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_wrong_shapes_are_rejected(entry):
    X, G, _, _ = good()
    with pytest.raises(ValueError, match=r"X must have shape \(b, d_s, d_e\)"):
        ENTRY_POINTS[entry](X[0], G)
    with pytest.raises(ValueError, match=r"G must have shape \(b, d_s, d_s\)"):
        ENTRY_POINTS[entry](X, G[:, :, :-1])
    with pytest.raises(ValueError, match=r"G must have shape \(b, d_s, d_s\)"):
        ENTRY_POINTS[entry](X, G[:1])
    with pytest.raises(ValueError, match="share dtype"):
        ENTRY_POINTS[entry](X, G.float())


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_bad_masks_are_rejected(entry):
    X, G, _, _ = good()
    with pytest.raises(ValueError, match="mask must have shape"):
        ENTRY_POINTS[entry](X, G, causal(D_S + 1))
    with pytest.raises(ValueError, match="mask must have shape"):
        ENTRY_POINTS[entry](X, G, causal(D_S).expand(B + 1, -1, -1))
    with pytest.raises(ValueError, match="mask must have dtype torch.bool"):
        ENTRY_POINTS[entry](X, G, causal(D_S).to(DT))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        ENTRY_POINTS[entry](X, G, [[True]])


def test_bad_factors_are_rejected():
    X, G, W_Q, W_K = good()
    s = strategies.make("default")
    with pytest.raises(ValueError, match="W_Q has 3 rows but X has d_e=4"):
        s.grow(W_Q[:3], W_K[:3], X, G, p=1, loss_of_scores=loss)
    with pytest.raises(ValueError, match="W_Q and W_K must both have shape"):
        s.grow(W_Q, torch.cat([W_K, W_K], 1), X, G, p=1, loss_of_scores=loss)
    with pytest.raises(ValueError, match="W_Q and W_K must both have shape"):
        s.grow(W_Q[:, 0], W_K[:, 0], X, G, p=1, loss_of_scores=loss)
    with pytest.raises(ValueError, match="W_K contains 1 NaN/Inf"):
        s.grow(W_Q, with_bad(W_K, math.nan), X, G, p=1, loss_of_scores=loss)
    with pytest.raises(ValueError, match="must match X"):
        s.grow(W_Q.float(), W_K.float(), X, G, p=1, loss_of_scores=loss)


@pytest.mark.parametrize("spec", ["default", "joint", "random", "zero", "gradmax"])
def test_growth_beyond_d_e_is_rejected(spec):
    X, G, W_Q, W_K = good()
    s = strategies.make(spec)
    with pytest.raises(ValueError, match=r"d_k \+ p > d_e"):
        s.grow(W_Q, W_K, X, G, p=D_E - D_K + 1, loss_of_scores=loss)
    for p in (-1, 1.5, True):
        with pytest.raises(ValueError, match="p must be a non-negative int"):
            s.grow(W_Q, W_K, X, G, p=p, loss_of_scores=loss)
    r = s.grow(W_Q, W_K, X, G, p=D_E - D_K, loss_of_scores=loss)  # the limit itself is fine
    assert r.W_Q.shape == (D_E, D_E)


BAD_SPECS = ["gram/pinv/full/fast:grad", "gram/pinv/full", "gramm/pinv/full/fast:grid",
             "gram/pinv/full+metrik/fast:grid", "nonsense", "formula9", "", "gram/qr/full/fast:grid"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_unknown_spec_or_preset_lists_valid_ones(spec):
    with pytest.raises(ValueError, match="unknown") as info:
        strategies.make(spec)
    msg = str(info.value)
    for valid in ("gram", "per-sample", "joint", "pinv", "solve", "rsvd", "newton", "formula1", "gradmax", "default"):
        assert valid in msg, valid
    assert repr(spec) in msg


def test_non_string_spec_is_rejected():
    with pytest.raises(ValueError, match="spec must be a string"):
        strategies.make(3)


def test_bad_scale_and_loss_are_rejected():
    X, G, W_Q, W_K = good()
    s = strategies.make("default")
    for c in (0.0, -1.0, math.inf, math.nan, "x"):
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, scale=c)
        with pytest.raises(ValueError, match="new_scale must be a positive finite number"):
            s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, new_scale=c)
    with pytest.raises(ValueError, match="loss_of_scores must be callable"):
        s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=None)
    with pytest.raises(ValueError, match="scalar tensor"):
        s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=lambda S: S)
    with pytest.raises(ValueError, match="cannot measure a decrease"):
        s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=lambda S: S.sum() * math.nan)


def test_statistics_misuse_is_rejected():
    X, G, W_Q, W_K = good()
    s = strategies.make("default")
    with pytest.raises(ValueError, match="statistics are empty"):
        s.direction(s.new_statistics())
    with pytest.raises(ValueError, match="statistics are empty"):
        s.grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, stats=s.new_statistics())
    stats = s.new_statistics().update(X, G)
    with pytest.raises(ValueError, match="d_e=4"):
        stats.update(X[..., :3], G)
    with pytest.raises(ValueError, match="either statistics or"):
        s.direction(stats, G)
    with pytest.raises(ValueError, match="G is required"):
        s.direction(X)
    with pytest.raises(ValueError, match="do not fit"):
        strategies.make("joint").grow(W_Q, W_K, X, G, p=1, loss_of_scores=loss, stats=stats)
    with pytest.raises(ValueError, match="d_s=5"):
        strategies.make("formula3").new_statistics().update(X, G).update(X[:, :4], G[:, :4, :4])
    with pytest.raises(ValueError, match="d_s=5"):
        strategies.make("joint").new_statistics().update(X, G).update(X[:, :4], G[:, :4, :4])


def test_metrics_reject_bad_dZ():
    X, G, _, _ = good()
    with pytest.raises(ValueError, match=r"dZ must have shape \(d_e, d_e\)"):
        metrics.first_order_decrease(G, X, torch.eye(D_E + 1, dtype=DT))
    with pytest.raises(ValueError, match="dZ contains 1 NaN/Inf"):
        metrics.optimality(G, X, with_bad(torch.eye(D_E, dtype=DT), math.nan))


SOLVE_SPECS = ["gram/solve/full/fast:grid", "gram/solve/rsvd+metric/normal:bracket", "formula4",
               "per-sample/solve/rsvd/normal:newton",
               "mean-input/solve/full+metric/fast:bounded", "joint/solve/full/normal:grid"]


@pytest.mark.parametrize("spec", SOLVE_SPECS)
def test_singular_gram_under_solve_is_handled_and_recorded(spec):
    """d_s < d_e with one batch: every Gram matrix is singular. Per-sample ``solve`` falls back to pinv and
    says so; a single Gram matrix has its 3 null directions removed by design and says how many."""
    X = anisotropic_X(1, 3, 6, cond=10.0, seed=5)
    G = random_G(1, 3, seed=6)
    W_Q, W_K = factors(6, 2, seed=7)
    r = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss)
    if spec.startswith("per-sample"):
        assert r.fallback and any("pinv" in m for m in r.fallback), r.fallback
    else:
        assert not any(m.startswith("solve") for m in r.fallback), r.fallback
    if strategies.parse(spec)["averaging"] == "gram":
        assert r.info["null_directions"] == 3, r.info
    assert torch.isfinite(r.W_Q).all() and torch.isfinite(r.W_K).all()
    assert r.W_Q.shape == (6, 4)


def test_finite_check_passes_a_finite_tensor_whose_sum_overflows() -> None:
    from growbench.strategies._checks import check_finite

    big = torch.full((4,), 3e38)  # finite, but its float32 sum is inf
    check_finite("X", big)
    big[2] = float("nan")
    with pytest.raises(ValueError, match="X contains 1 NaN/Inf"):
        check_finite("X", big)


def test_finite_magnitudes_are_max_abs_and_refuse_nan_and_inf_by_name():
    """One pass for the NaN/Inf check and ``max|t|`` (a growth's inputs): against ``t.abs().max()``, and the
    refusal names the tensor and counts its bad entries."""
    from growbench.strategies._checks import finite_magnitudes

    X = torch.randn(3, 4, 5, dtype=torch.float64)
    G = -7 * torch.rand(3, 4, 4, dtype=torch.float64)
    assert finite_magnitudes({"X": X, "G": G}) == [float(X.abs().max()), float(G.abs().max())]
    for bad in (math.nan, math.inf, -math.inf):
        G_bad = G.clone()
        G_bad[1, 2, 3] = G_bad[2, 0, 0] = bad
        with pytest.raises(ValueError, match="^G contains 2 NaN/Inf entries$"):
            finite_magnitudes({"X": X, "G": G_bad})
