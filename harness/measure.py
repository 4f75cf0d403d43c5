"""Measure one growth: statistics over ``n`` batches, direction, truncation, line search.

Quality (MATH §7) is measured once (a growth is deterministic); time is the median
of ``repeats`` runs after one warm-up run, per phase. The *floor* is what any strategy
must pay on the same data: the two Gram sums over the batches plus one loss evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import statistics as stats_mod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import strategies
import strategies.cg
from harness.env import KeyedConfig, recorded
from harness.memory import peak_memory
from harness.validate import check_run_config
from strategies import metrics
from strategies.timing import timed

# Batches for statistics are drawn far from the warm-up's indices (0..warmup_steps-1).
STATS_INDEX_OFFSET = 1_000_000
PHASES = ("statistics", "direction", "truncation", "line_search", "total")


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

    def __post_init__(self) -> None:
        """Refuse a configuration that cannot run (:func:`harness.validate.check_run_config`).

        Raises
        ------
        harness.validate.ConfigError
            A ``ValueError`` naming the field at fault.
        """
        check_run_config(self)


def _capture(model, ds, cfg: RunConfig, device: str):
    """Forward/backward ``n_batches`` train batches; return captures and the last batch's closure."""
    block = model.block
    caps = []
    for i in range(cfg.n_batches):
        inputs, targets = (t.to(device) for t in ds.batch(cfg.b, "train", STATS_INDEX_OFFSET + i))
        model.zero_grad(set_to_none=True)
        with block.capture():
            model.loss(inputs, targets).backward()
        c = block.captured(0)
        caps.append((c.Xa, c.G, c.mask))
    return caps, block.loss_of_scores(model.rest(targets), 0)


def _stack_mask(mask, n: int, b: int):
    """A per-sample mask for ``n`` stacked batches (the block's mask is shared by all)."""
    return None if mask is None else mask.expand(n * b, -1, -1)


def search_problem(strategy, stats, X, G, mask, W_Q, W_K, scale: float, rank: int,
                   loss_of_scores) -> strategies.SearchProblem | None:
    """The line search's problem of ``strategy`` at the current factors, as ``grow`` builds it."""
    with torch.no_grad():
        Z = scale * W_Q @ W_K.mT
        S0 = X @ Z @ X.mT
        ctx = strategies.StepContext(X=X, G=G, mask=mask, loss=loss_of_scores, Z=Z, S0=S0,
                                     loss0=float(loss_of_scores(S0)), scale=scale, new_scale=scale)
        return strategies.build_search_problem(strategy, stats, ctx, rank)


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
        fast = [float(prob.loss(torch.add(prob.S0, prob.D_hat, alpha=-lam))) for lam in lams]
        normal = [float(prob.loss(truncated_path(prob, lam))) for lam in lams]
    return {"lam": lams, "fast": fast, "normal": normal, "loss0": prob.loss0, "slope": prob.slope0}


def truncated_path(prob: strategies.SearchProblem, lam: float) -> torch.Tensor:
    """Scores of the truncated step ``X T_r(Z − λP̂) Xᵀ``, ``(b, d_s, d_s)``."""
    return strategies.truncated_scores(prob.X, *prob.truncate(prob.Z - lam * prob.P_hat))


#: Points and span (in RMS logits per entry) of the dense scan behind path efficiency.
SCAN_POINTS, SCAN_SPAN = 80, (1e-3, 1e2)


def path_efficiency(prob: strategies.SearchProblem | None, decrease: float, lam: float) -> dict:
    """The step's batch decrease as a share of the best one a dense scan finds along the same truncated path.

    The scan has ``SCAN_POINTS`` log-spaced λ over ``SCAN_SPAN`` RMS logits per entry,
    widened to ``4 λ`` when the step went further. Returns ``path_efficiency`` (NaN when
    no λ decreases the loss), ``scan_decrease`` and ``scan_lam``, the scan's best λ.
    """
    if prob is None:
        return {"path_efficiency": math.nan, "scan_decrease": 0.0, "scan_lam": 0.0}
    lo, hi = SCAN_SPAN[0] * prob.lam_unit, max(SCAN_SPAN[1] * prob.lam_unit, 4 * lam)
    lams = np.geomspace(lo, hi, SCAN_POINTS)
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
    process and, when ``cache_dir`` is set, on disk, keyed by the sha256 of the data.
    """
    h = hashlib.sha256()
    for t in (G, X, mask):
        if t is not None:
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    key = h.hexdigest()[:32]
    if key in _REFERENCES:
        return _REFERENCES[key]
    path = Path(cache_dir) / f"reference-{key}.pt" if cache_dir is not None else None
    ref = None
    if path is not None and path.is_file():
        try:
            blob = torch.load(path, map_location=X.device, weights_only=True)
            ref = (blob["PiG"], strategies.cg.CGInfo(**blob["info"]))
        except Exception:  # noqa: BLE001 - an unreadable cache entry is recomputed
            ref = None
    if ref is None:
        ref = metrics.projection(G, X, mask)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                torch.save({"PiG": ref[0].cpu(), "info": dataclasses.asdict(ref[1])}, tmp)
                os.replace(tmp, path)
            except OSError:
                pass  # an unwritable cache costs time, not correctness
    _REFERENCES.clear()  # one data set at a time: a sweep runs a configuration's strategies together
    _REFERENCES[key] = ref
    return ref


_REFERENCES: dict[str, tuple] = {}


def formula_gap(caps) -> dict:
    """Formula 2 (gram/pinv) against formula 1 (per-sample/pinv) on the same batches.

    ``rel_diff = ‖P₂ − P₁‖_F / ‖P₁‖_F`` and the cosine of their score changes
    ``X P Xᵀ`` (seed 001 reports the two converge as ``d_s / d_e`` grows).
    """
    dirs = []
    for name in ("formula1", "formula2"):
        st = strategies.make(name).new_statistics()
        for Xi, Gi, mi in caps:
            st.update(Xi, Gi, mi)
        dirs.append(strategies.make(name).direction(st).double())
    P1, P2 = dirs
    X = torch.cat([c[0] for c in caps]).double()
    S1, S2 = X @ P1 @ X.mT, X @ P2 @ X.mT
    return {
        "rel_diff": float(torch.linalg.matrix_norm(P2 - P1) / torch.linalg.matrix_norm(P1)),
        "score_cosine": float((S1 * S2).sum() / (torch.linalg.vector_norm(S1) * torch.linalg.vector_norm(S2))),
    }


def measure(cfg: RunConfig, cache_dir: str | None = "results/cache") -> dict:
    """Run one configuration; return its result columns (raises on failure)."""
    from datasets import make_dataset, trained_model

    device = cfg.device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch.cuda.is_available() is False")
    dtype = getattr(torch, cfg.dtype)
    strategy = strategies.make(cfg.strategy)
    ds = make_dataset(cfg.dataset, cfg.d_e, cfg.d_s, cfg.seed)
    model = trained_model(ds, cfg.d_k, warmup_steps=cfg.warmup_steps, scale_policy=cfg.scale_policy,
                          cache_dir=cache_dir, dtype=dtype, device=device)
    block = model.block
    caps, loss_of_scores = _capture(model, ds, cfg, device)
    X, G, mask = caps[-1]
    W_Q, W_K = block.factors(0)
    scale, new_scale = block.scale(0), block.new_scale(0, cfg.p)

    def one_growth():
        stats = strategy.new_statistics()
        for Xi, Gi, mi in caps:
            stats.update(Xi, Gi, mi)
        return strategy.grow(W_Q, W_K, X, G, p=cfg.p, loss_of_scores=loss_of_scores, scale=scale,
                             new_scale=new_scale, mask=mask, stats=stats)

    with torch.no_grad():
        S_now = scale * (X @ W_Q) @ (X @ W_K).mT

    def floor():
        # Only the loss call is timed, not forming S: the floor is the least any growth must pay.
        t: dict[str, float] = {}
        base = strategies.Statistics()
        for Xi, Gi, mi in caps:
            base.update(Xi, Gi, mi)
        with timed(t, "loss", device), torch.no_grad():
            loss_of_scores(S_now)
        return base.elapsed, t["loss"]

    with peak_memory(device) as mem:  # the warm-up run, untimed
        r = one_growth()
    times = {ph: [] for ph in PHASES}
    floors, loss_evals = [], []
    for _ in range(cfg.repeats):
        r = one_growth()
        for ph in PHASES:
            times[ph].append(r.timings.get(ph, 0.0))
        f_stats, f_loss = floor()
        floors.append(f_stats + f_loss)
        loss_evals.append(f_loss)

    # Quality over every captured batch: the direction was fit to all of them.
    Xall = torch.cat([c[0] for c in caps])
    Gall = torch.cat([c[1] for c in caps])
    mall = _stack_mask(mask, len(caps), cfg.b)
    test_inputs, test_targets = (t.to(device) for t in ds.batch(cfg.b, "test", 0))
    grown = copy.deepcopy(model)
    grown.block.install(0, r.W_Q, r.W_K)
    with torch.no_grad():
        heldout_before = float(model.loss(test_inputs, test_targets))
        heldout_after = float(grown.loss(test_inputs, test_targets))
    med = {ph: stats_mod.median(v) for ph, v in times.items()}
    extra = {"info": r.info, "times": times, "spec": r.spec, "dataset": ds.description,
             "dataset_options": ds.options()}
    if hasattr(ds, "reference_losses"):  # known optima of the dataset, on the held-out batch
        extra["references"] = ds.reference_losses(model, test_inputs, test_targets, cfg.d_k + cfg.p)
    scan = {"path_efficiency": math.nan, "scan_decrease": math.nan, "heldout_decrease_at_scan_best": math.nan}
    if isinstance(strategy, strategies.GrowthStrategy):
        stats = strategy.new_statistics()
        for Xi, Gi, mi in caps:
            stats.update(Xi, Gi, mi)
        prob = search_problem(strategy, stats, X, G, mask, W_Q, W_K, scale, cfg.d_k + cfg.p, loss_of_scores)
        extra["lambda_curve"] = loss_along_lambda(prob, lam_max=2.5 * r.lam if r.lam > 0 else 1.0)
        found = path_efficiency(prob, r.loss_before - r.loss_after, r.lam)
        scan.update(path_efficiency=found["path_efficiency"], scan_decrease=found["scan_decrease"])
        extra["scan_lam"] = found["scan_lam"]
        if found["scan_lam"] > 0:
            with torch.no_grad():
                U, s, V = prob.truncate(prob.Z - found["scan_lam"] * prob.P_hat)
                root = s.clamp_min(0).sqrt() / math.sqrt(new_scale)
            at_best = copy.deepcopy(model)
            at_best.block.install(0, U * root, V * root)
            with torch.no_grad():
                scan["heldout_decrease_at_scan_best"] = heldout_before - float(at_best.loss(test_inputs, test_targets))
        if r.spec == strategies.canonical("formula2"):
            extra["formula_gap"] = formula_gap(caps)
    reference = reference_projection(Gall, Xall, mall, cache_dir)
    return {
        **metrics.quality(Gall, Xall, r.dZ, mall, reference),
        "loss_before": r.loss_before,
        "loss_after": r.loss_after,
        "loss_decrease": r.loss_before - r.loss_after,
        "heldout_before": heldout_before,
        "heldout_after": heldout_after,
        "heldout_decrease": heldout_before - heldout_after,
        "lam": r.lam,
        "n_loss_evals": r.n_loss_evals,
        "fallback": "; ".join(r.fallback),
        **{f"t_{ph}": med[ph] for ph in PHASES},
        "t_floor": stats_mod.median(floors),
        "t_loss_eval": stats_mod.median(loss_evals),
        "peak_mem_bytes": mem["peak_bytes"],
        "peak_mem_method": mem["method"],
        **scan,
        "host_syncs": int(r.info.get("host_syncs", 0)),
        "extra": extra,
    }


def run_one(config: dict, cache_dir: str | None = "results/cache", threads: int | None = None) -> dict:
    """Measure one configuration in a worker; never raises: a failure becomes a ``failed`` row."""
    cfg = RunConfig(**config)
    return recorded(cfg, lambda: measure(cfg, cache_dir), threads)
