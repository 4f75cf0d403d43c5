"""A loss that offers its attention apart (strategies.scores_loss.AttentionSplit, models.block.HeadLoss): a
``+holdout`` search on one batch recomputes only the held-out samples' attention, and steps exactly as it does
through the plain loss. One that also takes scores as factors (FactoredAttention) forms a trial's scores a few
samples at a time: the same numbers, bit for bit."""

from __future__ import annotations

import pytest
import torch

from growbench import strategies
from growbench.models import block as block_module
from growbench.models.block import GrowableAttention
from growbench.strategies.growth import HELD_OUT_HALF
from growbench.strategies.scores_loss import AttentionSplit, CountedLoss, FactoredAttention

DT = torch.float64
SPEC = "gram/ridge/full+metric/normal+holdout+shrink:bracket"


def _site(causal: bool, seed: int = 0, b: int = 32, d_s: int = 9, d_e: int = 6, dtype: torch.dtype = DT,
          n_heads: int = 1):
    """A student block's head 0, its captured batch and its loss, pulled towards a wider teacher's output: every
    half of the batch sees the same teacher, so a direction fitted to one half lowers the other's loss."""
    def block(d_k: int, s: int) -> GrowableAttention:
        return GrowableAttention(d_e=d_e, d_k=d_k, causal=causal, n_heads=n_heads, dtype=dtype,
                                 generator=torch.Generator().manual_seed(s))

    X = torch.randn(b, d_s, d_e, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    with torch.no_grad():
        target = block(4, seed + 2)(X)
    student = block(2, seed + 3)

    def rest(Y: torch.Tensor) -> torch.Tensor:
        return ((Y - target) ** 2).mean()

    with student.capture():
        rest(student(X)).backward()
    cap = student.captured(0)
    W_Q, W_K = student.factors(0)
    return cap, W_Q, W_K, student.scale(0), student.loss_of_scores(rest, 0)


@pytest.mark.parametrize("causal", [False, True])
def test_the_held_out_search_attends_to_the_held_out_half_alone_and_steps_as_through_the_plain_loss(causal):
    cap, W_Q, W_K, c, fn = _site(causal)
    assert isinstance(fn, AttentionSplit) and not isinstance(lambda S: fn(S), AttentionSplit)
    attended = []
    attend, attend_factors = fn.attend, fn.attend_factors
    fn.attend = lambda S, samples: attended.append(samples) or attend(S, samples)
    fn.attend_factors = lambda L, R, samples: attended.append(samples) or attend_factors(L, R, samples)
    grow = strategies.make(SPEC).grow
    split = grow(W_Q, W_K, cap.X, cap.G, p=2, loss_of_scores=fn, scale=c, mask=cap.mask)
    n_split = len(attended)
    plain = grow(W_Q, W_K, cap.X, cap.G, p=2, loss_of_scores=lambda S: fn(S), scale=c, mask=cap.mask)
    assert all(s == slice(None) for s in attended[n_split:])  # through the plain loss, every call attends to all
    del attended[n_split:]
    assert split.lam > 0 and split.info["refit"] is True
    # The current scores' loss over every sample, then each trial over the held-out half, then the refit step's loss.
    assert attended[0] == slice(None) and attended[-1] == slice(None)
    trials = attended[1:-1]
    assert len(trials) >= 2 and all(s == HELD_OUT_HALF for s in trials)
    assert split.n_loss_evals == plain.n_loss_evals == len(trials) + 2
    assert split.lam == pytest.approx(plain.lam, rel=1e-12)
    torch.testing.assert_close(split.dZ, plain.dZ, rtol=1e-10, atol=1e-12)
    assert split.loss_after == pytest.approx(plain.loss_after, rel=1e-12)
    assert split.loss_before == pytest.approx(plain.loss_before, rel=1e-14)


def test_the_loss_with_some_samples_moved_is_counted_and_differentiable():
    # CountedLoss.with_samples: the plain loss at the scores with the moved samples written in (autograd's derivative
    # along a direction is the central difference's), one call each.
    cap, _, _, _, fn = _site(causal=True)
    counted = CountedLoss(fn)
    loss0, out0 = counted.attention(cap.S)
    assert float(loss0) == pytest.approx(float(fn(cap.S)), rel=1e-14)
    held = HELD_OUT_HALF
    direction = torch.randn(cap.S[held].shape, generator=torch.Generator().manual_seed(4), dtype=DT)

    def along(t):
        S = cap.S.clone()
        S[held] = cap.S[held] + t * direction
        return fn(S)

    for lam in (0.1, 1.5):
        t = torch.tensor(lam, dtype=DT, requires_grad=True)
        value = counted.with_samples(out0, held, cap.S[held] + t * direction)
        assert float(value.detach()) == pytest.approx(float(along(lam)), rel=1e-13)
        (d,) = torch.autograd.grad(value, t)
        h = 1e-5
        assert float(d) == pytest.approx(float(along(lam + h) - along(lam - h)) / (2 * h), rel=1e-6)
    assert counted.calls == 3


def test_calls_without_autograd_share_one_copy_of_the_output_and_leave_it_unchanged():
    # A search's trials (no autograd) write the moved samples into one copy of the output at S0: each is the
    # plain loss at its scores, whatever came before, and the output handed in is never changed.
    cap, _, _, _, fn = _site(causal=False)
    counted = CountedLoss(fn)
    _, out0 = counted.attention(cap.S)
    before = out0.clone()
    gen = torch.Generator().manual_seed(8)
    for samples in (HELD_OUT_HALF, HELD_OUT_HALF, slice(0, 5), HELD_OUT_HALF):
        moved = cap.S[samples] + torch.randn(cap.S[samples].shape, generator=gen, dtype=DT)
        whole = cap.S.clone()
        whole[samples] = moved
        with torch.no_grad():
            assert float(counted.with_samples(out0, samples, moved)) == pytest.approx(float(fn(whole)), rel=1e-13)
    assert torch.equal(out0, before)


class _SplitOnly:
    """``fn``'s two stages apart, without its scores as factors: an AttentionSplit that is no FactoredAttention."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, S):
        return self.fn(S)

    def attend(self, S, samples):
        return self.fn.attend(S, samples)

    def from_attention(self, out):
        return self.fn.from_attention(out)


@pytest.mark.parametrize("samples", [slice(None), HELD_OUT_HALF, slice(3, 17)])
@pytest.mark.parametrize("causal, n_heads", [(False, 1), (True, 1), (True, 3)])
@pytest.mark.parametrize("group", [3, 0])
def test_attention_at_score_factors_is_attention_at_their_product_bit_for_bit(monkeypatch, samples, causal,
                                                                               n_heads, group):
    # Groups of 3 samples (the last one shorter) or, where one sample's scores exceed the bytes, the whole batch at
    # once; the mask; values with W_O apart (3 heads: d_v = 2) or folded in.
    cap, _, _, _, fn = _site(causal, dtype=torch.float32, d_e=6, n_heads=n_heads)
    assert (fn.W_O is None) == (n_heads == 1)
    monkeypatch.setattr(block_module, "SCORE_CHUNK_BYTES", max(group * 9 * 9 * 4, 1))
    gen = torch.Generator().manual_seed(5)
    n = len(range(32)[samples])
    L, R = (torch.randn(n, 9, 4, generator=gen) for _ in range(2))
    out = fn.attend_factors(L, R, samples)
    assert torch.equal(out, fn.attend(L @ R.mT, samples))
    with pytest.raises(ValueError, match="score factors must have shape"):
        fn.attend_factors(L[1:], R[1:], samples)


def test_the_loss_at_score_factors_is_one_counted_call_and_falls_back_where_it_must():
    cap, _, _, _, fn = _site(causal=True, dtype=torch.float32)
    assert isinstance(fn, FactoredAttention) and not isinstance(_SplitOnly(fn), FactoredAttention)
    gen = torch.Generator().manual_seed(6)
    L, R = (torch.randn(32, 9, 4, generator=gen) for _ in range(2))
    counted = CountedLoss(fn)
    _, out0 = counted.attention(cap.S)
    held = HELD_OUT_HALF
    with torch.no_grad():
        assert torch.equal(counted.at_factors(L, R), fn(L @ R.mT))
        whole = cap.S.clone()
        whole[held] = L[held] @ R[held].mT
        assert torch.equal(counted.with_sample_factors(out0, held, L[held], R[held]), fn(whole))
    assert counted.calls == 3
    # Under autograd (the Newton search's derivatives), and where the scores are cast for the loss, the product is
    # formed and the plain call made: the derivative is the product's, and the cast rounds as it always did.
    t = torch.tensor(1.0, requires_grad=True)
    (d,) = torch.autograd.grad(counted.at_factors(t * L, R), t)
    (d_ref,) = torch.autograd.grad(fn(t * L @ R.mT), t)
    assert torch.equal(d, d_ref) and counted.calls == 4
    cast = CountedLoss(fn, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(cast.at_factors(L.double(), R.double()), fn((L.double() @ R.double().mT).float()).double())


@pytest.mark.parametrize("spec", [SPEC, "gram/solve/full+metric/normal:bracket", "gram/ridge/full/fast:quadratic"])
def test_a_growth_through_score_factors_steps_bit_for_bit_as_through_the_scores(spec):
    # The same search, trials and step whether the loss takes the trials' scores as factors, only apart
    # (AttentionSplit), or as one callable: float32, where a different order of sums would show.
    cap, W_Q, W_K, c, fn = _site(causal=True, dtype=torch.float32, b=48, d_s=12, d_e=8)
    factored = []
    attend_factors = fn.attend_factors
    fn.attend_factors = lambda L, R, samples: factored.append(samples) or attend_factors(L, R, samples)
    grow = strategies.make(spec).grow
    runs = [grow(W_Q, W_K, cap.X, cap.G, p=2, loss_of_scores=loss, scale=c, mask=cap.mask)
            for loss in (fn, _SplitOnly(fn), lambda S: fn(S))]
    assert runs[0].lam > 0 and factored  # the normal path's trials, or the fast path's truncated step
    for other in runs[1:]:
        assert other.lam == runs[0].lam and other.n_loss_evals == runs[0].n_loss_evals
        assert torch.equal(other.W_Q, runs[0].W_Q) and torch.equal(other.W_K, runs[0].W_K)
        assert other.loss_after == runs[0].loss_after and other.loss_before == runs[0].loss_before
