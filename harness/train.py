"""Growth during training: a block trained from a small ``d_k``, grown by ``p`` until ``d_k_max``.

One run (:func:`train_run`) trains a fresh model of a dataset with Adam. Every
``grow_every`` steps (``trigger="schedule"``), or when the factors' own gradient step
follows too little of the reachable functional gradient (``trigger="bottleneck"``),
each head below ``d_k_max`` is grown with the run's method. Methods:

- a growth strategy (spec or preset, e.g. ``default``) or a baseline (``random``,
  ``zero``, ``gradmax``);
- ``fixed-small``: ``d_k0`` throughout; ``fixed-large``: ``d_k_max`` from scratch (on a dataset whose
  ``fixed_large_from_narrowed`` is set, the decoder's: its ``d_k0`` start widened by small random
  columns, :func:`widen_at_random`, so that it starts from the information growth has).

A growth step costs one extra forward/backward on ``stats_batches`` train batches with
capture (not used for an optimiser step), the statistics, the strategy's step and the
optimiser-state surgery of :mod:`harness.optim_state`; all of it is counted in the
run's wall time and FLOPs. FLOPs are counted by :class:`torch.utils.flop_counter.FlopCounterMode`
(matrix products and convolutions; an SVD or an eigendecomposition of ``d_e × d_e`` is
not counted, a negligible share at these sizes): one training step per architecture
(steps of the same architecture cost the same) and every growth in full. Held-out
evaluation and the making of batches (a teacher's or the original model's forward that
computes the targets) are excluded from both, in FLOPs and in wall time.

The real model (``minilm-recovery`` or ``minilm-similarity`` with option ``narrow=layer`` or
``narrow=all``) runs through the same loop: its block is a
:class:`~models.pretrained_heads.PretrainedHeads` whose heads (every head of the chosen
layers, narrowed to the best rank-``d_k0`` factors of their pretrained ``Z``) are the heads
grown; only their query/key factors are trained, by distillation to the original model's
output (``minilm-recovery``) or fine-tuning on its contrastive objective
(``minilm-similarity``). Heads of different layers see different inputs: a growth keeps
each head's own (:func:`harness.capture.capture_heads`) and grows the deepest layer first
(``block.growth_order``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

import torch
from torch.utils.flop_counter import FlopCounterMode

from growbench import strategies
from growbench.datasets.registry import DATASETS, make_dataset, parse_dataset
from growbench.harness.capture import BatchCapture, capture_heads, head_captures, statistics_over
from growbench.harness.env import KeyedConfig, require_device
from growbench.harness.optim_state import OPT_STATE_POLICIES, align_to_old, replace_parameter
from growbench.strategies import metrics
from growbench.strategies.timing import synchronize

FIXED_METHODS = ("fixed-small", "fixed-large")
TRIGGERS = ("schedule", "bottleneck")
HEAD_SPLITS = ("each", "budget")
#: Test batches (indices 0, 1, ...) whose mean loss is the held-out loss.
HELDOUT_BATCHES = 8


@dataclass(frozen=True)
class TrainConfig(KeyedConfig):
    """One training run.

    Attributes
    ----------
    method : str
        Growth strategy (spec or preset), baseline, ``fixed-small`` or ``fixed-large``.
    dataset : str
    d_s, d_e, b : int
        Sequence length, width, batch size.
    d_k0, d_k_max : int
        Starting and final query/key width per head.
    p : int
        Columns added per growth (per head with ``head_split="each"``; in total with ``"budget"``).
    grow_every : int
        Steps between growths (``schedule``), or between checks (``bottleneck``).
    steps : int
        Optimiser steps.
    n_heads : int
        Heads of the synthetic block; 1 on the real model, whose growable heads are chosen
        by the dataset's option ``narrow``.
    head_split : {"each", "budget"}
        ``each``: every head grows by ``p`` from its own statistics; ``budget``: ``p``
        columns in total, each given to the head whose next singular value of its whitened
        direction is largest (largest first-order decrease per column).
    trigger : {"schedule", "bottleneck"}
        ``bottleneck``: grow when the optimality (docs/mathematics.md §7) of the factors' own gradient step
        is below ``threshold``: the layer cannot follow the reachable functional gradient.
    threshold : float
    scale_policy : {"rescale", "fixed", "learnable"}
    opt_state : {"pad", "reset"}
        Adam state of grown parameters (:mod:`harness.optim_state`).
    lr : float
        Adam's learning rate.
    seed : int
    eval_every : int
        Steps between held-out evaluations (curve points).
    stats_batches : int
        Train batches whose statistics make a growth's direction.
    device, dtype : str
    """

    method: str
    dataset: str
    d_s: int
    d_e: int
    b: int
    d_k0: int
    d_k_max: int
    p: int
    grow_every: int
    steps: int
    n_heads: int = 1
    head_split: str = "each"
    trigger: str = "schedule"
    threshold: float = 0.5
    scale_policy: str = "rescale"
    opt_state: str = "pad"
    lr: float = 3e-3
    seed: int = 0
    eval_every: int = 25
    stats_batches: int = 2
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.method not in FIXED_METHODS:
            try:
                strategies.canonical(self.method)
            except ValueError as e:
                raise ValueError(f"unknown training method {self.method!r}: {e}; "
                                 f"or one of {', '.join(FIXED_METHODS)}") from None
        for name, value, valid in (("trigger", self.trigger, TRIGGERS), ("head_split", self.head_split, HEAD_SPLITS),
                                   ("opt_state", self.opt_state, OPT_STATE_POLICIES)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
        if not 1 <= self.d_k0 <= self.d_k_max:
            raise ValueError(f"need 1 <= d_k0 <= d_k_max, got d_k0={self.d_k0}, d_k_max={self.d_k_max}")
        if self.d_k_max > self.d_e:
            raise ValueError(f"d_k_max={self.d_k_max} > d_e={self.d_e}: Z = c W_Q W_Kᵀ has rank at most d_e")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if min(self.p, self.grow_every, self.steps, self.eval_every, self.stats_batches, self.n_heads) < 1:
            raise ValueError("p, grow_every, steps, eval_every, stats_batches and n_heads must be >= 1")

    @property
    def grows(self) -> bool:
        """Whether this run grows at all."""
        return self.method not in FIXED_METHODS


def config_fields() -> list[str]:
    """Names of :class:`TrainConfig`'s fields, in order."""
    return [f.name for f in fields(TrainConfig)]


def tokens_per_step(dataset: str, b: int, d_s: int) -> int:
    """Sequence positions one optimiser step trains on: ``b · d_s``, twice that for text pairs."""
    cls = DATASETS.get(parse_dataset(dataset)[0])
    return b * d_s * (2 if getattr(cls, "pair_inputs", False) else 1)


# ------------------------------------------------------------------------------ growth
#: Train batches a growth captures are drawn from here on, far from the optimiser's (index = step).
GROWTH_INDEX_OFFSET = 10_000_000


def growth_batches(step: int, n: int) -> range:
    """Indices of the ``n`` train batches a growth before ``step`` captures: distinct for every step."""
    start = GROWTH_INDEX_OFFSET + step * n
    return range(start, start + n)


def is_baseline(strategy) -> bool:
    """Whether ``strategy`` is a baseline (random columns, nothing to align); the ``default`` preset and
    every functional-gradient spec are not, whatever class builds them."""
    return strategies.canonical(strategy.spec) in strategies.baseline_names()


def split_budget(strategy, stats: dict[int, object], room: dict[int, int], p: int) -> dict[int, int]:
    """Give ``p`` columns to heads, each to the largest next singular value of a whitened direction.

    With ``W = E[A]^{1/2}``, a head's first-order decrease per unit score change from ``q``
    new columns is about ``sqrt(Σ_{j≤q} σ_j²)`` where ``σ`` are the singular values of
    ``W P W`` (Eckart–Young in the metric of docs/mathematics.md §4), so column ``j`` of head ``h`` is
    worth ``σ_{h,j}²``: the greedy choice of the ``p`` largest over heads is optimal for
    that model. A head gets at most ``room[h]`` columns.
    """
    values = []
    for h, st in stats.items():
        if room[h] <= 0:
            continue
        P = strategy.direction(st).double()
        evals, evecs = torch.linalg.eigh(st.mean_A.double())
        W = (evecs * evals.clamp_min(0).sqrt()) @ evecs.mT
        s = torch.linalg.svdvals(W @ P @ W)
        values += [(float(s[j]), h) for j in range(min(room[h], s.numel()))]
    values.sort(key=lambda t: -t[0])
    out = {h: 0 for h in stats}
    for _, h in values[:p]:
        out[h] += 1
    return out


def grow_heads(model, strategy, opt, caps: list[BatchCapture], rest, p_per_head: dict[int, int], policy: str,
               stats: dict | None = None, loss_before: float | None = None) -> list[dict]:
    """Grow each head by ``p_per_head[h]`` and move the optimiser onto the new parameters.

    Heads are grown one after another; each line search sees the heads grown before it
    (its ``loss_of_scores`` is built after their installation). ``stats`` may hold heads'
    statistics already computed from ``caps``. ``loss_before`` is the model's loss on the last
    captured batch (:attr:`Capture.loss`), None to have the first growth evaluate it; each later
    head is handed the one before's ``loss_after``, the loss of the model as installed on that batch,
    so no growth evaluates what the last one did. Returns one record per grown head.
    """
    block = model.block
    events = []
    for h, p in p_per_head.items():
        if p <= 0:
            continue
        mine = head_captures(caps, h)
        st = (stats or {}).get(h) or statistics_over(strategy, mine, h)
        Xa, Gs, mask = mine[-1]
        W_Q, W_K = block.factors(h)
        scale, new_scale = block.scale(h), block.new_scale(h, p)
        r = strategy.grow(W_Q, W_K, Xa, Gs[h], p=p, loss_of_scores=block.loss_of_scores(rest, h), scale=scale,
                          new_scale=new_scale, mask=mask, stats=st, loss_before=loss_before)
        alpha = math.sqrt(scale / new_scale)
        W_Q2, W_K2 = r.W_Q, r.W_K
        if not is_baseline(strategy) and policy == "pad":
            W_Q2, W_K2 = align_to_old(W_Q2, W_K2, W_Q, W_K, alpha)
        head = block.heads[h]
        old_Q, old_K = head.W_Q, head.W_K
        block.install(h, W_Q2, W_K2)
        # The installed factors compute the returned ones' scores (align_to_old rotates them): the same loss.
        loss_before = r.loss_after if r.loss_after_finite else None
        replace_parameter(opt, old_Q, head.W_Q, policy, alpha)
        replace_parameter(opt, old_K, head.W_K, policy, alpha)
        events.append({"head": h, "p": p, "d_k": block.d_k(h), "lam": r.lam, "loss_before": r.loss_before,
                       "loss_after": r.loss_after, "first_order_decrease": r.first_order_decrease,
                       "n_loss_evals": r.n_loss_evals, "fallback": "; ".join(r.fallback)})
    return events


def factor_gradients(model, caps: list[BatchCapture], head: int):
    """``(∂L/∂W_Q, ∂L/∂W_K)`` of ``head`` on the last captured batch, from its statistics.

    ``S_b = c X_b W_Q W_Kᵀ X_bᵀ`` gives ``∂L/∂W_Q = c M W_K`` and ``∂L/∂W_K = c Mᵀ W_Q``
    with ``M = Σ_b X_bᵀ G_b X_b``.
    """
    block = model.block
    W_Q, W_K = block.factors(head)
    c = block.scale(head)
    M = statistics_over(None, head_captures(caps[-1:], head), head).sum_M
    return c * M @ W_K, c * M.mT @ W_Q


def starved(model, caps: list[BatchCapture], head: int) -> float:
    """Optimality (docs/mathematics.md §7) of the factors' own gradient step for ``head`` on the last captured batch.

    ``dZ = −c (g_Q W_Kᵀ + W_Q g_Kᵀ)`` is the change of ``Z`` a gradient step on ``W_Q, W_K``
    makes to first order (:func:`factor_gradients`). Low optimality means the reachable
    functional gradient is mostly out of the factors' reach: the layer is starved.
    """
    Xa, Gs, mask = head_captures(caps[-1:], head)[0]
    W_Q, W_K = model.block.factors(head)
    c = model.block.scale(head)
    g_Q, g_K = factor_gradients(model, caps, head)
    dZ = -c * (g_Q @ W_K.mT + W_Q @ g_K.mT)
    return metrics.quality(Gs[head], Xa, dZ, mask)["optimality"]


def widen_at_random(block, d_k: int, seed: int) -> None:
    """Widen every head of ``block`` to ``d_k`` with small random columns: fixed-large's start from the narrowed
    heads, with the same information as growth has (each new entry ``0.01 ×`` the RMS entry of its factor, as the
    ``random`` baseline draws them, so the new part of ``Z`` is about ``1e-4`` of the old)."""
    gen = torch.Generator().manual_seed(seed)
    for h in range(block.n_heads):
        W_Q, W_K = block.factors(h)
        new = [torch.randn(W.shape[0], d_k - W.shape[1], generator=gen, dtype=W.dtype).to(W.device)
               * 0.01 * float(W.pow(2).mean().sqrt()) for W in (W_Q, W_K)]
        block.install(h, torch.cat([W_Q, new[0]], 1), torch.cat([W_K, new[1]], 1))


# ------------------------------------------------------------------------------ one run
def _heldout(model, batches) -> float:
    with torch.no_grad():
        return float(sum(float(model.loss(x, y)) for x, y in batches) / len(batches))


def _step_flops(model, inputs, targets) -> float:
    """FLOPs of one training step's forward and backward at the current architecture (Adam's
    element-wise update is not a matrix product and is not counted)."""
    with FlopCounterMode(display=False) as fc:
        model.zero_grad(set_to_none=True)
        model.loss(inputs, targets).backward()
    model.zero_grad(set_to_none=True)
    return float(fc.get_total_flops())


def _architecture(model) -> tuple[int, ...]:
    """``d_k`` of each head: steps of the same architecture cost the same FLOPs."""
    return tuple(model.block.d_k(h) for h in range(model.block.n_heads))


@dataclass
class _Ledger:
    """What a run has spent and seen so far: wall time and FLOPs of training and growth, records, curve."""

    wall: float = 0.0
    growth_wall: float = 0.0
    train_flops: float = 0.0
    growth_flops: float = 0.0
    events: list[dict] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)  # training losses since the last curve point

    def point(self, step: int, model, heldout: list) -> None:
        """A curve point at ``step``; held-out evaluation is not counted in wall time or FLOPs."""
        self.curve.append({"step": step, "wall_s": self.wall, "flops": self.train_flops + self.growth_flops,
                           "train_loss": sum(self.recent) / len(self.recent) if self.recent else math.nan,
                           "heldout_loss": _heldout(model, heldout), "d_k": list(_architecture(model))})
        self.recent.clear()

    def summary(self, model) -> dict:
        """The run's result columns, ``events``, ``checks`` and ``curve`` (see :func:`train_run`)."""
        heldouts = [c["heldout_loss"] for c in self.curve]
        return {
            "final_heldout": heldouts[-1],
            "best_heldout": min(heldouts),
            "final_train": self.curve[-1]["train_loss"],
            "wall_s": self.wall,
            "growth_wall_s": self.growth_wall,
            "train_flops": self.train_flops,
            "growth_flops": self.growth_flops,
            "total_flops": self.train_flops + self.growth_flops,
            "n_growths": len({e["step"] for e in self.events}),
            "final_d_k": list(_architecture(model)),
            "n_params": sum(p.numel() for p in model.parameters()),
            "events": self.events,
            "checks": self.checks,
            "curve": self.curve,
        }


T = TypeVar("T")


def _timed(device: str, work: Callable[..., T], *args) -> tuple[T, float]:
    """``work(*args)`` and its wall seconds, the device synchronised on both sides."""
    synchronize(device)
    t0 = time.perf_counter()
    out = work(*args)
    synchronize(device)
    return out, time.perf_counter() - t0


def _counted_growth(model, ds, strategy, opt, cfg: TrainConfig, step: int, run: _Ledger, heldout: list) -> None:
    """Grow before ``step``, its wall time and every FLOP counted in ``run`` (not the making of its batches,
    as for a training step). Each event also records the model's held-out loss just before and just after the
    growth (not counted either): what the growth itself did to data it has not seen."""
    batches = [ds.batch(cfg.b, "train", i) for i in growth_batches(step, cfg.stats_batches)]
    before = _heldout(model, heldout)
    with FlopCounterMode(display=False) as fc:
        events, dt = _timed(cfg.device, _growth_event, model, batches, strategy, opt, cfg, step, run.checks)
    run.growth_wall += dt
    run.wall += dt
    run.growth_flops += float(fc.get_total_flops())
    after = _heldout(model, heldout)
    run.events += [{**e, "step": step, "heldout_before": before, "heldout_after": after} for e in events]


def _optimiser_step(model, opt, inputs, targets) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = model.loss(inputs, targets)
    loss.backward()
    opt.step()
    return loss


def train_run(cfg: TrainConfig, progress=None) -> dict:
    """Train one configuration; return the run's summary and its curve.

    Returns
    -------
    dict
        Summary columns (``final_heldout``, ``best_heldout``, ``wall_s``, ``train_flops``,
        ``growth_flops``, ``total_flops``, ``n_growths``, ``final_d_k``, ``events``) and
        ``curve``: a list of points ``{step, wall_s, flops, train_loss, heldout_loss, d_k}``.
    """
    device = cfg.device
    require_device(device)
    torch.manual_seed(cfg.seed)
    ds = make_dataset(cfg.dataset, cfg.d_e, cfg.d_s, cfg.seed).compute_on(device)
    widen = cfg.method == "fixed-large" and ds.fixed_large_from_narrowed
    d_k_start = cfg.d_k_max if cfg.method == "fixed-large" and not widen else cfg.d_k0
    model = ds.build_model(d_k_start, n_heads=cfg.n_heads, scale_policy=cfg.scale_policy,
                           dtype=getattr(torch, cfg.dtype), device=device)
    if widen:
        widen_at_random(model.block, cfg.d_k_max, cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    strategy = strategies.make(cfg.method) if cfg.grows else None
    heldout = [tuple(t.to(device) for t in ds.batch(cfg.b, "test", i)) for i in range(HELDOUT_BATCHES)]
    flops_per_step: dict[tuple, float] = {}
    run = _Ledger()
    run.point(0, model, heldout)
    for step in range(1, cfg.steps + 1):
        if cfg.grows and step > 1 and (step - 1) % cfg.grow_every == 0 and min(_architecture(model)) < cfg.d_k_max:
            _counted_growth(model, ds, strategy, opt, cfg, step, run, heldout)
        inputs, targets = (t.to(device) for t in ds.batch(cfg.b, "train", step))
        arch = _architecture(model)
        if arch not in flops_per_step:
            flops_per_step[arch] = _step_flops(model, inputs, targets)
        loss, dt = _timed(device, _optimiser_step, model, opt, inputs, targets)
        run.wall += dt
        run.train_flops += flops_per_step[arch]
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss became {value} at step {step} (d_k={list(arch)})")
        run.recent.append(value)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            run.point(step, model, heldout)
        if progress is not None:
            progress(step)
    return run.summary(model)


def _growth_event(model, batches: list, strategy, opt, cfg: TrainConfig, step: int, checks: list) -> list[dict]:
    """Capture ``batches``, decide (bottleneck trigger), allocate the budget and grow; return the growth records.

    Heads are taken in ``block.growth_order()`` where the block has one (the real model's:
    deepest layer first), else by index.
    """
    caps, rest, loss = capture_heads(model, batches, cfg.device)
    block = model.block
    order = block.growth_order() if hasattr(block, "growth_order") else range(block.n_heads)
    room = {h: cfg.d_k_max - block.d_k(h) for h in order}
    if cfg.trigger == "bottleneck":
        opt_h = {h: starved(model, caps, h) for h in order if room[h] > 0}
        checks.append({"step": step, "optimality": opt_h})
        room = {h: (r if opt_h.get(h, 1.0) < cfg.threshold else 0) for h, r in room.items()}
    if is_baseline(strategy):
        # Baselines draw random columns: a fresh, seeded draw per growth.
        strategy = strategies.make(cfg.method, baseline={"seed": cfg.seed * 100_003 + step})
    stats = None
    if cfg.head_split == "budget":
        stats = {h: statistics_over(strategy, head_captures(caps, h), h) for h in order if room[h] > 0}
        p_per_head = split_budget(strategy, stats, room, cfg.p)
    else:
        p_per_head = {h: min(cfg.p, r) for h, r in room.items()}
    return grow_heads(model, strategy, opt, caps, rest, p_per_head, cfg.opt_state, stats, loss)
