"""Issue 37: a growth's profile and the work it no longer repeats.

- The profile's sections partition the growth's time (a fake clock checks the accounting exactly, with no
  wall-clock assertion); the loss calls it lists are ``n_loss_evals``; the caller's statistics are counted once.
- What a growth reuses gives the numbers it would compute: the batch's ``Σ X_bᵀ G_b X_b`` from statistics that
  hold the very tensors (:meth:`Statistics.is_last`), the held-out trial's scores, the ridge's stacked
  candidates; each against an independent float64 reference or the computation it replaces.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DT, anisotropic_X, attention_loss, causal, factors, grad_of, np64, rel_err

from growbench import strategies
from growbench.strategies import inverse as inv
from growbench.strategies import timing
from growbench.strategies.statistics import Statistics

HOLDOUT = "gram/ridge/full+metric/normal+holdout+shrink:bracket"
SPECS = ["default", HOLDOUT, "gram/ridge/rsvd+metric/normal+holdout:bracket", "gram/solve/full+metric/fast:quadratic",
         "gram/solve/full+metric/normal:newton", "formula1", "joint", "random", "gradmax"]


def problem(b: int = 6, d_s: int = 10, d_e: int = 8, d_k: int = 2, seed: int = 3, mask: bool = False):
    X = anisotropic_X(b, d_s, d_e, cond=10.0, seed=seed)
    W_Q, W_K = factors(d_e, d_k, seed=seed + 1)
    m = causal(d_s) if mask else None
    loss = attention_loss(b, d_s, seed=seed + 2, mask=m)
    G = grad_of(loss, X @ (W_Q @ W_K.T / math.sqrt(d_k)) @ X.mT)
    return X, G, W_Q, W_K, m, loss


# ------------------------------------------------------------------ the profile
class FakeClock:
    """``time.perf_counter`` stand-in: each call advances the clock by one second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_profile_charges_each_section_its_own_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    profile = timing.Profile()
    with profile.active():
        with timing.section("outer"):  # enters at 1
            with timing.section("inner"):  # 2 .. 3
                pass
            with timing.section("loss calls"):  # 4 .. 5
                pass
            with profile.prefixed("refit: "), timing.section("inner"), timing.section("loss calls"):  # 6, 7 .. 8, 9
                pass
        # outer leaves at 10: its own stretches 1..2, 3..4, 5..6 and 9..10
    timing.section("nowhere").__enter__()  # outside a profile: records nothing, needs no exit
    assert profile.seconds == {"outer": 4.0, "inner": 1.0, "loss calls": 2.0, "refit: inner": 2.0}
    assert profile.calls == {"outer": 1, "inner": 1, "loss calls": 2, "refit: inner": 1}
    assert profile.durations["loss calls"] == [1.0, 1.0]  # the loss calls keep their name under a prefix
    info = profile.as_info(total=12.0)
    assert info["ms"]["other"] == pytest.approx(3000.0) and info["total_ms"] == 12000.0
    assert sum(info["ms"].values()) == pytest.approx(12000.0)


@pytest.mark.parametrize("batches", [0, 1, 2])
@pytest.mark.parametrize("spec", SPECS)
def test_profile_partitions_the_growth_and_lists_every_loss_call(spec, batches):
    X, G, W_Q, W_K, _, loss = problem()
    s = strategies.make(spec)
    stats = None
    if batches:
        stats = s.new_statistics()
        if batches == 2:
            stats.update(X * 1.1, G)
        stats.update(X, G)
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    profile = r.info["profile"]
    assert all(v >= 0 for v in profile["ms"].values()), profile
    assert sum(profile["ms"].values()) == pytest.approx(1e3 * r.timings["total"], rel=1e-9)
    assert profile["total_ms"] == pytest.approx(1e3 * r.timings["total"], rel=1e-12)
    assert profile["calls"].get("loss calls", 0) == len(profile["loss_call_ms"]) == r.n_loss_evals
    holds_out = getattr(s.resolve("cpu", X.shape[-1]) if spec == "default" else s, "holds_out", False)
    refit = any(name.startswith("refit: ") for name in profile["ms"])
    assert refit == (holds_out and r.info.get("refit") is not None), (profile["ms"], r.info.get("refit"))
    if batches:  # the caller's statistics: counted once, in the statistics phase and in the total
        assert profile["ms"]["statistics"] >= 1e3 * stats.elapsed


def test_the_callers_statistics_are_counted_in_the_total_even_where_holdout_splits_them():
    """HEAD counted, for one batch under +holdout, the part the step split off instead of the caller's statistics."""
    X, G, W_Q, W_K, _, loss = problem()
    s = strategies.make(HOLDOUT)
    stats = s.new_statistics().update(X, G)
    stats.elapsed = 1000.0  # a mark no growth of this size can reach on its own
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    assert r.info["holdout"].startswith("the direction from the batch's samples of even index")
    assert r.timings["total"] >= 1000.0 and r.timings["statistics"] >= 1000.0
    assert r.info["profile"]["ms"]["statistics"] >= 1e6


# ------------------------------------------------------------------ what a growth reuses
def brute_first_order(X: torch.Tensor, G: torch.Tensor, dZ: torch.Tensor, mask: torch.Tensor | None) -> float:
    """``−⟨G, X dZ Xᵀ⟩`` in float64, sample by sample."""
    total = 0.0
    for b in range(X.shape[0]):
        S = X[b].double() @ dZ.double() @ X[b].double().T
        if mask is not None:
            S = S * mask
        total -= float((G[b].double() * S).sum())
    return total


@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("spec", [HOLDOUT, "gram/ridge/rsvd+metric/normal+holdout:bracket", "formula4", "default"])
@pytest.mark.parametrize("batches", [1, 2])
def test_the_batch_gradient_from_the_statistics_gives_the_numbers_of_a_fresh_one(spec, batches, mask):
    """Statistics whose last update had these very tensors hand the growth their ``Σ X_bᵀ G_b X_b``; the same
    numbers in copies (not the last batch by identity) make the growth compute it, in one product where the
    statistics add two halves' (``split_half``). Both results agree to rounding, and their first-order decrease is
    the float64 brute-force one."""
    X, G, W_Q, W_K, m, loss = problem(mask=mask)
    s = strategies.make(spec)
    results = []
    for same in (True, False):
        stats = s.new_statistics()
        if batches == 2:
            stats.update(X * 1.1, G, m)
        stats.update(X, G, m)
        args = (X, G, m) if same else (X.clone(), G.clone(), None if m is None else m.clone())
        assert stats.is_last(*args) == same
        results.append(s.grow(W_Q, W_K, args[0], args[1], p=2, loss_of_scores=loss, mask=args[2], stats=stats))
    a, b = results
    assert a.lam == pytest.approx(b.lam, rel=1e-9) and a.loss_after == pytest.approx(b.loss_after, rel=1e-12)
    assert a.first_order_decrease == pytest.approx(b.first_order_decrease, rel=1e-12, abs=1e-15)
    assert rel_err(a.W_Q, np64(b.W_Q)) < 1e-9 and rel_err(a.W_K, np64(b.W_K)) < 1e-9
    ref = brute_first_order(X, G, a.dZ, m)
    assert a.first_order_decrease == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_is_last_follows_the_tensors_and_their_changes():
    X, G, _, _, m, _ = problem(mask=True)
    Gs = torch.stack([G, 2 * G])
    stats = Statistics().update(X, Gs[0], m)
    assert stats.is_last(X, Gs[0], m)  # a new view of the same memory: the same batch
    assert not stats.is_last(X.clone(), Gs[0], m) and not stats.is_last(X, Gs[1], m)
    assert not stats.is_last(X, Gs[0], None) and not stats.is_last(X, Gs[0], m.clone())
    X.mul_(1.0)  # an in-place change, even one that keeps the values, ends it: the version counter moved
    assert not stats.is_last(X, Gs[0], m)
    stats.update(X, Gs[0], m)
    assert stats.is_last(X, Gs[0], m)
    assert not stats.without_last().is_last(X, Gs[0], m)
    stats.update(X * 2, Gs[1], m)
    assert not stats.is_last(X, Gs[0], m)


def test_a_batch_changed_in_place_after_the_update_is_not_reused():
    X, G, W_Q, W_K, _, loss = problem()
    s = strategies.make("formula4")
    stats = s.new_statistics().update(X, G)
    X.mul_(1.5)  # the statistics now hold another batch than the one grown on
    r = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
    assert r.first_order_decrease == pytest.approx(brute_first_order(X, G, r.dZ, None), rel=1e-9)


def test_fingerprints_find_the_same_numbers_in_another_precision_and_agree_with_float64_sums():
    X, G, _, _, _, _ = problem()
    x32, g32 = X.float(), G.float()
    stats = Statistics().update(x32.half(), g32.half())  # float16 batches accumulate in float32
    stats.update(x32 * 2, g32)
    assert stats.batch_index(x32.half()) == 0 and stats.batch_index(x32.half().double()) == 0
    assert stats.batch_index(x32 * 2) == 1 and stats.batch_index(x32 * 3) is None
    fp = stats._fingerprints[1][1]
    exact = torch.stack([(x32 * 2).double().sum(), ((x32 * 2).double() ** 2).sum()])
    assert torch.allclose(fp, exact, rtol=1e-6)


def test_held_out_trials_move_only_the_held_out_samples_scores():
    """+holdout on one batch: every trial's scores keep the current scores on the samples the direction was
    fitted to (the in-place copy gives torch.where's numbers), and move on the others."""
    X, G, W_Q, W_K, _, loss = problem(b=6)
    seen = []

    def spy(S):
        seen.append(S.detach().clone())
        return loss(S)

    r = strategies.make(HOLDOUT).grow(W_Q, W_K, X, G, p=2, loss_of_scores=spy)
    S0 = X @ (W_Q @ W_K.T / math.sqrt(2)) @ X.mT
    trials = seen[1:r.info["bracket_trials"] + 1]  # after the current loss, the search's trials
    assert trials
    for S in trials:
        torch.testing.assert_close(S[0::2], S0[0::2], rtol=0, atol=1e-12)
        assert not torch.equal(S[1::2], S0[1::2])


@pytest.mark.parametrize("d", [1, 3, 16, 53, 96, 190])
def test_the_ridges_candidates_score_as_the_definition(d):
    """Each α's honest cosine from its definition, in float64: ``P(δ) = (A + δI)⁻¹ M (A + δI)⁻¹`` per half,
    ``2⟨M_a, P_b⟩ + 2⟨M_b, P_a⟩`` over ``(Σ_ij w_i w_j P̃_ij²)^½``; the component picks the argmax (any of a tie: at
    d = 1 every strength scales the direction alone, and all score the same)."""
    g = torch.Generator().manual_seed(d)
    B = torch.randn(d, d + 2, generator=g, dtype=DT)
    A = B @ B.T / d
    Ma, Mb = (torch.randn(d, d, generator=g, dtype=DT) for _ in range(2))
    w, V = torch.linalg.eigh(A)
    w = w.clamp_min(0)
    tol = inv.default_rtol(A.dtype, d)
    alpha, cosine, rotated = inv._honest_alpha(w, V, (Ma, Mb), tol)
    assert all(rel_err(R, V.T @ M @ V) < 1e-12 for R, M in zip(rotated, (Ma, Mb), strict=True))
    eye = torch.eye(d, dtype=DT)
    scores = []
    for a in inv.RIDGE_ALPHAS:
        delta = a * float(w.mean())
        if delta == 0:  # the pseudo-inverse above the cutoff
            keep = w > tol * float(w.max())
            F = (V[:, keep] / w[keep]) @ V[:, keep].T
        else:
            F = torch.linalg.solve(A + delta * eye, eye)
        Pa, Pb = F @ Ma @ F, F @ Mb @ F
        honest = 2 * (Ma * Pb).sum() + 2 * (Mb * Pa).sum()
        Pt = V.T @ (Pa + Pb) @ V
        norm = float(((w[:, None] * w[None, :]) * Pt**2).sum().sqrt())
        scores.append(float(honest) / norm if norm > 0 else -math.inf)
    best = max(scores)
    assert scores[inv.RIDGE_ALPHAS.index(alpha)] == pytest.approx(best, rel=1e-10)
    assert cosine == pytest.approx(best, rel=1e-8)
    if d > 1:
        assert sorted(scores)[-2] < best * (1 - 1e-6)  # a clear winner: the choice is the definition's


@pytest.mark.parametrize(("seed", "cond", "alpha"), [(0, 1e3, 0.03), (2, 10.0, 3.0), (7, 10.0, 100.0), (1, 10.0, 0.0)])
def test_the_ridges_direction_from_its_eigenbasis_is_the_solved_sandwich(seed, cond, alpha):
    # gram/ridge makes P and the even half's direction from the halves the strength search rotated, and keeps them
    # in A's eigenbasis: the same as (A + δI)⁻¹ M (A + δI)⁻¹ by two solves, at the strength chosen (weak to strong,
    # and none), once rotated back; the gradient halves it keeps there are V' M V of the statistics' own.
    from growbench import strategies

    X = anisotropic_X(12, 9, 7, cond=cond, seed=seed)
    G = torch.randn(12, 9, 9, generator=torch.Generator().manual_seed(seed + 1), dtype=DT)
    stats = strategies.make("gram/ridge/full/normal:bracket").new_statistics().update(X, G)
    info: dict = {}
    P, halves, rotated = strategies.make("gram/ridge/full/normal:bracket").averaging.direction_and_halves(
        stats, [], info)
    assert halves is None

    def back(D):
        return rotated.V @ D @ rotated.V.mT

    even, odd = back(rotated.D_a), back(rotated.D - rotated.D_a)
    assert rel_err(back(torch.diag(rotated.w)), stats.mean_A) < 1e-12
    assert rel_err(back(rotated.D), P) < 1e-12
    assert all(rel_err(back(R), M) < 1e-12 for R, M in zip((rotated.M_a, rotated.M_b), stats.half_sums()))
    A = stats.mean_A
    lifted = A + alpha * float(torch.trace(A) / 7) * torch.eye(7, dtype=DT)

    def sandwich(M):
        return torch.linalg.solve(lifted, torch.linalg.solve(lifted, M).mT).mT

    M_even, M_odd = stats.half_sums()
    assert info["ridge_alpha"] == alpha
    assert rel_err(P, sandwich(stats.mean_M)) < 1e-10
    assert rel_err(even, sandwich(M_even / stats.n)) < 1e-10
    assert rel_err(odd, sandwich(M_odd / stats.n)) < 1e-10


@pytest.mark.parametrize("batches", [1, 2])
def test_a_step_context_built_by_hand_still_serves_holdout_strategies(batches):
    """Measurements along the path (harness.measure.search_problem) build their own StepContext, without the
    caller's tensors or a profile: the statistics' last batch is then found by its fingerprint, as before."""
    X, G, W_Q, W_K, _, loss = problem()
    s = strategies.make(HOLDOUT)
    stats = s.new_statistics()
    if batches == 2:
        stats.update(X * 1.1, G)
    stats.update(X, G)
    Z = W_Q @ W_K.T / math.sqrt(2)
    S0 = X @ Z @ X.mT
    ctx = strategies.StepContext(X=X, G=G, mask=None, loss=loss, Z=Z, S0=S0, loss0=float(loss(S0)),
                                 scale=1 / math.sqrt(2), new_scale=1 / math.sqrt(2))
    path = s.path_statistics(ctx, stats)
    assert path is stats  # the refit's statistics: every sample's
    prob = strategies.build_search_problem(s, path, ctx, 4, penalise=False)
    assert prob is not None and math.isfinite(prob.slope0)


def test_statistics_pickle_and_copy_without_their_last_batchs_identity():
    """Weak references do not pickle: the copy finds its last batch by fingerprint, and grows as the original."""
    import copy
    import pickle

    X, G, W_Q, W_K, _, loss = problem()
    s = strategies.make(HOLDOUT)
    stats = s.new_statistics().update(X * 1.1, G).update(X, G)
    for other in (pickle.loads(pickle.dumps(stats)), copy.deepcopy(stats)):
        assert stats.is_last(X, G) and not other.is_last(X, G) and other.batch_index(X) == 1
        a = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=stats)
        b = s.grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, stats=other)
        # The original's growth reads Σ XᵀGX from its statistics (the sum of the halves' products); the copy's,
        # which does not know the batch as its last one, forms it in one product: the same numbers to rounding
        # (bit for bit on an AVX-512 host, not on an AVX2 one, whose kernels sum in another order).
        assert a.lam == pytest.approx(b.lam, rel=1e-12) and torch.allclose(a.W_Q, b.W_Q, rtol=1e-10, atol=0)
        assert a.first_order_decrease == pytest.approx(b.first_order_decrease, rel=1e-12)


def test_the_reports_breakdown_states_the_defaults_profile_per_dataset():
    """harness/report/figures/timing.py: one statement per dataset and width, sections largest first in multiples
    of the run's floor (medians over seeds), the loss calls and host reads."""
    import pandas as pd

    from growbench.harness.report.figures.timing import profile_details

    rows = []
    for seed, scale in ((0, 1.0), (1, 3.0)):
        for section, ms in (("loss calls", 40.0), ("statistics", 10.0), ("score change", 20.0), ("finish", 0.01)):
            rows.append({"dataset": "teacher", "d_e": 64, "strategy": "S", "seed": seed, "section": section,
                         "ms": ms * scale, "x_floor": ms * scale / 20.0, "total_ms": 70.0 * scale,
                         "floor_ms": 20.0, "loss_calls": 4, "host_syncs": 20})
    (line,) = profile_details(pd.DataFrame(rows))
    assert line.startswith("default on teacher (d_e 64, S): one growth")
    assert "= 7× its floor" in line  # median total 140 ms over a 20 ms floor
    assert line.index("loss calls 4×") < line.index("score change 2×") < line.index("statistics 1×")
    assert "finish" not in line  # below half a percent of the floor
    assert "4 loss calls, 20 host reads" in line and "median of 2 seeds" in line
