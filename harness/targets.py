"""The speed and quality targets, measured in one process: ``growbench targets``.

Every figure is a median of repeats after a warm-up; every ratio compares two
medians taken in the same run, so machine noise affects both sides alike.
"""

from __future__ import annotations

import math
import statistics as stats_mod
import time
from collections.abc import Callable

import pandas as pd
import torch

from growbench import strategies
from growbench.harness.measure import RunConfig, measure, site_of, step_quality
from growbench.harness.runner.sweep import CPU_MAX_SCALE, SCALE_SET, run_spec, scale_candidates, scale_dataset
from growbench.strategies.timing import synchronize

#: The least path efficiency the scale targets ask of the default at every width (issue 10).
PATH_EFFICIENCY_FLOOR = 0.95

CANDIDATES = ["formula1", "formula2", "formula3", "formula4", "joint", "default",
              "gram/solve/full+metric/fast:newton", "joint/solve/full+metric/fast:quadratic",
              "gram/solve/full+metric/normal:grid", "joint/solve/full+metric/normal:grid",
              "gram/solve/full+metric/fast:quadratic", "gram/solve/rsvd+metric/fast:quadratic",
              "gram/solve/full/fast:quadratic"]


def median_time(fn: Callable[[], object], repeats: int, device: str = "cpu") -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t)
    return stats_mod.median(times)


WIDE_CANDIDATES = ["formula1", "formula2", "joint", "default", "joint/solve/full+metric/fast:quadratic",
                   "gram/solve/full+metric/fast:quadratic", "gram/solve/rsvd+metric/fast:quadratic"]


def growth_rows(d_e: int, repeats: int, device: str, cache_dir: str | None,
                candidates: list[str] = CANDIDATES) -> pd.DataFrame:
    """Candidates on the reference problem (teacher, b=256, d_s=128, d_k=8, p=8) at width ``d_e``."""
    rows = []
    for name in candidates:
        cfg = RunConfig(strategy=run_spec(name, device, d_e), dataset="teacher", d_s=128, d_e=d_e, b=256, d_k=8,
                        p=8, n_batches=1, repeats=repeats, warmup_steps=200, device=device)
        m = measure(cfg, cache_dir)
        rows.append({"name": name, "spec": cfg.strategy, "d_e": d_e, "t_total": m["t_total"],
                     "t_floor": m["t_floor"], "x_floor": m["t_total"] / m["t_floor"],
                     "optimality": m["optimality"], "heldout_decrease": m["heldout_decrease"],
                     "loss_evals": m["n_loss_evals"], "host_syncs": m["host_syncs"], "fallback": m["fallback"],
                     "profile": _profile_of(m)})
    return pd.DataFrame(rows)


def _profile_of(m: dict) -> dict:
    """The profile of a run's last timed growth (``info["profile"]``, :class:`strategies.timing.Profile`), or {}."""
    profile = m.get("extra", {}).get("info", {}).get("profile")
    return profile if isinstance(profile, dict) else {}


def profile_line(label: str, profile: dict, t_floor: float, host_syncs: object = None) -> str:
    """One line of a growth's profile: each section in multiples of the floor (and ms), largest first; every loss
    call's ms; the host reads. Issue 37's per-phase profile, printed beside the targets it explains."""
    sections = profile.get("ms") if isinstance(profile.get("ms"), dict) else {}
    if not sections or not t_floor > 0:
        return f"{label}: no profile recorded"
    floor_ms = 1e3 * t_floor
    parts = [f"{name} {ms / floor_ms:.2f}× ({ms:.3g} ms)"
             for name, ms in sorted(sections.items(), key=lambda kv: -kv[1]) if ms / floor_ms >= 0.005]
    losses = ", ".join(f"{ms:.3g}" for ms in profile.get("loss_call_ms", []))
    syncs = "" if host_syncs is None else f"; {host_syncs} host reads"
    total = profile.get("total_ms", math.nan)
    return (f"{label}: {total:.4g} ms = {total / floor_ms:.2f}× the floor ({floor_ms:.3g} ms): " + "; ".join(parts)
            + f"; loss calls (ms each): {losses}{syncs}")


def per_sample_solve_vs_pinv(repeats: int, device: str) -> dict:
    """Statistics of formula 1 with ``solve`` and with ``pinv`` (the per-sample inverse is the whole cost)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(256, 128, 64, generator=gen).to(device)
    G = torch.randn(256, 128, 128, generator=gen).to(device) / 256
    out = {}
    for inv in ("pinv", "solve"):
        s = strategies.make(f"per-sample/{inv}/full/fast:grid")
        out[inv] = median_time(lambda s=s: s.new_statistics().update(X, G), repeats, device)
    return out


def rsvd_vs_full(repeats: int, device: str, d_e: int = 1024, rank: int = 32) -> dict:
    """Truncation time and functional error at ``d_e``: a step ``Z − λP̂`` with a decaying spectrum."""
    gen = torch.Generator().manual_seed(0)
    Q1, _ = torch.linalg.qr(torch.randn(d_e, d_e, generator=gen))
    Q2, _ = torch.linalg.qr(torch.randn(d_e, d_e, generator=gen))
    sv = torch.arange(1, d_e + 1, dtype=torch.float32) ** -1.0
    Y = ((Q1 * sv) @ Q2.T).to(device)
    X = torch.randn(4, 2 * d_e, d_e, generator=gen).to(device)
    full = strategies.REGISTRY["truncation"]["full"]()
    rsvd = strategies.REGISTRY["truncation"]["rsvd"]()
    out = {}
    for name, tr in (("full", full), ("rsvd", rsvd)):
        out[f"t_{name}"] = median_time(lambda tr=tr: tr(Y, rank), repeats, device)
        U, s, V = tr(Y, rank)
        out[f"err_{name}"] = float(torch.linalg.vector_norm(X @ (Y - (U * s) @ V.T) @ X.mT))
    return out


def statistics_scaling(repeats: int, device: str) -> dict:
    """Statistics time over 1, 4 and 16 batches of the reference size (linear in samples expected)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(256, 128, 64, generator=gen).to(device)
    G = torch.randn(256, 128, 128, generator=gen).to(device) / 256
    s = strategies.make("default")
    out = {}
    for n in (1, 4, 16):
        def run(n=n):
            st = s.new_statistics()
            for _ in range(n):
                st.update(X, G)
        out[n] = median_time(run, repeats, device)
    return out


def scale_rows(device: str, repeats: int, cache_dir: str | None, widths: list[int] | None = None,
               candidates: list[str] | None = None) -> pd.DataFrame:
    """Every candidate (default: :func:`~harness.runner.sweep.scale_candidates` of the width) at every width of the
    scale set (teacher, a barely trained student): time against the floor, path efficiency, optimality, held-out
    decreases and peak memory, one row per (width, candidate)."""
    if widths is None:
        widths = [d for d in SCALE_SET if device == "cuda" or d <= CPU_MAX_SCALE]
    rows = []
    for d_e in widths:
        b, d_s, d_k, p = SCALE_SET[d_e]
        for name in candidates or scale_candidates(d_e):
            cfg = RunConfig(strategy=run_spec(name, device, d_e), dataset=scale_dataset(d_e), d_s=d_s, d_e=d_e, b=b,
                            d_k=d_k, p=p, n_batches=1, repeats=repeats, warmup_steps=20, device=device)
            m = measure(cfg, cache_dir)
            if name == "default":
                print("  " + profile_line(f"default profile d_e={d_e}", _profile_of(m), m["t_floor"], m["host_syncs"]),
                      flush=True)
            rows.append({"d_e": d_e, "name": name, "spec": cfg.strategy, "t_total_ms": 1e3 * m["t_total"],
                         "t_floor_ms": 1e3 * m["t_floor"], "x_floor": m["t_total"] / m["t_floor"],
                         "path_efficiency": m["path_efficiency"], "optimality": m["optimality"],
                         "heldout_decrease": m["heldout_decrease"],
                         "heldout_at_scan_best": m["heldout_decrease_at_scan_best"],
                         "loss_evals": m["n_loss_evals"], "host_syncs": m["host_syncs"],
                         "peak_mem_mb": m["peak_mem_bytes"] / 2**20, "fallback": m["fallback"]})
            print(f"  d_e={d_e} {name}: {rows[-1]['t_total_ms']:.1f} ms ({rows[-1]['x_floor']:.1f}× floor), "
                  f"path efficiency {rows[-1]['path_efficiency']:.3f}, optimality {rows[-1]['optimality']:.4f}",
                  flush=True)
    return pd.DataFrame(rows)


#: Randomised SVD sketches compared with a full SVD on the scale set: (oversample, power iterations);
#: torch's own defaults first, then the truncation's defaults, then a larger sketch.
SKETCHES = ((8, 2), (16, 4), (32, 4))


def sketch_rows(device: str, cache_dir: str | None, widths: list[int] | None = None,
                sketches: tuple[tuple[int, int], ...] = SKETCHES) -> pd.DataFrame:
    """The step's optimality with a randomised SVD of each sketch against the same step with a full SVD
    (``gram/solve/*+metric/normal:bracket``) on the scale set, one row per (width, sketch); ``loss`` is
    the relative optimality lost to the full SVD."""
    if widths is None:
        widths = [d for d in SCALE_SET if d >= 256 and (device == "cuda" or d <= CPU_MAX_SCALE)]
    rows = []
    for d_e in widths:
        b, d_s, d_k, p = SCALE_SET[d_e]
        cfg = RunConfig(strategy="gram/solve/full+metric/normal:bracket", dataset=scale_dataset(d_e), d_s=d_s,
                        d_e=d_e, b=b, d_k=d_k, p=p, n_batches=1, repeats=1, warmup_steps=20, device=device)
        site = site_of(cfg, cache_dir)
        steps = {"full SVD": strategies.make(cfg.strategy)}
        steps.update({f"rsvd {over}/{n_iter}": strategies.make("gram/solve/rsvd+metric/normal:bracket",
                                                               truncation={"oversample": over, "n_iter": n_iter})
                      for over, n_iter in sketches})
        grown = {name: step_quality(strategy, site, cfg, cache_dir) for name, strategy in steps.items()}
        full = grown["full SVD"][1]["optimality"]
        for name, (r, q) in grown.items():
            rows.append({"d_e": d_e, "sketch": name, "optimality": q["optimality"], "loss": 1 - q["optimality"] / full,
                         "t_truncation_ms": 1e3 * r.timings["truncation"]})
    return pd.DataFrame(rows)


def sketch_verdicts(rows: pd.DataFrame, device: str) -> list[str]:
    """The truncation's own sketch within 1% of a full SVD's step optimality at every width."""
    trunc = strategies.REGISTRY["truncation"]["rsvd"]()
    own = f"rsvd {trunc.oversample}/{trunc.n_iter}"
    lines = []
    for d_e, g in rows.groupby("d_e"):
        g = g.set_index("sketch")
        if own in g.index:
            loss = g.loc[own, "loss"]
            lines.append(f"| {device} d_e={d_e}: {own} step optimality within 1% of a full SVD's | "
                         f"{g.loc[own, 'optimality']:.4f} vs {g.loc['full SVD', 'optimality']:.4f} "
                         f"({-100 * loss:+.2f}%) | {'yes' if loss <= 0.01 else 'no'} |")
    return lines


def scale_verdicts(rows: pd.DataFrame, device: str) -> list[str]:
    """The scale set's targets as table lines: default ≤ 3× floor (≤ 8× at d_e = 64) on CUDA, path efficiency
    ≥ 95%, optimality within 1% of the best candidate, at every width."""
    lines = []
    for d_e, g in rows.groupby("d_e"):
        g = g.set_index("name")
        d, best = g.loc["default"], g.optimality.max()
        if device == "cuda" and d_e in (64, 768, 1024, 4096):
            limit = 8 if d_e == 64 else 3
            lines.append(f"| cuda d_e={d_e}: default ≤ {limit}× its floor | {d.x_floor:.2f}× ({d.t_total_ms:.1f} vs "
                         f"{d.t_floor_ms:.2f} ms) | {'yes' if d.x_floor <= limit else 'no'} |")
        lines.append(f"| {device} d_e={d_e}: default path efficiency ≥ {100 * PATH_EFFICIENCY_FLOOR:g}% | "
                     f"{100 * d.path_efficiency:.1f}% | "
                     f"{'yes' if d.path_efficiency >= PATH_EFFICIENCY_FLOOR else 'no'} |")
        lines.append(f"| {device} d_e={d_e}: default optimality within 1% of best | {d.optimality:.4f} vs "
                     f"{best:.4f} ({g.optimality.idxmax()}) | {'yes' if d.optimality >= 0.99 * best else 'no'} |")
    return lines


class _Lines(list):
    """Lines of the table, printed as they come so a long run shows progress."""

    def append(self, line: str) -> None:
        print(line, flush=True)
        super().append(line)


def run_targets(repeats: int = 5, device: str = "cpu", cache_dir: str | None = "results/cache",
                scale: bool = True) -> str:
    """Measure every target (printing each line as it is measured); return the Markdown table."""
    lines = _Lines(["| target | measured | met |", "|---|---|---|"])
    print("\n".join(lines), flush=True)
    if scale:
        rows = scale_rows(device, repeats, cache_dir)
        for line in scale_verdicts(rows, device):
            lines.append(line)
        lines.append("")
        lines.append("```\n" + rows.drop(columns=["spec", "fallback"]).to_string(
            index=False, float_format=lambda x: f"{x:.4g}") + "\n```")
        lines.append("")
        sketches = sketch_rows(device, cache_dir)
        lines.extend(sketch_verdicts(sketches, device))
        lines.append("")
        lines.append("```\n" + sketches.to_string(index=False, float_format=lambda x: f"{x:.4g}") + "\n```")
        lines.append("")
    for d_e, cands in ((64, CANDIDATES), (256, WIDE_CANDIDATES)):
        g = growth_rows(d_e, repeats, device, cache_dir, cands).set_index("name")
        best = g.optimality.max()
        d, f1, gram, joint = g.loc["default"], g.loc["formula1"], g.loc["formula2"], g.loc["joint"]
        lines.append(f"| d_e={d_e}: default ≤ 3× its floor | {d.x_floor:.2f}× ({1e3 * d.t_total:.1f} ms vs "
                     f"{1e3 * d.t_floor:.1f} ms) | {'yes' if d.x_floor <= 3 else 'no'} |")
        ok = d.optimality >= 0.98 * best
        lines.append(f"| d_e={d_e}: default optimality within 2% of best | {d.optimality:.4f} vs best "
                     f"{best:.4f} ({g.optimality.idxmax()}) | {'yes' if ok else 'no'} |")
        ratio = f1.t_total / d.t_total
        ok = ratio >= 10 and d.optimality >= f1.optimality and d.heldout_decrease >= f1.heldout_decrease
        lines.append(f"| d_e={d_e}: default ≥ 10× faster than formula1, ≥ its quality | {ratio:.1f}×; optimality "
                     f"{d.optimality:.3f} vs {f1.optimality:.3f}; held-out decrease {d.heldout_decrease:.3g} vs "
                     f"{f1.heldout_decrease:.3g} | {'yes' if ok else 'no'} |")
        jr = joint.t_total / gram.t_total
        lines.append(f"| d_e={d_e}: joint within 3× of gram (formula2), same pipeline | {jr:.2f}× | "
                     f"{'yes' if jr <= 3 else 'no'} |")
        lines.append("")
        table = g[["spec", "t_total", "t_floor", "x_floor", "optimality", "heldout_decrease", "loss_evals",
                   "host_syncs"]]
        lines.append("```\n" + table.to_string(float_format=lambda x: f"{x:.4g}") + "\n```")
        lines.append("")
        # The default's last timed growth, section by section (one growth: noisier than the medians above).
        lines.append(profile_line(f"d_e={d_e}: default profile", d.profile, d.t_floor, d.host_syncs))
        lines.append("")
    ps = per_sample_solve_vs_pinv(repeats, device)
    r = ps["pinv"] / ps["solve"]
    lines.append(f"| per-sample solve ≥ 5× faster than per-sample pinv (statistics, b=256, d_s=128, d_e=64) | "
                 f"{r:.1f}× ({1e3 * ps['pinv']:.1f} vs {1e3 * ps['solve']:.1f} ms) | {'yes' if r >= 5 else 'no'} |")
    rv = rsvd_vs_full(repeats, device)
    r = rv["t_full"] / rv["t_rsvd"]
    e = rv["err_rsvd"] / rv["err_full"] - 1
    lines.append(f"| rsvd ≥ 10× faster than full at d_e=1024, rank 32, error within 1% | {r:.1f}× "
                 f"({1e3 * rv['t_full']:.0f} vs {1e3 * rv['t_rsvd']:.1f} ms); error +{100 * e:.2f}% | "
                 f"{'yes' if r >= 10 and e <= 0.01 else 'no'} |")
    sc = statistics_scaling(repeats, device)
    lines.append(f"| statistics linear in samples (1, 4, 16 batches) | {1e3 * sc[1]:.1f}, {1e3 * sc[4]:.1f}, "
                 f"{1e3 * sc[16]:.1f} ms: ×{sc[4] / sc[1]:.2f}, ×{sc[16] / sc[1]:.2f} | "
                 f"{'yes' if abs(sc[16] / sc[1] / 16 - 1) < 0.25 else 'no'} |")
    return "\n".join(lines)
