"""Measure one growth: statistics over ``n`` batches, direction, truncation, line search.

Quality (docs/mathematics.md §7) is measured once (a growth is deterministic); time is the median
of ``repeats`` runs after one warm-up run, per phase. The *floor* is what any strategy
must pay on the same data: the two Gram sums over the batches plus one loss evaluation.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import numpy as np
import torch

import growbench.strategies.cg  # noqa: F401  (strategies.cg below)
from growbench import strategies
from growbench.datasets.registry import Dataset, GrowthModel, make_dataset, trained_model
from growbench.harness.capture import BatchCapture, capture, statistics_over
from growbench.harness.env import KeyedConfig, recorded, require_device
from growbench.harness.locks import work_lock
from growbench.harness.memory import peak_memory
from growbench.harness.reference import load_reference, reference_key, reference_path, save_reference
from growbench.harness.validate import check_run_config
from growbench.strategies import metrics
from growbench.strategies.timing import timed

# Batches for statistics are drawn far from the warm-up's indices (0..warmup_steps-1).
STATS_INDEX_OFFSET = 1_000_000
PHASES = ("statistics", "direction", "truncation", "line_search", "total")
#: Test batches whose losses make a run's held-out measure (docs/mathematics.md §7.2): their mean is the
#: held-out loss, and their spread gives the held-out decrease its standard error.
HELDOUT_BATCHES = 16


@dataclass(frozen=True)
class RunConfig(KeyedConfig):
    """One point of a sweep."""

    strategy: str
    dataset: str
    d_s: int
    d_e: int
    b: int
    d_k: int
    p: int
    seed: int = 0
    device: str = "cpu"
    n_batches: int = 4
    repeats: int = 3
    warmup_steps: int = 100
    dtype: str = "float32"
    scale_policy: str = "rescale"
    heldout_batches: int = HELDOUT_BATCHES

    def __post_init__(self) -> None:
        """Refuse a configuration that cannot run (:func:`harness.validate.check_run_config`).

        Raises
        ------
        harness.validate.ConfigError
            A ``ValueError`` naming the field at fault.
        """
        check_run_config(self)


def _stack_mask(mask, n: int, b: int):
    """A per-sample mask for ``n`` stacked batches (the block's mask is shared by all)."""
    return None if mask is None else mask.expand(n * b, -1, -1)


def search_problem(strategy, stats, X, G, mask, W_Q, W_K, scale: float, rank: int,
                   loss_of_scores) -> strategies.SearchProblem | None:
    """The problem along the path ``grow``'s step moves on, at the current factors: the line search's, or for a
    ``+holdout`` strategy, which refits, the direction of every sample on the whole batch."""
    with torch.no_grad():
        Z = scale * W_Q @ W_K.mT
        S0 = X @ Z @ X.mT
        ctx = strategies.StepContext(X=X, G=G, mask=mask, loss=loss_of_scores, Z=Z, S0=S0,
                                     loss0=float(loss_of_scores(S0)), scale=scale, new_scale=scale)
        path = strategy.path_statistics(ctx, stats)
        return strategies.build_search_problem(strategy, path, ctx, rank, penalise=ctx.refit_stats is None)


def loss_along_lambda(prob: strategies.SearchProblem | None, lam_max: float, n: int = 25) -> dict:
    """The actual loss along λ on the fast and on the normal path, and the first-order tangent.

    For the report's "loss along λ" figure: ``fast`` is ``L(S − λ X P̂ Xᵀ)``, ``normal``
    is ``L(X T(Z − λP̂) Xᵀ)`` with the strategy's own truncation; ``slope`` is
    ``−⟨G, X P̂ Xᵀ⟩``, so the tangent is ``loss0 + slope · λ``.
    """
    if prob is None:
        return {}
    lams = [lam_max * i / (n - 1) for i in range(n)]
    with torch.no_grad():
        fast = [float(prob.loss(torch.add(prob.S0, prob.direction_scores(), alpha=-lam))) for lam in lams]
        normal = [float(prob.loss(truncated_path(prob, lam))) for lam in lams]
    return {"lam": lams, "fast": fast, "normal": normal, "loss0": prob.loss0, "slope": prob.slope0}


def truncated_path(prob: strategies.SearchProblem, lam: float) -> torch.Tensor:
    """Scores of the truncated step ``X T_r(Z − λP̂) Xᵀ``, ``(b, d_s, d_s)``."""
    return strategies.truncated_scores(prob.X, *prob.step_factors(lam))


#: Points and span (in RMS logits per entry) of the dense scan behind path efficiency.
SCAN_POINTS, SCAN_SPAN = 40, (1e-3, 1e2)
#: The scan's points on a dataset whose loss call is costly (``Dataset.costly_loss``): three per decade.
COARSE_SCAN_POINTS = 16


def path_efficiency(prob: strategies.SearchProblem | None, decrease: float, lam: float,
                    points: int = SCAN_POINTS) -> dict:
    """The step's batch decrease as a share of the best one a dense scan finds along the same truncated path.

    The scan has ``points`` log-spaced λ over ``SCAN_SPAN`` RMS logits per entry,
    widened to ``4 λ`` when the step went further. Returns ``path_efficiency`` (NaN when
    no λ decreases the loss), ``scan_decrease`` and ``scan_lam``, the scan's best λ.
    """
    if prob is None:
        return {"path_efficiency": math.nan, "scan_decrease": 0.0, "scan_lam": 0.0}
    lo, hi = SCAN_SPAN[0] * prob.lam_unit, max(SCAN_SPAN[1] * prob.lam_unit, 4 * lam)
    lams = np.geomspace(lo, hi, points)
    with torch.no_grad():
        losses = [float(prob.loss(truncated_path(prob, float(x)))) for x in lams]
    losses = [v if math.isfinite(v) else math.inf for v in losses]
    i = int(np.argmin(losses))
    best = prob.loss0 - losses[i]
    return {"path_efficiency": decrease / best if best > 0 else math.nan, "scan_decrease": max(best, 0.0),
            "scan_lam": float(lams[i]) if best > 0 else 0.0}


def reference_projection(G, X, mask, cache_dir: str | None) -> tuple[torch.Tensor, strategies.cg.CGInfo]:
    """:func:`strategies.metrics.projection` of the captured data, solved once per data set.

    Every strategy of a configuration sees the same captures, and the solve can take
    half a minute on real inputs (thousands of CG iterations), so it is memoised in the
    process and, when ``cache_dir`` is set, on disk (:mod:`harness.reference`: keyed by the
    data and the definition, checksummed and checked on load, written atomically; the
    cache directory is trusted, like pip's cache).
    """
    key = reference_key(G, X, mask)
    if key in _REFERENCES:
        return _REFERENCES[key]
    path = reference_path(cache_dir, key) if cache_dir is not None else None
    ref = load_reference(path, key, G, mask) if path is not None else None
    if ref is None:
        ref = metrics.projection(G, X, mask)
        if path is not None:
            save_reference(path, key, ref)
    _REFERENCES.clear()  # one data set at a time: a sweep runs a configuration's strategies together
    _REFERENCES[key] = ref
    return ref


_REFERENCES: dict[str, tuple] = {}


def formula_gap(caps: list[BatchCapture]) -> dict:
    """Formula 2 (gram/pinv) against formula 1 (per-sample/pinv) on the same batches.

    ``rel_diff = ‖P₂ − P₁‖_F / ‖P₁‖_F`` and the cosine of their score changes
    ``X P Xᵀ`` (docs/mathematics.md §3.1, §7.8: the two converge as ``d_s / d_e`` grows).
    """
    P1, P2 = (s.direction(statistics_over(s, caps)).double() for s in map(strategies.make, ("formula1", "formula2")))
    X = torch.cat([c.X for c in caps]).double()
    S1, S2 = X @ P1 @ X.mT, X @ P2 @ X.mT
    return {
        "rel_diff": float(torch.linalg.matrix_norm(P2 - P1) / torch.linalg.matrix_norm(P1)),
        "score_cosine": float((S1 * S2).sum() / (torch.linalg.vector_norm(S1) * torch.linalg.vector_norm(S2))),
    }


@dataclass(frozen=True)
class GrowthSite:
    """Head 0 of a trained model, captured on a run's statistics batches: what each growth of the run starts from.

    Attributes
    ----------
    batches : list of BatchCapture
        The captured statistics batches.
    loss_of_scores : Callable[[Tensor], Tensor]
        The loss of head 0's scores ``(b, d_s, d_s)`` on the last batch.
    W_Q, W_K : Tensor, each (d_in, d_k)
        Head 0's factors before the growth.
    scale, new_scale : float
        Its score scale now and after growing by ``p``.
    """

    batches: list[BatchCapture]
    loss_of_scores: Callable[[torch.Tensor], torch.Tensor]
    W_Q: torch.Tensor
    W_K: torch.Tensor
    scale: float
    new_scale: float

    @property
    def last(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(X, G, mask)`` of head 0 on the last batch, the one the line search evaluates."""
        X, G, mask = self.batches[-1]
        return X, G[0], mask

    def grow(self, strategy: strategies.Strategy, p: int, scores: torch.Tensor | None = None
             ) -> strategies.GrowthResult:
        """One growth by ``p`` columns, its statistics accumulated (and timed) afresh; ``scores`` are the current
        ones (:meth:`scores_now`) where the caller has them, as a training step's forward pass would."""
        stats = statistics_over(strategy, self.batches)
        X, G, mask = self.last
        return strategy.grow(self.W_Q, self.W_K, X, G, p=p, loss_of_scores=self.loss_of_scores, scale=self.scale,
                             new_scale=self.new_scale, mask=mask, stats=stats, scores=scores)

    def scores_now(self) -> torch.Tensor:
        """Head 0's scores ``(b, d_s, d_s)`` on the last batch at its factors now, as a growth forms them."""
        X, _, _ = self.last
        with torch.no_grad():
            return strategies.current_scores(X, self.W_Q, self.W_K, self.scale)

    def floor(self, S_now: torch.Tensor, device: str) -> tuple[float, float]:
        """Seconds of the plain statistics over the batches and of one loss call at the current scores ``S_now``.

        Only the loss call is timed, not forming ``S_now``: the floor is the least any growth must pay.
        """
        t: dict[str, float] = {}
        base = statistics_over(None, self.batches)
        with timed(t, "loss", device), torch.no_grad():
            self.loss_of_scores(S_now)
        return base.elapsed, t["loss"]


def growth_site(model: GrowthModel, ds: Dataset, cfg: RunConfig) -> GrowthSite:
    """Capture ``cfg.n_batches`` statistics batches of ``model`` and the state of its head 0."""
    block = model.block
    cap = capture(model, ds, cfg.b, range(STATS_INDEX_OFFSET, STATS_INDEX_OFFSET + cfg.n_batches), cfg.device)
    loss_of_scores = block.loss_of_scores(cap.rest, 0)
    W_Q, W_K = block.factors(0)
    return GrowthSite(cap.batches, loss_of_scores, W_Q, W_K, block.scale(0), block.new_scale(0, cfg.p))


def site_of(cfg: RunConfig, cache_dir: str | None = "results/cache") -> GrowthSite:
    """The growth site of a configuration: its (cached) trained model's head 0, captured on its batches."""
    ds, model = _trained(cfg, cache_dir)
    return growth_site(model, ds, cfg)


def step_quality(strategy: strategies.Strategy, site: GrowthSite, cfg: RunConfig,
                 cache_dir: str | None = "results/cache") -> tuple[strategies.GrowthResult, dict]:
    """One growth of ``strategy`` at ``site`` and its quality columns (:func:`strategies.metrics.quality`),
    without the timing repeats, the held-out loss and the λ scan that :func:`measure` adds."""
    r = site.grow(strategy, cfg.p)
    return r, _quality(site, r.dZ, Reference.of(site, cfg.b, cache_dir))


def _trained(cfg: RunConfig, cache_dir: str | None) -> tuple[Dataset, GrowthModel]:
    """The configuration's dataset and its model after the (cached) warm-up; the same objects for the runs of the
    configuration and seed that follow (a growth never changes the model: it grows copies)."""
    require_device(cfg.device)

    def make() -> tuple[Dataset, GrowthModel]:
        ds = make_dataset(cfg.dataset, cfg.d_e, cfg.d_s, cfg.seed).compute_on(cfg.device)
        return ds, trained_model(ds, cfg.d_k, warmup_steps=cfg.warmup_steps, scale_policy=cfg.scale_policy,
                                 cache_dir=cache_dir, dtype=getattr(torch, cfg.dtype), device=cfg.device)

    return _per_configuration(_TRAINED, cfg, make, cache_dir)


def _timed_growths(strategy: strategies.Strategy, site: GrowthSite,
                   cfg: RunConfig) -> tuple[strategies.GrowthResult, dict, dict]:
    """One untimed warm-up growth (its peak memory recorded), then ``cfg.repeats`` timed growths and floors.

    Returns the last growth, every repeat's time per phase, and the timing columns (medians).
    """
    # The floor's loss call and every growth take the current scores as given: the forward pass that gave G made
    # them (in a user's training step as here), so forming them is no growth's work.
    S_now = site.scores_now()
    with peak_memory(cfg.device) as mem:
        r = site.grow(strategy, cfg.p, scores=S_now)
    times = {ph: [] for ph in PHASES}
    floors, loss_evals = [], []
    for _ in range(cfg.repeats):
        r = site.grow(strategy, cfg.p, scores=S_now)
        for ph in PHASES:
            times[ph].append(r.timings.get(ph, 0.0))
        f_stats, f_loss = site.floor(S_now, cfg.device)
        floors.append(f_stats + f_loss)
        loss_evals.append(f_loss)
    columns = {**{f"t_{ph}": median(v) for ph, v in times.items()}, "t_floor": median(floors),
               "t_loss_eval": median(loss_evals), "peak_mem_bytes": mem["peak_bytes"],
               "peak_mem_method": mem["method"]}
    return r, times, columns


def _grown(model: GrowthModel, W_Q: torch.Tensor, W_K: torch.Tensor) -> GrowthModel:
    """A copy of ``model`` with head 0's factors replaced."""
    grown = copy.deepcopy(model)
    grown.block.install(0, W_Q, W_K)
    return grown


@dataclass(frozen=True)
class HeldOut:
    """A run's held-out batches and the model's loss on each of them before the growth.

    Attributes
    ----------
    batches : list of (Tensor, Tensor)
        ``heldout_batches`` test batches ``(inputs, targets)``, on the run's device.
    before : numpy.ndarray, (K,)
        The loss of each batch before the growth.
    tokens : int
        Tokens the losses average over (``K · b · d_s``).
    """

    batches: list[tuple[torch.Tensor, torch.Tensor]]
    before: np.ndarray
    tokens: int

    @classmethod
    def of(cls, model: GrowthModel, ds: Dataset, cfg: RunConfig) -> HeldOut:
        """The first ``cfg.heldout_batches`` test batches of ``ds`` and ``model``'s loss on each.

        Kept for the next run of the same configuration and seed (every strategy of a sweep's configuration
        starts from the same trained model: the strategy is the one field that does not change it).
        """
        def make() -> HeldOut:
            batches = [tuple(t.to(cfg.device) for t in ds.batch(cfg.b, "test", i))
                       for i in range(cfg.heldout_batches)]
            return cls(batches, _losses(model, batches), cfg.heldout_batches * cfg.b * cfg.d_s)

        return _per_configuration(_HELDOUT, cfg, make)

    def decrease(self, model: GrowthModel) -> tuple[float, float, float]:
        """``(loss after, decrease, standard error of the decrease)`` of ``model`` against the loss before.

        The decrease is the mean over batches of ``before_k − after_k``; its standard error is their
        standard deviation over ``√K`` (paired by batch, so the batches' own difficulty cancels).
        """
        after = _losses(model, self.batches)
        diffs = self.before - after
        se = float(diffs.std(ddof=1) / math.sqrt(len(diffs))) if len(diffs) > 1 else math.nan
        return float(after.mean()), float(diffs.mean()), se


_HELDOUT: dict[tuple, HeldOut] = {}
_TRAINED: dict[tuple, tuple] = {}


def _per_configuration(memo: dict, cfg: RunConfig, make: Callable, *also: object):
    """``make()``, kept in ``memo`` for the runs of ``cfg``'s configuration and seed that follow: every strategy of
    a sweep's configuration starts from the same trained model, the strategy being the one field that does not
    change it (``also``: anything else the result depends on). One configuration at a time, as a sweep orders its
    runs."""
    key = (*((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name != "strategy"), *also)
    if key not in memo:
        memo.clear()
        memo[key] = make()
    return memo[key]


def _losses(model: GrowthModel, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> np.ndarray:
    with torch.no_grad():
        return np.array([float(model.loss(*batch)) for batch in batches])


def _along_the_path(strategy: strategies.GrowthStrategy, site: GrowthSite, r: strategies.GrowthResult,
                    model: GrowthModel, heldout: HeldOut, rank: int, curve: bool,
                    coarse: bool = False) -> tuple[dict, dict]:
    """The step against its own truncated path: path efficiency, held-out decrease at the scan's best λ, and (with
    ``curve``) the loss along λ for the report's figure, which draws one seed. With ``coarse``, the scan has
    :data:`COARSE_SCAN_POINTS` points.

    Returns the scan's result columns and its entries of ``extra``.
    """
    X, G, mask = site.last
    prob = search_problem(strategy, statistics_over(strategy, site.batches), X, G, mask, site.W_Q, site.W_K,
                          site.scale, rank, site.loss_of_scores)
    extra = {"lambda_curve": loss_along_lambda(prob, lam_max=2.5 * r.lam if r.lam > 0 else 1.0)} if curve else {}
    found = path_efficiency(prob, r.loss_before - r.loss_after, r.lam, COARSE_SCAN_POINTS if coarse else SCAN_POINTS)
    scan = {"path_efficiency": found["path_efficiency"], "scan_decrease": found["scan_decrease"],
            "heldout_decrease_at_scan_best": math.nan}
    extra["scan_lam"] = found["scan_lam"]
    if found["scan_lam"] > 0:
        with torch.no_grad():
            U, s, V = prob.step_factors(found["scan_lam"])
            root = s.clamp_min(0).sqrt() / math.sqrt(site.new_scale)
        scan["heldout_decrease_at_scan_best"] = heldout.decrease(_grown(model, U * root, V * root))[1]
    if r.spec == strategies.canonical("formula2"):
        extra["formula_gap"] = formula_gap(site.batches)
    return scan, extra


@dataclass
class Reference:
    """Head 0's data over every captured batch, stacked, and its reference projection: what a step is scored on."""

    G: torch.Tensor
    X: torch.Tensor
    mask: torch.Tensor | None
    projection: tuple[torch.Tensor, strategies.cg.CGInfo]

    @classmethod
    def of(cls, site: GrowthSite, b: int, cache_dir: str | None) -> Reference:
        """The stacked captures of ``site`` and their projection (:func:`reference_projection`)."""
        X = torch.cat([c.X for c in site.batches])
        G = torch.cat([c.G[0] for c in site.batches])
        mask = _stack_mask(site.last[2], len(site.batches), b)
        return cls(G, X, mask, reference_projection(G, X, mask, cache_dir))


def _quality(site: GrowthSite, dZ: torch.Tensor, ref: Reference) -> dict:
    """:func:`strategies.metrics.quality` of ``dZ`` over every captured batch: the direction was fit to all of them."""
    Z = site.scale * site.W_Q @ site.W_K.mT
    return metrics.quality(ref.G, ref.X, dZ, ref.mask, ref.projection, Z=Z)


def site_key(cfg: RunConfig) -> dict:
    """What a configuration's site is (the configuration but its strategy and repeats): every run of a site shares
    its trained model, captures and reference projection."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("strategy", "repeats")}


def site_lock_path(cfg: RunConfig, cache_dir: str) -> Path:
    """The lock file of ``cfg``'s site in ``cache_dir`` (see :func:`_site_lock`)."""
    digest = hashlib.sha256(json.dumps(site_key(cfg), sort_keys=True).encode()).hexdigest()[:32]
    return Path(cache_dir) / f"site-{digest}.lock"


@contextlib.contextmanager
def _site_lock(cfg: RunConfig, cache_dir: str | None) -> Iterator[None]:
    """Hold, across worker processes, the lock of ``cfg``'s site (:func:`site_key`) while its model is trained and
    its reference projection solved.

    The first run of a site pays for both and leaves them in the caches; another worker that starts the same site
    meanwhile waits and reads them, instead of paying again (on the real model's contrastive task, 115 s of a
    first run against 25 s of a later one, two workers on a busy 2-core machine). Without a cache folder, or one
    that cannot hold the lock file, runs go on unlocked: the lock saves time, it decides nothing. For the same
    reason a waiter never waits for ever: it says what it waits for, and goes on without a holder that is stuck
    (:func:`harness.locks.work_lock`).
    """
    if cache_dir is not None:
        with contextlib.suppress(OSError):
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
        what = f"its holder is building the model of {cfg.dataset}, seed {cfg.seed}, d_e {cfg.d_e}, for every run of it"
        with work_lock(site_lock_path(cfg, cache_dir), what):
            yield
        return
    yield


def measure(cfg: RunConfig, cache_dir: str | None = "results/cache") -> dict:
    """Run one configuration; return its result columns (raises on failure)."""
    strategy = strategies.make(cfg.strategy)
    with _site_lock(cfg, cache_dir):
        ds, model = _trained(cfg, cache_dir)
        site = growth_site(model, ds, cfg)
        ref = Reference.of(site, cfg.b, cache_dir)
    r, times, timing = _timed_growths(strategy, site, cfg)
    heldout = HeldOut.of(model, ds, cfg)
    heldout_after, heldout_decrease, heldout_se = heldout.decrease(_grown(model, r.W_Q, r.W_K))
    extra = {"info": r.info, "times": times, "spec": r.spec, "dataset": ds.description,
             "dataset_options": ds.options()}
    if hasattr(ds, "reference_losses"):  # known optima of the dataset, on the held-out batch
        extra["references"] = ds.reference_losses(model, *heldout.batches[0], cfg.d_k + cfg.p)
    scan = {"path_efficiency": math.nan, "scan_decrease": math.nan, "heldout_decrease_at_scan_best": math.nan}
    if isinstance(strategy, strategies.GrowthStrategy):
        # On a dataset whose loss call reruns a large model, the λ curve (50 calls) is left out and the scan is
        # coarser: they are diagnostics, and there they cost more than the growth, the held-out measure and the
        # captures together.
        coarse = ds.costly_loss
        scan, scan_extra = _along_the_path(strategy, site, r, model, heldout, cfg.d_k + cfg.p,
                                           curve=cfg.seed == 0 and not coarse, coarse=coarse)
        extra.update(scan_extra)
    return {
        **_quality(site, r.dZ, ref),
        "loss_before": r.loss_before,
        "loss_after": r.loss_after,
        "loss_decrease": r.loss_before - r.loss_after,
        "heldout_before": float(heldout.before.mean()),
        "heldout_after": heldout_after,
        "heldout_decrease": heldout_decrease,
        "heldout_decrease_se": heldout_se,
        "heldout_tokens": heldout.tokens,
        "statistics_tokens": int(r.info.get("statistics_tokens", 0)),
        "lam": r.lam,
        "n_loss_evals": r.n_loss_evals,
        "fallback": "; ".join(r.fallback),
        **timing,
        **scan,
        "host_syncs": int(r.info.get("host_syncs", 0)),
        "extra": extra,
    }


def run_one(config: dict, cache_dir: str | None = "results/cache", threads: int | None = None) -> dict:
    """Measure one configuration in a worker; never raises: a failure becomes a ``failed`` row."""
    cfg = RunConfig(**config)
    return recorded(cfg, lambda: measure(cfg, cache_dir), threads)
