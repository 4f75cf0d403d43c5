"""Issue 4's speed targets, measured in one process: ``growbench targets``.

Every figure is a median of repeats after a warm-up; every ratio compares two
medians taken in the same run, so machine noise affects both sides alike.
"""

from __future__ import annotations

import statistics as stats_mod
import time
from collections.abc import Callable

import pandas as pd
import torch

import strategies
from strategies._timing import synchronize

from .measure import RunConfig, measure

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
        cfg = RunConfig(strategy=strategies.canonical(name), dataset="teacher", d_s=128, d_e=d_e, b=256, d_k=8,
                        p=8, n_batches=1, repeats=repeats, warmup_steps=200, device=device)
        m = measure(cfg, cache_dir)
        rows.append({"name": name, "spec": cfg.strategy, "d_e": d_e, "t_total": m["t_total"],
                     "t_floor": m["t_floor"], "x_floor": m["t_total"] / m["t_floor"],
                     "optimality": m["optimality"], "heldout_decrease": m["heldout_decrease"],
                     "loss_evals": m["n_loss_evals"], "fallback": m["fallback"]})
    return pd.DataFrame(rows)


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


class _Lines(list):
    """Lines of the table, printed as they come so a long run shows progress."""

    def append(self, line: str) -> None:
        print(line, flush=True)
        super().append(line)


def run_targets(repeats: int = 5, device: str = "cpu", cache_dir: str | None = "results/cache") -> str:
    """Measure every target (printing each line as it is measured); return the Markdown table."""
    lines = _Lines(["| target | measured | met |", "|---|---|---|"])
    print("\n".join(lines), flush=True)
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
        table = g[["spec", "t_total", "t_floor", "x_floor", "optimality", "heldout_decrease", "loss_evals"]]
        lines.append("```\n" + table.to_string(float_format=lambda x: f"{x:.4g}") + "\n```")
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
