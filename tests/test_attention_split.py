"""A loss that offers its attention apart (strategies.scores_loss.AttentionSplit, models.block.HeadLoss): a
``+holdout`` search on one batch recomputes only the held-out samples' attention, and steps exactly as it does
through the plain loss."""

from __future__ import annotations

import pytest
import torch

from growbench import strategies
from growbench.models.block import GrowableAttention
from growbench.strategies.growth import HELD_OUT_HALF
from growbench.strategies.scores_loss import AttentionSplit, CountedLoss

DT = torch.float64
SPEC = "gram/ridge/full+metric/normal+holdout+shrink:bracket"


def _site(causal: bool, seed: int = 0, b: int = 32, d_s: int = 9, d_e: int = 6):
    """A student block's head 0, its captured batch and its loss, pulled towards a wider teacher's output: every
    half of the batch sees the same teacher, so a direction fitted to one half lowers the other's loss."""
    def block(d_k: int, s: int) -> GrowableAttention:
        return GrowableAttention(d_e=d_e, d_k=d_k, causal=causal, dtype=DT, generator=torch.Generator().manual_seed(s))

    X = torch.randn(b, d_s, d_e, generator=torch.Generator().manual_seed(seed + 1), dtype=DT)
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
    attend = fn.attend
    fn.attend = lambda S, samples: attended.append(samples) or attend(S, samples)
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
