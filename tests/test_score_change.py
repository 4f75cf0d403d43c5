"""``‖X P Xᵀ‖`` from the samples' Gram matrices or from a seeded sketch (strategies/score_change.py), and the
growth's problem built from the statistics' sums instead of the formed score change: the same problem (up to the
sketch's reported error), checked against the formed one."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DT, anisotropic_X, causal, factors, gen, grad_of, rel_err

from growbench import strategies
from growbench.strategies import growth, score_change
from growbench.strategies.score_change import SampleGrams, SketchedNorms, grams_pay, sketch_pays


def _formed_norm(X: torch.Tensor, P: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(X.double() @ P.double() @ X.double().mT))


def _ill_placed_direction(X: torch.Tensor, seed: int) -> torch.Tensor:
    """``A⁻¹ M A⁻¹`` with ``A`` the batch's Gram sum: a non-symmetric direction weighted to ``X``'s weakest
    directions, where the rounding of either way to ``‖X P Xᵀ‖`` is largest."""
    X64 = X.double()
    A = (X64.mT @ X64).sum(0)
    M = (X64.mT @ torch.randn(X.shape[0], X.shape[1], X.shape[1], generator=gen(seed), dtype=DT) @ X64).sum(0)
    return torch.linalg.solve(A, torch.linalg.solve(A, M.mT).mT).to(X.dtype)


@pytest.mark.parametrize("seed", range(3))
def test_the_traces_are_the_formed_score_changes_norm(seed):
    X = anisotropic_X(5, 11, 6, cond=1e2, seed=seed)
    P = torch.randn(6, 6, generator=gen(seed + 1), dtype=DT)  # not symmetric
    assert float(SampleGrams(X).score_change_norm(P)) == pytest.approx(_formed_norm(X, P), rel=1e-13)


@pytest.mark.parametrize("cond", [1.0, 1e2, 1e4])
def test_in_float32_the_traces_are_as_accurate_as_the_formed_norm(cond):
    X = anisotropic_X(64, 48, 16, cond=cond, seed=3).float()
    P = _ill_placed_direction(X, seed=4)
    exact = _formed_norm(X, P)
    traces = abs(float(SampleGrams(X).score_change_norm(P)) / exact - 1)
    formed = abs(float(torch.linalg.vector_norm(X @ P @ X.mT)) / exact - 1)
    assert traces <= max(2 * formed, 1e-6), (traces, formed)


def _sketch_through_grams(X: torch.Tensor, **options) -> SketchedNorms:
    return SketchedNorms(X, grams=X.mT @ X, **options)


@pytest.mark.parametrize("exponent", [-60, 40])
@pytest.mark.parametrize(("norms", "rel"), [(SampleGrams, 1e-6), (SketchedNorms, 1e-5), (_sketch_through_grams, 1e-5)])
def test_the_norms_keep_float32s_range_at_extreme_magnitudes(norms, rel, exponent):
    # Unscaled, the traces of X 2^40 would reach 2^320 and those of X 2^-60 underflow to 0 (the sketch's squared
    # probes alike); ‖X P Xᵀ‖ is in range, and scales with X² exactly.
    X = anisotropic_X(8, 12, 5, cond=10.0, seed=5).float()
    P = torch.randn(5, 5, generator=gen(6), dtype=DT).float()
    base = float(norms(X).score_change_norm(P))
    big = float(norms(X * 2.0**exponent).score_change_norm(P))
    assert big == pytest.approx(base * 2.0 ** (2 * exponent), rel=rel)


def test_the_traces_pay_for_unmasked_batches_well_under_d_s_wide():
    assert grams_pay(torch.zeros(2, 128, 64), None)
    assert not grams_pay(torch.zeros(2, 128, 64), causal(128))  # no Gram matrix leaves masked entries out
    assert not grams_pay(torch.zeros(2, 128, 96), None)
    assert not grams_pay(torch.zeros(2, 128, 256), None)


def _unmasked_growth_problem(seed: int, b: int = 8, d_s: int = 16, d_e: int = 6, d_k: int = 2):
    """Scores pulled towards a teacher's, ``X (Z + Δ) Xᵀ`` with ``Δ`` of rank 2, plus noise: every half of the
    batch sees the same ``Δ``, so a direction fitted to one half lowers the other's loss."""
    X = anisotropic_X(b, d_s, d_e, cond=1e2, seed=seed)
    W_Q, W_K = factors(d_e, d_k, seed=seed + 1)
    c = 1 / math.sqrt(d_k)
    U, V = factors(d_e, 2, seed=seed + 2)
    T = X @ (c * W_Q @ W_K.T + U @ V.T) @ X.mT + 0.1 * torch.randn(b, d_s, d_s, generator=gen(seed + 3), dtype=DT)

    def loss(S: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((S - T) ** 2).mean()

    return X, grad_of(loss, X @ (c * W_Q @ W_K.T) @ X.mT), W_Q, W_K, c, loss


@pytest.mark.parametrize("held_out", [False, True])
def test_the_problem_from_the_sums_is_the_problem_from_the_formed_score_change(held_out):
    # The same direction, unit, slope and (formed on demand) score change, whichever way they were found.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=7)
    s = strategies.make("gram/solve/full+metric/normal:bracket")
    fitted = slice(None) if not held_out else growth.FITTED_HALF
    stats = s.new_statistics().update(X[fitted], G[fitted])
    Z = c * W_Q @ W_K.T
    S0 = X @ Z @ X.mT
    M_batch = (X.mT @ G @ X).sum(0)
    problems = []
    for from_sums in (False, True):
        ctx = strategies.StepContext(X=X, G=G, mask=None, loss=loss, Z=Z, S0=S0, loss0=float(loss(S0)), scale=c,
                                     new_scale=c, heldout_samples=growth.HELD_OUT_HALF if held_out else None)
        if from_sums:
            ctx.M_batch = M_batch
            ctx.M_heldout = (X[1::2].mT @ G[1::2] @ X[1::2]).sum(0) if held_out else None
        problems.append(strategies.build_search_problem(s, stats, ctx, rank=4, penalise=False))
    formed, summed = problems
    assert not callable(formed.D_hat) and callable(summed.D_hat)  # the sums' problem has not formed X P̂ Xᵀ
    assert rel_err(summed.P_hat, formed.P_hat) < 1e-12
    assert summed.slope0 == pytest.approx(formed.slope0, rel=1e-12)
    assert summed.lam_unit == formed.lam_unit
    assert rel_err(summed.direction_scores(), formed.direction_scores()) < 1e-12
    assert summed.D_hat.shape == (4 if held_out else 8, 16, 16)


@pytest.mark.parametrize("spec", ["gram/ridge/full+metric/normal+holdout+shrink:bracket",
                                  "gram/ridge/full+metric/normal+shrink:bracket"])
def test_a_growth_from_the_sums_takes_the_formed_score_changes_step(spec, monkeypatch):
    # End to end: the growth uses the Gram traces where they pay, and steps as it does with the formed score change.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=11, b=12)
    made = []
    monkeypatch.setattr(growth, "SampleGrams", lambda X=None, grams=None: made.append(X) or SampleGrams(X, grams=grams))
    grow = strategies.make(spec).grow
    summed = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    assert len(made) == 1  # one set of Gram matrices for the searched direction and the refit
    monkeypatch.setattr(growth, "grams_pay", lambda X, mask: False)
    formed = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    assert len(made) == 1 and summed.lam > 0
    assert summed.lam == pytest.approx(formed.lam, rel=1e-9)
    assert rel_err(summed.dZ, formed.dZ) < 1e-8
    assert summed.loss_after == pytest.approx(formed.loss_after, rel=1e-12)


def test_the_gram_matrices_handed_over_are_the_ones_formed():
    # SampleGrams(grams=...) from the statistics' kept matrices: the same norms bit for bit, the matrices untouched.
    X = anisotropic_X(6, 13, 5, cond=1e3, seed=5) * 2.0**40  # far from 1: the scale is not
    grams = X.mT @ X
    kept = grams.clone()
    P = torch.randn(5, 5, generator=gen(6), dtype=DT)
    assert torch.equal(SampleGrams(grams=grams).score_change_norm(P), SampleGrams(X).score_change_norm(P))
    assert torch.equal(grams, kept)
    with pytest.raises(ValueError, match="one of the two"):
        SampleGrams(X, grams=grams)
    with pytest.raises(ValueError, match="one of the two"):
        SampleGrams()


def test_a_holdout_growth_takes_the_gram_matrices_its_statistics_kept(monkeypatch):
    # +holdout on one batch: the statistics of every sample keep each sample's Gram matrix, and the growth's
    # norms come from those (no second product with X), for the same step as the formed score change's.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=13, b=10)
    spec = "gram/ridge/full+metric/normal+holdout+shrink:bracket"
    made = []
    monkeypatch.setattr(growth, "SampleGrams",
                        lambda X=None, grams=None: made.append((X, grams)) or SampleGrams(X, grams=grams))
    stats = strategies.make(spec).new_statistics().update(X, G)
    assert torch.equal(stats.sample_grams, X.mT @ X)
    kept = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, stats=stats)
    own = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    assert [X_ is None and torch.equal(g, X.mT @ X) for X_, g in made] == [True, True]
    assert kept.lam > 0 and kept.lam == own.lam and torch.equal(kept.dZ, own.dZ)


@pytest.mark.parametrize("seed", range(4))
def test_the_sketch_is_within_a_few_of_its_standard_errors_of_the_formed_norm(seed):
    X = anisotropic_X(64, 48, 16, cond=1e2, seed=seed)
    P = _ill_placed_direction(X, seed=seed + 10)
    exact = _formed_norm(X, P)
    estimate, error = SketchedNorms(X).score_change_norm(P, with_error=True)
    assert 0 < float(error) < 0.05
    assert abs(float(estimate) / exact - 1) <= 4 * float(error)


def test_the_sketch_of_the_square_is_unbiased():
    # Over independent probes the estimates of ‖X P Xᵀ‖² average to the formed one, within their own spread.
    X = anisotropic_X(4, 24, 8, cond=10.0, seed=2)
    P = torch.randn(8, 8, generator=gen(3), dtype=DT)
    squares = torch.tensor([float(SketchedNorms(X, probes=4, seed=seed).score_change_norm(P)) ** 2
                            for seed in range(400)], dtype=DT)
    exact = _formed_norm(X, P) ** 2
    assert abs(float(squares.mean()) - exact) <= 4 * float(squares.std()) / math.sqrt(len(squares))


def test_its_reported_error_is_the_spread_of_its_estimates():
    # The standard error one estimate reports is the spread of the estimates over the probes' seeds.
    X = anisotropic_X(16, 24, 8, cond=10.0, seed=4)
    P = torch.randn(8, 8, generator=gen(5), dtype=DT)
    estimates = torch.tensor([float(SketchedNorms(X, seed=seed).score_change_norm(P)) for seed in range(300)],
                             dtype=DT)
    reported = float(SketchedNorms(X).score_change_norm(P, with_error=True)[1])
    assert float(estimates.std() / estimates.mean()) == pytest.approx(reported, rel=0.35)


def test_the_sketch_is_reproducible_and_leaves_the_global_random_stream_alone():
    X = anisotropic_X(8, 20, 6, cond=10.0, seed=6).float()
    P = torch.randn(6, 6, generator=gen(7), dtype=DT).float()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    first = SketchedNorms(X).score_change_norm(P)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(SketchedNorms(X).score_change_norm(P), first)
    assert not torch.equal(SketchedNorms(X, seed=1).score_change_norm(P), first)
    with pytest.raises(ValueError, match="at least 2 probes"):
        SketchedNorms(X, probes=1)


@pytest.mark.parametrize("seed", range(3))
def test_the_sketch_through_the_gram_matrices_is_the_sketch_through_x(seed):
    # ‖X_b z‖² = zᵀ A_b z: the same probes give the same estimate and error (float64, up to rounding), in float32
    # as close to the float64 estimate as the products with X are; the matrices handed over are left as they were.
    X = anisotropic_X(32, 40, 12, cond=1e3, seed=seed) * 2.0**30
    P = _ill_placed_direction(X, seed=seed + 20)
    grams = X.mT @ X
    kept = grams.clone()
    through_x = SketchedNorms(X).score_change_norm(P, with_error=True)
    through_grams = SketchedNorms(X, grams=grams).score_change_norm(P, with_error=True)
    assert torch.equal(grams, kept)
    for a, b in zip(through_grams, through_x, strict=True):
        assert float(a) == pytest.approx(float(b), rel=1e-12)
    X32, P32 = X.float(), P.float()
    estimate = float(through_x[0])
    rows = abs(float(SketchedNorms(X32).score_change_norm(P32)) / estimate - 1)
    quadratic = abs(float(SketchedNorms(X32, grams=X32.mT @ X32).score_change_norm(P32)) / estimate - 1)
    assert quadratic <= max(4 * rows, 1e-5), (quadratic, rows)
    with pytest.raises(ValueError, match="X_bᵀ X_b, shape"):
        SketchedNorms(X, grams=grams[1:])


def test_the_sketch_pays_only_where_it_costs_at_most_half_the_exact_norm():
    assert sketch_pays(torch.zeros(256, 128, 64), None)  # the targets' batches: a third of the traces
    assert sketch_pays(torch.zeros(256, 128, 256), None)
    assert sketch_pays(torch.zeros(16, 1024, 1024), None)
    assert not sketch_pays(torch.zeros(256, 128, 64), causal(128))  # no probe leaves masked entries out
    assert not sketch_pays(torch.zeros(8, 16, 6), None)  # small: the exact norm costs about as much
    assert not sketch_pays(torch.zeros(64, 32, 32), None)  # cheaper, but the exact norm takes microseconds
    assert not sketch_pays(torch.zeros(127, 128, 64), None) and sketch_pays(torch.zeros(128, 128, 64), None)
    assert score_change.sketch_probes(256) == score_change.SKETCH_PROBES
    assert score_change.sketch_probes(16) * 16 == score_change.SKETCH_MIN_PROBES


@pytest.mark.parametrize("spec", ["gram/ridge/full+metric/normal+holdout+shrink:bracket",
                                  "gram/ridge/full+metric/normal+shrink:bracket"])
def test_a_growth_with_a_sketched_norm_takes_the_exact_norms_step(spec, monkeypatch):
    # Where the sketch pays, the growth's unit of λ comes from it, and the step is the exact norm's up to that
    # unit: λ moves by the norm's ratio, the step itself (a point on the same path) by the search's tolerance.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=17, b=256, d_s=128, d_e=64, d_k=4)
    assert sketch_pays(X, None)
    grow = strategies.make(spec).grow
    sketched = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    monkeypatch.setattr(growth, "sketch_pays", lambda X, mask: False)
    exact = grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c)
    error = sketched.info["norm_sketch_rel_se"]
    assert sketched.info["norm_sketch_probes"] == 256 * score_change.SKETCH_PROBES
    assert "norm_sketch_rel_se" not in exact.info
    assert 0 < error < 0.05 and exact.lam > 0  # a batch of little rank: 3 %, the sweep's teacher 0.1 %
    assert sketched.lam == pytest.approx(exact.lam, rel=4 * error)
    assert rel_err(sketched.dZ, exact.dZ) < 0.01
    loss0 = sketched.loss_before
    assert loss0 - sketched.loss_after == pytest.approx(loss0 - exact.loss_after, rel=0.02)


def test_a_holdout_growth_sketches_through_the_gram_matrices_its_statistics_kept(monkeypatch):
    # Where the sketch pays, a one-batch +holdout growth hands its statistics' Gram matrices to the sketch (both
    # directions' norms through them): the step of the sketch through X up to rounding.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=17, b=256, d_s=128, d_e=64, d_k=4)
    spec = "gram/ridge/full+metric/normal+holdout+shrink:bracket"
    made = []

    class Recorded(SketchedNorms):  # the growth checks what its norms are
        def __init__(self, X, grams=None):
            made.append(grams)
            super().__init__(X, grams=grams)

    class ThroughX(SketchedNorms):
        def __init__(self, X, grams=None):
            super().__init__(X)

    monkeypatch.setattr(growth, "SketchedNorms", Recorded)
    stats = strategies.make(spec).new_statistics().update(X, G)
    through_grams = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, stats=stats)
    assert len(made) == 1 and torch.equal(made[0], stats.sample_grams)
    monkeypatch.setattr(growth, "SketchedNorms", ThroughX)
    through_x = strategies.make(spec).grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, stats=stats)
    assert through_grams.info["norm_sketch_rel_se"] == pytest.approx(through_x.info["norm_sketch_rel_se"], rel=1e-9)
    assert through_grams.lam > 0 and through_grams.lam == pytest.approx(through_x.lam, rel=1e-9)
    assert rel_err(through_grams.dZ, through_x.dZ) < 1e-8


def test_a_zero_direction_where_the_sketch_pays_records_no_estimate_and_takes_no_step():
    # G = 0: P = 0, the sketch's estimate is 0 and unusable; the formed score change decides (and says so), and no
    # estimate is recorded for a unit no step used.
    X, G, W_Q, W_K, c, loss = _unmasked_growth_problem(seed=19, b=256, d_s=128, d_e=64, d_k=4)
    assert sketch_pays(X, None)
    r = strategies.make("gram/ridge/full+metric/normal+shrink:bracket").grow(
        W_Q, W_K, X, torch.zeros_like(G), p=2, loss_of_scores=loss, scale=c)
    assert r.lam == 0 and "norm_sketch_rel_se" not in r.info
    assert any("X P Xᵀ = 0" in line for line in r.fallback), r.fallback
