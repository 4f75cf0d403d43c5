"""A growth handed the loss at the current scores (``grow(..., loss_before=)``), as a training loop has it (the
forward that gave ``G``, or the last head's growth on the same batch): the same step as evaluating it, one loss
call fewer, a mistaken value refused by name before any call; and the training loop hands every head the loss
its growth would have evaluated."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import Counted, anisotropic_X, attention_loss, causal, factors, grad_of, scores

from growbench import strategies
from growbench.datasets.registry import make_dataset
from growbench.harness.capture import capture
from growbench.harness.train import grow_heads, growth_batches
from growbench.models.block import GrowableAttention

SPECS = ["default", "gram/ridge/full+metric/normal+holdout+shrink:bracket", "gram/solve/full+metric/fast:quadratic",
         "gram/ridge/rsvd+metric/normal+holdout:bracket", "random", "zero"]


def _problem():
    mask = causal(7)
    X = anisotropic_X(8, 7, 5, cond=1e2, seed=3)
    W_Q, W_K = factors(5, 2, seed=4)
    c = 1 / math.sqrt(2)
    loss = attention_loss(8, 7, seed=5, mask=mask)
    return X, grad_of(loss, scores(X, c * W_Q @ W_K.T)), W_Q, W_K, c, loss, mask


def _same_step(a: strategies.GrowthResult, b: strategies.GrowthResult) -> None:
    assert a.lam == b.lam and a.loss_before == b.loss_before and a.loss_after == b.loss_after
    assert torch.equal(a.W_Q, b.W_Q) and torch.equal(a.W_K, b.W_K)


@pytest.mark.parametrize("spec", SPECS)
def test_the_step_with_the_loss_given_is_the_step_that_evaluates_it_with_one_call_fewer(spec):
    X, G, W_Q, W_K, c, loss, mask = _problem()
    grow = strategies.make(spec).grow
    counted = Counted(loss)
    evaluated = grow(W_Q, W_K, X, G, p=2, loss_of_scores=counted, scale=c, mask=mask)
    calls = counted.calls
    at_current = float(loss(strategies.current_scores(X, W_Q, W_K, c)))
    given = grow(W_Q, W_K, X, G, p=2, loss_of_scores=counted, scale=c, mask=mask,
                 loss_before=torch.tensor(at_current, dtype=X.dtype))
    _same_step(given, evaluated)
    assert counted.calls - calls == calls - 1 and given.n_loss_evals == evaluated.n_loss_evals - 1
    assert given.info["loss_before"] == "given" and "loss_before" not in evaluated.info
    if spec in SPECS[:4]:
        assert evaluated.lam > 0  # a step taken: the search compared its trials with the given loss


def _split_site(n_batches: int):
    """A block's head 0 and its ``HeadLoss`` (an AttentionSplit loss) on the last of ``n_batches`` batches."""
    student = GrowableAttention(d_e=6, d_k=2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    teacher = GrowableAttention(d_e=6, d_k=4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    strategy = strategies.make("gram/ridge/full+metric/normal+holdout+shrink:bracket")
    stats = strategy.new_statistics()
    for i in range(n_batches):
        X = torch.randn(32, 9, 6, generator=torch.Generator().manual_seed(10 + i), dtype=torch.float64)
        with torch.no_grad():
            target = teacher(X)

        def rest(Y: torch.Tensor, target: torch.Tensor = target) -> torch.Tensor:
            return ((Y - target) ** 2).mean()

        with student.capture():
            rest(student(X)).backward()
        cap = student.captured(0)
        stats.update(cap.Xa, cap.G, cap.mask)
    W_Q, W_K = student.factors(0)
    loss = student.loss_of_scores(rest, 0)
    args = dict(p=2, loss_of_scores=loss, scale=student.scale(0), mask=cap.mask, stats=stats)
    return strategy, (W_Q, W_K, cap.Xa, cap.G), args, float(loss(cap.S))


@pytest.mark.parametrize("n_batches", [1, 2])
def test_a_split_loss_evaluates_it_only_where_the_search_on_half_a_batch_needs_its_output(n_batches):
    strategy, inputs, args, at_current = _split_site(n_batches)
    evaluated = strategy.grow(*inputs, **args)
    given = strategy.grow(*inputs, **args, loss_before=at_current)
    _same_step(given, evaluated)
    assert evaluated.lam > 0
    if n_batches == 1:  # the held-out half's trials keep the fitted half's output from the current scores
        assert given.n_loss_evals == evaluated.n_loss_evals
        assert given.info["loss_before"].startswith("given, not used")
    else:
        assert given.n_loss_evals == evaluated.n_loss_evals - 1 and given.info["loss_before"] == "given"


@pytest.mark.parametrize("mistake, message", [
    (math.nan, "loss_before is nan"),
    (-math.inf, "loss_before is -inf"),
    (torch.tensor(math.inf), "loss_before is inf"),
    ("0.5", "must be the loss at the current scores, a number"),
    ([0.5], "must be the loss at the current scores, a number"),
    (True, "must be the loss at the current scores, a number"),
    (torch.tensor([0.5, 0.5]), r"one real number, got a torch.float32 tensor of shape \(2,\)"),
    (torch.tensor(1), "one real number, got a torch.int64 tensor"),
    (torch.tensor(1 + 1j), "one real number, got a torch.complex64 tensor"),
])
def test_a_mistaken_loss_before_is_refused_by_name_before_any_loss_call(mistake, message):
    X, G, W_Q, W_K, c, loss, mask = _problem()
    counted = Counted(loss)
    with pytest.raises(ValueError, match=message):
        strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=counted, scale=c, mask=mask,
                                        loss_before=mistake)
    assert counted.calls == 0


class _Recording:
    """A strategy that records, at each growth, the loss it is handed and the loss at the current scores."""

    def __init__(self, spec: str) -> None:
        self.strategy = strategies.make(spec)
        self.spec = self.strategy.spec
        self.seen: list[tuple[float | None, float]] = []

    def new_statistics(self):
        return self.strategy.new_statistics()

    def grow(self, W_Q, W_K, X, G, p, loss_of_scores, scale, new_scale, mask, stats, loss_before=None):
        with torch.no_grad():
            at_current = float(loss_of_scores(strategies.current_scores(X, W_Q, W_K, scale)))
        self.seen.append((loss_before, at_current))
        return self.strategy.grow(W_Q, W_K, X, G, p=p, loss_of_scores=loss_of_scores, scale=scale,
                                  new_scale=new_scale, mask=mask, stats=stats, loss_before=loss_before)


@pytest.mark.parametrize("spec", ["default", "random"])
def test_training_hands_each_head_the_loss_at_its_current_scores(spec):
    """The capture's loss to the first head, each grown head's ``loss_after`` to the next: the loss each growth
    would have evaluated, for one loss call fewer per head and the same steps."""
    runs = []
    for hand_over in (True, False):
        ds = make_dataset("teacher", 8, 8, 0)
        model = ds.build_model(2, n_heads=3, dtype=torch.float64)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(20):
            opt.zero_grad()
            model.loss(*ds.batch(8, "train", step)).backward()
            opt.step()
        caps, rest, loss = capture(model, ds, 8, growth_batches(20, 2), "cpu")
        recording, grown = _Recording(spec), {0: 2, 2: 1, 1: 2}
        if hand_over:
            events = grow_heads(model, recording, opt, caps, rest, grown, "pad", loss_before=loss)
        else:  # one head at a time: each growth evaluates its own
            events = [e for h, p in grown.items() for e in grow_heads(model, recording, opt, caps, rest, {h: p}, "pad")]
        runs.append((recording.seen, events))
    (seen, events), (seen_without, events_without) = runs
    # The capture's forward adds the block's terms in its own order, and a grown head's loss_after is at its factors
    # as returned, the next head's loss at them as installed (rotated by align_to_old): the same to rounding.
    assert [given for given, _ in seen] == pytest.approx([at_current for _, at_current in seen], rel=1e-13)
    assert [given for given, _ in seen_without] == [None] * 3
    assert [at for _, at in seen_without] == pytest.approx([at for _, at in seen], rel=1e-13)
    assert [e["n_loss_evals"] for e in events] == [e["n_loss_evals"] - 1 for e in events_without]
    assert [e["lam"] for e in events] == pytest.approx([e["lam"] for e in events_without], rel=1e-9)
    assert [e["loss_after"] for e in events] == pytest.approx([e["loss_after"] for e in events_without], rel=1e-13)
    if spec == "default":
        assert all(e["lam"] > 0 for e in events)


def test_a_site_passes_the_captured_forwards_loss_through():
    """``site.grow(..., loss_before=)``: the loss of the captured forward (on this problem equal to the growth's
    own, so the same step bit for bit), one call fewer; a strategy that cannot take it is refused by name."""
    results = []
    for loss_before in (None, "forward"):
        block = GrowableAttention(d_e=6, d_k=2, n_heads=2, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(3))
        strategy = strategies.make("default")
        stats = strategy.new_statistics()
        for batch in range(2):  # λ on a whole batch the direction did not see: no output kept from the call
            X = torch.randn(16, 9, 6, generator=torch.Generator().manual_seed(4 + batch), dtype=torch.float64)
            target = torch.randn(16, 9, 6, generator=torch.Generator().manual_seed(6 + batch), dtype=torch.float64)

            def rest(Y: torch.Tensor, target: torch.Tensor = target) -> torch.Tensor:
                return ((Y - target) ** 2).mean()

            with block.capture():
                loss = rest(block(X))
                loss.backward()
            stats.update(block.captured(1).Xa, block.captured(1).G, block.captured(1).mask)
        results.append(block.grow(1, strategy, 2, rest, stats=stats,
                                  loss_before=None if loss_before is None else loss.detach()))
    evaluated, given = results
    _same_step(given, evaluated)
    assert given.n_loss_evals == evaluated.n_loss_evals - 1 and evaluated.lam > 0

    class Older:
        def grow(self, W_Q, W_K, X, G, p, loss_of_scores, scale, new_scale, mask, stats):
            raise AssertionError("not to be called")

    with pytest.raises(ValueError, match="loss_before: Older.grow does not take it"):
        block.grow(0, Older(), 2, rest, loss_before=1.0)


def test_a_loss_still_in_its_graph_is_read_without_a_warning():
    """A training loop's loss tensor, backward already taken or not: its value, and no autograd warning."""
    X, G, W_Q, W_K, c, loss, mask = _problem()
    S = strategies.current_scores(X, W_Q, W_K, c).requires_grad_(True)
    in_graph = loss(S)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = strategies.make("default").grow(W_Q, W_K, X, G, p=2, loss_of_scores=loss, scale=c, mask=mask,
                                            loss_before=in_graph)
    assert r.loss_before == float(in_graph.detach()) and r.info["loss_before"] == "given"
