"""The report's figures, each with a caption computed from the data.

Every function takes the runs frame (as from :func:`harness.recommend.load_frame`) and
returns a :class:`FigureResult`: a titled matplotlib figure with labelled axes and a
caption that states what the data say, or only a ``note`` when the database has no
data for that figure. Nothing here writes files (see :mod:`harness.report.sweep`).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

import strategies  # noqa: E402

from harness.recommend import CELL_COLUMNS, is_growth, preset_names, reference_runs, spec_parts  # noqa: E402

AXES = ("averaging", "inverse", "truncation", "metric", "line_search", "method")
AXIS_TITLES = {"averaging": "averaging", "inverse": "inverse", "truncation": "truncation", "metric": "metric-aware",
               "line_search": "line search", "method": "search method"}
PHASES = ("t_statistics", "t_direction", "t_truncation", "t_line_search")
PHASE_NAMES = {"t_statistics": "statistics", "t_direction": "direction", "t_truncation": "truncation",
               "t_line_search": "line search", "other": "other"}
PAIR_KEYS = ("dataset", "seed", *CELL_COLUMNS)
CATEGORY_COLORS = {"preset": "#1f77b4", "variant": "#ff7f0e", "baseline": "#7f7f7f", "other": "#9467bd"}


@dataclass
class FigureResult:
    """One figure of the report: ``fig`` is None when there was nothing to draw (see ``note``)."""

    name: str
    title: str
    caption: str = ""
    fig: plt.Figure | None = None
    note: str = ""
    data: pd.DataFrame = field(default_factory=pd.DataFrame)
    png: bytes = b""


def _theme() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.05)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.titleweight": "bold", "svg.fonttype": "path"})


def tx(s) -> str:
    """A string from the database made safe for matplotlib text (no mathtext)."""
    return str(s).replace("$", r"\$")


AXIS_FORMAT = {"line_search": "{} search", "metric": None}


def short_label(spec: str, names: dict[str, str] | None = None) -> str:
    """A preset's name, or ``preset[change, ...]`` for a spec one or two components away from a preset
    (the default preferred), e.g. ``default[rsvd]``, ``default[−metric]``, ``default[normal search]``."""
    names = preset_names() if names is None else names
    if spec in names:
        return names[spec]
    c = spec_parts(spec)
    if c is None or "baseline" in c:
        return str(spec)
    best = None
    for name, pspec in strategies.presets().items():
        pc = spec_parts(pspec)
        if pc is None or "baseline" in pc:
            continue
        diff = [k for k in AXES if pc[k] != c[k]]
        key = (len(diff), name != "default", name)
        if best is None or key < best[0]:
            best = (key, name, diff)
    if best is None or len(best[2]) > 2:
        return str(spec)
    _, name, diff = best
    vals = [("+metric" if c[k] else "−metric") if k == "metric" else AXIS_FORMAT.get(k, "{}").format(c[k])
            for k in diff]
    return f"{name}[{', '.join(vals)}]"


def _label(spec: str, names: dict[str, str]) -> str:
    return short_label(spec, names)


def _category(spec: str, names: dict[str, str]) -> str:
    c = spec_parts(spec)
    if c is None:
        return "other"
    if "baseline" in c:
        return "baseline"
    return "preset" if spec in names else "variant"


def _extra(value) -> dict:
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if isinstance(value, str) else {}
    except (TypeError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.3g} ms"


def _times(r: float) -> str:
    return f"{r:.1f}×" if r < 10 else f"{r:.0f}×"


def _signed(v: float, fmt: str) -> str:
    """``v`` with its sign, without a negative zero ("-0.000" reads as a loss)."""
    text = format(v, "+" + fmt)
    return text.replace("-", "+", 1) if float(text) == 0 else text


def plural(n: int, noun: str) -> str:
    """``"1 seed"``, ``"3 seeds"``: a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "none"


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame.status == "ok"]


def _place_labels(ax, points: list[tuple[float, float, str, str]], fontsize: float = 8,
                  obstacles: list[tuple[float, float]] = ()) -> None:
    """Annotate points, trying offsets on rings of growing radius (with a leader line beyond the first)
    until a label overlaps no other label or marker and stays inside the axes."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    to_px = ax.transData.transform
    placed = [Bbox.from_bounds(px - 4, py - 4, 8, 8) for px, py in (to_px(o) for o in obstacles)]
    steps = [(7, 3), (7, -11), (-7, 3), (-7, -11)]
    for radius in (16, 26, 38, 52, 68, 86):
        for angle in range(15, 360, 30):
            a = math.radians(angle)
            steps.append((radius * math.cos(a), radius * math.sin(a) - 4))
    for x, y, text, color in sorted(points, key=lambda p: (-p[1], p[0])):
        own = Bbox.from_bounds(*(to_px((x, y)) - 4), 8, 8)
        for i, (dx, dy) in enumerate(steps):
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                            ha="left" if dx >= 0 else "right", va="bottom", color=color)
            bb = t.get_window_extent(renderer).expanded(1.03, 1.1)
            inside = bb.x0 >= axbox.x0 and bb.x1 <= axbox.x1 and bb.y0 >= axbox.y0 and bb.y1 <= axbox.y1
            clash = any(bb.overlaps(p) for p in placed if not (p.x0 == own.x0 and p.y0 == own.y0))
            if inside and not clash:
                placed.append(bb)
                if i >= 4:  # a leader line from the point to the label (drawn apart: it has no text box)
                    ax.annotate("", (x, y), xytext=(dx, dy + 4), textcoords="offset points",
                                arrowprops=dict(arrowstyle="-", color=color, lw=0.5, alpha=0.6, shrinkA=0, shrinkB=3))
                break
            t.remove()
        else:
            t = ax.annotate(text, (x, y), xytext=(7, 3), textcoords="offset points", fontsize=fontsize,
                            color=color)
            placed.append(t.get_window_extent(renderer))


def _facets(n: int, ncols: int = 2, size=(6.2, 4.4)):
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


# ------------------------------------------------------------------ 1. Pareto front
def pareto_front(points: pd.DataFrame, x: str = "time", y: str = "optimality") -> list:
    """Index of the non-dominated rows (smaller ``x``, larger ``y``), fastest first."""
    front, best = [], -math.inf
    for idx, r in points.sort_values([x, y], ascending=[True, False]).iterrows():
        if r[y] > best:
            front.append(idx)
            best = r[y]
    return front


def pareto(frame: pd.DataFrame, recommended: str | None = None, fallback: bool = False) -> FigureResult:
    """Time against optimality per strategy, one panel per dataset, front highlighted."""
    _theme()
    title = "Speed against optimality (Pareto front)"
    ref = reference_runs(frame)
    names = preset_names()
    if ref.empty:
        return FigureResult("pareto", title, note="No successful runs to plot.")
    g = ref.groupby(["dataset", "strategy"])
    pts = pd.DataFrame({
        "time": g.t_total.median() * 1e3, "t_lo": g.t_total.min() * 1e3, "t_hi": g.t_total.max() * 1e3,
        "optimality": g.optimality.median(), "o_lo": g.optimality.min(), "o_hi": g.optimality.max(),
        "seeds": g.size(),
    }).reset_index()
    pts = pts[np.isfinite(pts.time) & np.isfinite(pts.optimality) & (pts.time > 0)]
    datasets = sorted(pts.dataset.unique())
    fig, axes = _facets(len(datasets))
    fronts = {}
    for ax, ds in zip(axes, datasets, strict=True):
        p = pts[pts.dataset == ds].copy()
        p["category"] = p.strategy.map(lambda s: _category(s, names))
        front = pareto_front(p)
        fronts[ds] = p.loc[front, "strategy"].tolist()
        for cat, sub in p.groupby("category"):
            ax.errorbar(sub.time, sub.optimality,
                        xerr=[sub.time - sub.t_lo, sub.t_hi - sub.time],
                        yerr=[sub.optimality - sub.o_lo, sub.o_hi - sub.optimality],
                        fmt="o", ms=5, color=CATEGORY_COLORS[cat], ecolor=CATEGORY_COLORS[cat], elinewidth=0.8,
                        alpha=0.85, capsize=2, label={"preset": "preset", "variant": "one-axis variant",
                                                      "baseline": "baseline", "other": "other"}[cat])
        tmin, tmax = p.t_lo.min(), p.t_hi.max()
        fp = p.loc[front].sort_values("time")
        ax.step([*fp.time, tmax * 2.2], [*fp.optimality, fp.optimality.iloc[-1]], where="post", color="crimson",
                lw=1.4, alpha=0.8, label="Pareto front", zorder=1)
        ax.scatter(fp.time, fp.optimality, s=110, facecolors="none", edgecolors="crimson", lw=1.5, zorder=3)
        if recommended is not None and recommended in set(p.strategy):
            r = p[p.strategy == recommended].iloc[0]
            ax.scatter([r.time], [r.optimality], marker="*", s=260, color="gold", edgecolors="black", lw=0.8,
                       zorder=4, label="recommended" + (" (fallback)" if fallback else ""))
        ax.set_xscale("log")
        ax.set_title(tx(ds))
        ax.set_xlabel("median growth time t_total (ms, log scale)")
        ax.set_ylabel("median optimality (−⟨G,dS⟩/‖dS‖‖ΠG‖, unitless)")
        lo = min(p.o_lo.min(), 0.0)
        ax.set_ylim(lo - 0.08 * (1.0 - lo), 1.0 + 0.12 * (1.0 - lo))
        ax.set_xlim(tmin / 1.6, tmax * 2.2)
    fig.suptitle(title + ": medians over seeds, bars min–max", fontweight="bold")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    for ax, ds in zip(axes, datasets, strict=True):
        p = pts[pts.dataset == ds]
        lab = [(r.time, r.optimality, tx(_label(r.strategy, names)), CATEGORY_COLORS[_category(r.strategy, names)])
               for r in p.itertuples() if r.strategy in names or r.strategy in fronts[ds] or r.strategy == recommended]
        _place_labels(ax, lab, fontsize=7.5, obstacles=list(zip(p.time, p.optimality, strict=True)))

    # Caption: the front per dataset, then the default (or recommended) against formula 1.
    parts = [f"On each dataset's reference configuration ({plural(int(pts.seeds.median()), 'seed')} per point), "
             "the Pareto front (no other strategy both faster and more optimal) is: "
             + "; ".join(f"{ds}: {_list([_label(s, names) for s in fronts[ds]])}" for ds in datasets) + "."]
    focus = [("recommended (fallback)" if fallback else "recommended", recommended),
             ("default", strategies.presets()["default"])]
    seen = {None}
    for what, spec in focus:
        if spec in seen:
            continue
        seen.add(spec)
        for other in ("formula1", "formula4"):
            o = strategies.presets()[other]
            ratios, dopt = [], []
            for ds in datasets:
                p = pts[pts.dataset == ds].set_index("strategy")
                if spec in p.index and o in p.index and spec != o:
                    ratios.append(p.loc[o, "time"] / p.loc[spec, "time"])
                    dopt.append((p.loc[spec, "optimality"], p.loc[o, "optimality"]))
            if ratios:
                r = float(np.median(ratios))
                a, b = float(np.median([d[0] for d in dopt])), float(np.median([d[1] for d in dopt]))
                rr = ratios if r >= 1 else [1 / x for x in ratios]
                if 1 / 1.1 <= r <= 1.1:
                    speed = f"about as fast as (×{r:.2f})"
                else:
                    speed = f"{_times(r)} faster than" if r >= 1 else f"{_times(1 / r)} slower than"
                parts.append(f"The {what} strategy ({_label(spec, names)}) is {speed} {other} (median over "
                             f"{len(ratios)} datasets, per dataset {min(rr):.2g}–{max(rr):.2g}×) at median "
                             f"optimality {a:.3f} against {b:.3f}.")
    return FigureResult("pareto", title, " ".join(parts), fig, data=pts)


# ------------------------------------------------------------------ 2. ablation effects
def ablation_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Every pair of successful growth runs differing in exactly one axis, everything else equal."""
    ok = _ok(frame)
    ok = ok[ok.strategy.map(is_growth)]
    default = spec_parts(strategies.default_spec())
    rows = []
    for _, group in ok.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        if len(group) < 2:
            continue
        recs = [(r, spec_parts(r.strategy)) for r in group.itertuples()]
        for (ra, ca), (rb, cb) in itertools.combinations(recs, 2):
            diff = [k for k in AXES if ca[k] != cb[k]]
            if len(diff) != 1:
                continue
            axis = diff[0]
            order = _axis_order(axis)
            # From the default's choice when one side has it, else in registry order.
            if cb[axis] == default[axis] or (ca[axis] != default[axis] and order(cb[axis]) < order(ca[axis])):
                (ra, ca), (rb, cb) = (rb, cb), (ra, ca)
            fa, fb = _axis_value(axis, ca[axis]), _axis_value(axis, cb[axis])
            hb = ra.heldout_before if ra.heldout_before and np.isfinite(ra.heldout_before) else np.nan
            rows.append(dict(
                axis=axis, change=f"{AXIS_TITLES[axis]}: {fa} → {fb}", dataset=ra.dataset, seed=ra.seed,
                spec_a=ra.strategy, spec_b=rb.strategy,
                time_ratio=_xf(rb) / _xf(ra),
                raw_time_ratio=rb.t_total / ra.t_total if ra.t_total and ra.t_total > 0 else np.nan,
                d_optimality=rb.optimality - ra.optimality,
                d_heldout_pct=100 * (rb.heldout_decrease - ra.heldout_decrease) / abs(hb) if hb else np.nan,
            ))
    return pd.DataFrame(rows, columns=["axis", "change", "dataset", "seed", "spec_a", "spec_b", "time_ratio",
                                       "raw_time_ratio", "d_optimality", "d_heldout_pct"])


def _xf(r) -> float:
    """``t_total / t_floor`` of a run (NaN when either is missing or not positive)."""
    t, f = r.t_total, r.t_floor
    return t / f if t and f and t > 0 and f > 0 else np.nan


def _axis_order(axis: str):
    from strategies.line_search import METHODS

    values = {"metric": [True, False], "method": list(METHODS)}.get(axis) or list(strategies.REGISTRY[axis])
    return lambda v: values.index(v) if v in values else len(values)


def _axis_value(axis: str, v) -> str:
    if axis == "metric":
        return "on" if v else "off"
    return str(v)


def ablation(frame: pd.DataFrame) -> FigureResult:
    """Paired effect of changing one axis: time ratio, Δ optimality, Δ held-out decrease."""
    _theme()
    title = "Ablation: the paired effect of changing one axis"
    pairs = ablation_pairs(frame)
    if pairs.empty:
        return FigureResult("ablation", title, note="No pairs of runs differing in exactly one axis (with "
                                                    "everything else equal) are in the database.")
    pairs = pairs.sort_values(["axis", "change"], key=lambda s: s.map(
        {a: i for i, a in enumerate(AXES)}) if s.name == "axis" else s, kind="stable")
    order = list(dict.fromkeys(pairs.change))
    n = len(order)
    fig, axes = plt.subplots(1, 3, figsize=(16, 1.2 + 0.42 * n + 0.8), sharey=True)
    datasets = sorted(pairs.dataset.unique())
    palette = dict(zip(datasets, sns.color_palette("colorblind", len(datasets)), strict=True))
    specs = [("time_ratio", "time ratio after / before (of t_total / t_floor; ×, log scale)", 1.0),
             ("d_optimality", "Δ optimality (after − before, unitless)", 0.0),
             ("d_heldout_pct", "Δ held-out loss decrease (% of held-out loss)", 0.0)]
    for ax, (col, xlabel, ref) in zip(axes, specs, strict=True):
        d = pairs[np.isfinite(pairs[col])]
        sns.stripplot(data=d, x=col, y="change", hue="dataset", order=order, hue_order=datasets, palette=palette,
                      ax=ax, size=5, jitter=0.18, alpha=0.8, legend=ax is axes[0], orient="h")
        med = d.groupby("change")[col].median().reindex(order)
        ax.scatter(med.values, range(n), marker="|", s=500, color="black", lw=2, zorder=5,
                   label="median over pairs" if ax is axes[0] else None)
        ax.axvline(ref, color="black", lw=0.8, ls="--")
        if col == "time_ratio":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("")
        # Bands separate the axes.
        prev = None
        for i, ch in enumerate(order):
            a = pairs.loc[pairs.change == ch, "axis"].iloc[0]
            if prev is not None and a != prev:
                ax.axhline(i - 0.5, color="grey", lw=0.6)
            prev = a
    axes[0].set_title("time")
    axes[1].set_title("optimality")
    axes[2].set_title("held-out loss decrease")
    axes[0].set_yticks(range(n), [tx(o) for o in order])
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].get_legend().remove()
    height = fig.get_figheight()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, title="dataset")
    fig.suptitle(title + " (before = the default's choice; everything else equal; one dot per pair)",
                 fontweight="bold")
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))

    summ = pairs.groupby("change").agg(n=("time_ratio", "size"),
                                       time=("time_ratio", "median"), dopt=("d_optimality", "median"),
                                       dho=("d_heldout_pct", "median")).reindex(order)
    bits = [f"{ch} ({int(r.n)} pairs): time ×{r.time:.2g}, optimality {_signed(r.dopt, '.3f')}, "
            f"held-out {_signed(r.dho, '.2g')}%" for ch, r in summ.iterrows()]
    big_q = summ.dopt.abs().idxmax()
    big_t = summ.time.map(lambda v: abs(math.log(v)) if v > 0 else 0).idxmax()
    raw = pairs.groupby("change").raw_time_ratio.median().reindex(order)
    caption = ("Medians over pairs of runs that differ only in that axis (same dataset, sizes, seed and device); "
               "time ratios compare t_total / t_floor of the two runs (each run's floor is timed between its "
               "repeats, which cancels slow periods of the machine; the plain t_total ratios have medians "
               f"{raw.min():.2g}–{raw.max():.2g}×). "
               + "; ".join(bits) + ". "
               f"Largest quality effect: {big_q} (optimality {summ.loc[big_q, 'dopt']:+.3f}); "
               f"largest time effect: {big_t} (×{summ.loc[big_t, 'time']:.2g}).")
    return FigureResult("ablation", title, caption, fig, data=pairs)


# ------------------------------------------------------------------ 3. time breakdown
def breakdown(frame: pd.DataFrame) -> FigureResult:
    """Stacked median phase times per strategy and dataset, in multiples of the run's floor."""
    _theme()
    title = "Where the time goes: growth phases"
    ref = reference_runs(frame)
    names = preset_names()
    ref = ref[(ref.t_floor > 0) & ref.t_total.notna()]
    if ref.empty:
        return FigureResult("breakdown", title, note="No successful runs with a measured floor.")
    rel = ref[["dataset", "strategy"]].copy()
    for c in (*PHASES, "t_total"):
        rel[c] = ref[c].fillna(0) / ref.t_floor
    rel["ms"] = ref.t_total * 1e3
    med = rel.groupby(["dataset", "strategy"]).median()
    med["other"] = (med.t_total - med[list(PHASES)].sum(axis=1)).clip(lower=0)
    med = med.reset_index()
    order = med.groupby("strategy").t_total.median().sort_values().index.tolist()
    datasets = sorted(med.dataset.unique())
    colors = dict(zip([*PHASES, "other"], sns.color_palette("Set2", 5), strict=True))
    height = 1.5 + 0.3 * len(order)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.3 * len(datasets) + 2.6, height), sharey=True,
                             squeeze=False)
    axes = axes[0]
    for ax, ds in zip(axes, datasets, strict=True):
        m = med[med.dataset == ds].set_index("strategy").reindex(order)
        left = np.zeros(len(order))
        for ph in [*PHASES, "other"]:
            vals = m[ph].fillna(0).to_numpy()
            ax.barh(range(len(order)), vals, left=left, color=colors[ph], label=PHASE_NAMES[ph], height=0.75)
            left += vals
        ax.axvline(1.0, color="black", lw=1.4, label="floor (Gram sums + 1 loss evaluation) = 1")
        totals = m.t_total.dropna().to_numpy()
        top = float(totals.max()) if len(totals) else 1.0
        # One outlier must not flatten the others: cap the axis at 3× the upper quartile, mark clipped bars.
        cap = min(top, 3 * float(np.percentile(totals, 75))) if len(totals) else 1.0
        cap = max(cap, 1.5)
        for i, (tot, ms) in enumerate(zip(m.t_total, m.ms, strict=True)):
            if not np.isfinite(tot):
                continue
            if tot > cap:
                ax.text(cap * 1.005, i, f"▶ {tot:.3g}× ({ms:.3g} ms)", va="center", fontsize=7, color="#b00")
            else:
                ax.text(tot + 0.01 * cap, i, f"{ms:.3g} ms", va="center", fontsize=7, color="#444")
        ax.set_title(tx(ds))
        ax.set_xlabel("median time / floor of the same run (×)")
        ax.set_xlim(0, cap * 1.3)
    axes[0].set_yticks(range(len(order)), [tx(_label(s, names)) for s in order])
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(title + " in multiples of the floor (medians over seeds; labels: median t_total)",
                 fontweight="bold")
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))

    tot = med.groupby("strategy")[[*PHASES, "other", "t_total"]].median()
    bits = []
    for name in ("formula1", "formula2", "formula4", "joint", "default"):
        spec = strategies.presets()[name]
        if spec not in tot.index or not tot.loc[spec, "t_total"] > 0:
            continue
        r = tot.loc[spec]
        shares = (r[[*PHASES, "other"]] / r.t_total).sort_values(ascending=False)
        bits.append(f"{name} {r.t_total:.2g}× the floor, {PHASE_NAMES[shares.index[0]]} "
                    f"{100 * shares.iloc[0]:.0f}%")
    gr = tot[tot.index.map(is_growth)]
    caption = ""
    if bits:
        caption = ("Median over datasets (time as a multiple of the floor; the largest phase and its share): "
                   + "; ".join(bits) + ". ")
    if len(gr):
        fastest = gr.t_total.sort_values()
        ls_share = float((gr.t_line_search / gr.t_total).median())
        n_ls = int((gr[list(PHASES)].idxmax(axis=1) == "t_line_search").sum())
        caption += (f"The cheapest growth strategy relative to the floor is {_label(fastest.index[0], names)} "
                    f"({fastest.iloc[0]:.2g}× the floor), the most expensive {_label(fastest.index[-1], names)} "
                    f"({fastest.iloc[-1]:.2g}×); the line search is the largest phase for {n_ls} of {len(gr)} "
                    f"growth strategies (median share {100 * ls_share:.0f}%). Bars are in multiples of each run's "
                    "floor, timed between the same run's repeats, so slow periods of the machine cancel; a red ▶ "
                    "marks a bar cut at three times the panel's upper quartile.")
    return FigureResult("breakdown", title, caption, fig, data=med)


# ------------------------------------------------------------------ 4. scaling
def scaling_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs of grids that vary one of d_e, d_s, b with everything else fixed (the longest such series per axis)."""
    ok = _ok(frame)
    out = []
    sizes = ("d_e", "d_s", "b")
    for axis in sizes:
        fixed = ["dataset", *[c for c in CELL_COLUMNS if c != axis]]
        best, best_key = None, None
        for key, grp in ok.groupby(fixed, dropna=False):
            nvals = grp[axis].nunique()
            per_strategy = grp.groupby("strategy")[axis].nunique()
            n_full = int((per_strategy >= 3).sum())
            score = (nvals, n_full, len(grp))
            if nvals >= 3 and n_full >= 1 and (best is None or score > best):
                best, best_key = score, key
        if best_key is None:
            continue
        sel = pd.Series(True, index=ok.index)
        for c, v in zip(fixed, best_key, strict=True):
            sel &= (ok[c] == v) | (ok[c].isna() & pd.isna(v))
        s = ok[sel].copy()
        s["axis"] = axis
        s["value"] = s[axis]
        s["t_best"] = [_fastest_repeat(r) for r in s.itertuples()]
        out.append(s)
    return pd.concat(out) if out else pd.DataFrame()


def _fastest_repeat(r) -> float:
    """The fastest timed repeat of a run's growth (``extra.times.total``), else its median ``t_total``."""
    times = _extra(r.extra).get("times", {}).get("total")
    if isinstance(times, list) and times and all(isinstance(t, int | float) for t in times):
        return float(min(times))
    return float(r.t_total)


def fit_exponent(x, y) -> float:
    """Least-squares slope of log y against log x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 2 or np.unique(x[keep]).size < 2:
        return math.nan
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def scaling(frame: pd.DataFrame) -> FigureResult:
    """Time against d_e, d_s, b on log–log axes with fitted exponents."""
    _theme()
    title = "Scaling of growth time with d_e, d_s and b"
    ser = scaling_series(frame)
    names = preset_names()
    if ser.empty:
        return FigureResult("scaling", title, note="No scaling grid (one of d_e, d_s, b taking three or more values "
                                                   "with everything else fixed) is in the database.")
    axes_present = [a for a in ("d_e", "d_s", "b") if a in set(ser.axis)]
    fig, axes = plt.subplots(1, len(axes_present), figsize=(5.6 * len(axes_present), 4.8), squeeze=False)
    axes = axes[0]
    specs = sorted(ser.strategy.unique(), key=lambda s: (s not in names, _label(s, names)))
    palette = dict(zip(specs, sns.color_palette("tab10", len(specs)), strict=False))
    fits = []
    for ax, axis in zip(axes, axes_present, strict=True):
        s = ser[ser.axis == axis]
        fixed = s.iloc[0]
        for spec in specs:
            d = s[s.strategy == spec].groupby("value").t_best.median() * 1e3
            if len(d) < 2:
                continue
            k = fit_exponent(d.index, d.values)
            fits.append(dict(axis=axis, strategy=spec, exponent=k, points=len(d)))
            ax.plot(d.index, d.values, "o-", color=palette.get(spec), label=f"{tx(_label(spec, names))}  (α={k:.2f})")
        fl = s.groupby("value").t_floor.median() * 1e3
        if len(fl) >= 2:
            k = fit_exponent(fl.index, fl.values)
            fits.append(dict(axis=axis, strategy="floor", exponent=k, points=len(fl)))
            ax.plot(fl.index, fl.values, "--", color="grey", lw=1.2, label=f"floor, median  (α={k:.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        others = ", ".join(f"{c}={fixed[c]}" for c in ("d_s", "d_e", "b", "d_k", "p") if c != axis)
        ax.set_title(f"vary {axis}  ({tx(fixed.dataset)}, {others})", fontsize=10)
        ax.set_xlabel(f"{axis} (log scale)")
        ax.set_ylabel("fastest repeat of t_total (ms, log scale)")
        ax.legend(fontsize=8, title="strategy (fitted exponent α)", title_fontsize=8, loc="best")
    fig.suptitle(title + ": time ∝ size^α, least squares on log–log", fontweight="bold")
    fig.tight_layout()
    fits = pd.DataFrame(fits)
    bits = []
    for axis in axes_present:
        f = fits[(fits.axis == axis) & (fits.strategy != "floor")].dropna(subset=["exponent"]).sort_values("exponent")
        if f.empty:
            continue
        fl = fits[(fits.axis == axis) & (fits.strategy == "floor")].exponent
        bits.append(f"{axis}: α from {f.exponent.iloc[0]:.2f} ({_label(f.strategy.iloc[0], names)}) to "
                    f"{f.exponent.iloc[-1]:.2f} ({_label(f.strategy.iloc[-1], names)})"
                    + (f", floor {fl.iloc[0]:.2f}" if len(fl) and np.isfinite(fl.iloc[0]) else ""))
    caption = ("Fitted exponents of the growth time (fastest of each run's timed repeats, the least disturbed "
               "by other load): " + "; ".join(bits) + ". "
               "An exponent near 0 means the fixed costs (loss evaluations, Python overhead) dominate at these "
               "sizes; near 1 or above, the size-dependent algebra does." if bits else "")
    n_pts = int(fits.points.max()) if len(fits) else 0
    if n_pts <= 4:
        caption += (f" Each fit has at most {plural(n_pts, 'point')} of one seed: treat the exponents as rough, "
                    "and where the floor (grey, the same work at each size for every strategy) jumps, the machine "
                    "was busy.")
    return FigureResult("scaling", title, caption, fig, data=fits)


# ------------------------------------------------------------------ 5. formula convergence
def formula_gaps(frame: pd.DataFrame) -> pd.DataFrame:
    ok = _ok(frame)
    rows = []
    for r in ok.itertuples():
        gap = _extra(r.extra).get("formula_gap")
        if isinstance(gap, dict) and "rel_diff" in gap:
            rows.append(dict(dataset=r.dataset, d_s=r.d_s, d_e=r.d_e, b=r.b, seed=r.seed, ratio=r.d_s / r.d_e,
                             rel_diff=gap.get("rel_diff", np.nan), score_cosine=gap.get("score_cosine", np.nan)))
    return pd.DataFrame(rows, columns=["dataset", "d_s", "d_e", "b", "seed", "ratio", "rel_diff", "score_cosine"])


def _spearman(x, y) -> float:
    x, y = pd.Series(np.asarray(x, float)), pd.Series(np.asarray(y, float))
    if x.nunique() < 2 or y.nunique() < 2:
        return math.nan
    return float(x.rank().corr(y.rank()))


def formula_verdict(gaps: pd.DataFrame) -> tuple[str, str]:
    """("confirm" | "refute" | "inconclusive", explanation) on seed 001's claim that formula 2 → formula 1.

    Judged per dataset with formula 2 runs at three or more values of ``d_s/d_e`` (medians per
    ratio): *confirm* when the relative difference falls with the ratio (Spearman ρ ≤ −0.5) and
    ends below half its value at the smallest ratio; *refute* when it does not fall (ρ ≥ −0.2)
    or ends above 80 % of it; otherwise inconclusive. Datasets measured at fewer ratios are
    reported beside the verdict, not in it.
    """
    verdicts, why, aside = [], [], []
    for ds, d in gaps.groupby("dataset"):
        m = d.groupby("ratio")[["rel_diff", "score_cosine"]].median()
        if len(m) < 3:
            aside.append(f"{ds} was measured at d_s/d_e = {', '.join(f'{r:.3g}' for r in m.index)} only (rel. "
                         f"difference {', '.join(f'{v:.3g}' for v in m.rel_diff)}, score cosine "
                         f"{', '.join(f'{v:+.2f}' for v in m.score_cosine)})")
            continue
        rho = _spearman(m.index, m.rel_diff)
        lo, hi = m.rel_diff.iloc[0], m.rel_diff.iloc[-1]
        if rho <= -0.5 and hi < 0.5 * lo:
            v = "confirm"
        elif rho >= -0.2 or hi >= 0.8 * lo:
            v = "refute"
        else:
            v = "inconclusive"
        verdicts.append(v)
        why.append(f"on {ds}, the relative difference goes from {lo:.3g} at d_s/d_e = {m.index[0]:.3g} to {hi:.3g} "
                   f"at {m.index[-1]:.3g} (Spearman ρ = {rho:+.2f} over {len(m)} ratios) and the score cosine "
                   f"from {m.score_cosine.iloc[0]:+.2f} to {m.score_cosine.iloc[-1]:+.2f} "
                   f"(per ratio: {', '.join(f'{v:+.2f}' for v in m.score_cosine)})")
    tail = (". Beside the verdict: " + "; ".join(aside)) if aside else ""
    if not verdicts:
        return "inconclusive", "no dataset has formula 2 runs at three or more values of d_s/d_e" + tail
    if all(v == "confirm" for v in verdicts):
        return "confirm", "; ".join(why) + tail
    if all(v == "refute" for v in verdicts):
        return "refute", "; ".join(why) + tail
    return "inconclusive", "; ".join(why) + tail


def formula_convergence(frame: pd.DataFrame) -> FigureResult:
    """Relative difference and score cosine of formula 2 against formula 1 vs d_s/d_e."""
    _theme()
    title = "Does formula 2 converge to formula 1 as d_s/d_e grows?"
    gaps = formula_gaps(frame)
    if gaps.empty:
        return FigureResult("formula_gap", title, note="No formula 2 run in the database records the formula gap "
                                                       "(extra.formula_gap; databases made before it existed lack "
                                                       "it).")
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 5.2))
    datasets = sorted(gaps.dataset.unique())
    palette = dict(zip(datasets, sns.color_palette("colorblind", len(datasets)), strict=True))
    for ax, col, ylabel in ((axes[0], "rel_diff", "‖P₂ − P₁‖_F / ‖P₁‖_F (unitless, log scale)"),
                            (axes[1], "score_cosine", "cosine of X P₂ Xᵀ and X P₁ Xᵀ (unitless)")):
        for ds in datasets:
            d = gaps[gaps.dataset == ds]
            ax.scatter(d.ratio, d[col], color=palette[ds], alpha=0.75, s=30, label=tx(ds))
            m = d.groupby("ratio")[col].median()
            if len(m) > 1:
                ax.plot(m.index, m.values, color=palette[ds], lw=1, alpha=0.7)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_s / d_e (log scale)")
        ax.set_ylabel(ylabel)
    pos = gaps.rel_diff[gaps.rel_diff > 0]
    if len(pos) and pos.max() / pos.min() > 10:
        axes[0].set_yscale("log")
        axes[0].set_ylabel("‖P₂ − P₁‖_F / ‖P₁‖_F (unitless, log scale)")
    else:
        axes[0].set_ylabel("‖P₂ − P₁‖_F / ‖P₁‖_F (unitless)")
        axes[0].ticklabel_format(axis="y", useOffset=False)
    axes[0].axhline(1.0, color="black", lw=0.6, ls=":")
    axes[1].axhline(1.0, color="black", lw=0.6, ls=":")
    axes[1].set_ylim(min(-0.1, gaps.score_cosine.min() - 0.05), 1.05)
    axes[0].set_title("relative difference of the directions")
    axes[1].set_title("agreement of the score changes")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, fontsize=8.5)
    fig.suptitle(title + " (formula 2 = gram/pinv, formula 1 = per-sample/pinv, same batches)", fontweight="bold")
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, 1))
    verdict, why = formula_verdict(gaps)
    word = {"confirm": "confirm", "refute": "do not confirm (refute, within the range measured)",
            "inconclusive": "neither confirm nor refute"}[verdict]
    top = gaps.ratio.max()
    caption = (f"The data {word} seed 001's claim that formula 2 approaches formula 1 as d_s ≫ d_e: {why}. "
               f"Largest d_s/d_e measured: {top:.3g}" + (" (d_s ≫ d_e is only approached)." if top < 10 else "."))
    return FigureResult("formula_gap", title, caption, fig, data=gaps)


# ------------------------------------------------------------------ 6. loss along λ
def _line_search_siblings(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("averaging", "inverse", "truncation", "metric"))


def lambda_panels(frame: pd.DataFrame) -> tuple[str | None, list[dict]]:
    """The base spec and, per dataset, its λ curve (lowest seed of the reference runs) and its siblings' λ."""
    ref = reference_runs(frame)
    ref = ref[ref.strategy.map(is_growth)]
    if ref.empty:
        return None, []
    has_curve = ref.extra.map(lambda e: bool(_extra(e).get("lambda_curve", {}).get("lam")))
    cands = sorted(set(ref.strategy[has_curve]))
    if not cands:
        return None, []
    parts = {s: spec_parts(s) for s in set(ref.strategy)}
    default = strategies.default_spec()

    def n_sib(s):
        return sum(1 for o in parts if o != s and _line_search_siblings(parts[s], parts[o]))

    base = sorted(cands, key=lambda s: (-n_sib(s), s != default, s))[0]
    panels = []
    for ds, runs in ref.groupby("dataset", sort=True):
        seed = runs[runs.strategy == base].seed.min()
        if pd.isna(seed):
            continue
        same = runs[runs.seed == seed]
        b = same[same.strategy == base].iloc[0]
        curve = _extra(b.extra).get("lambda_curve") or {}
        if not curve.get("lam"):
            continue
        marks = [dict(strategy=r.strategy, line_search=parts[r.strategy]["line_search"],
                      method=parts[r.strategy]["method"], lam=r.lam, loss_after=r.loss_after,
                      loss_before=r.loss_before)
                 for r in same.itertuples() if _line_search_siblings(parts[r.strategy], parts[base])]
        panels.append(dict(dataset=ds, seed=int(seed), curve=curve, marks=marks))
    return base, panels


def loss_along_lambda(frame: pd.DataFrame) -> FigureResult:
    """Actual loss along λ on the fast and normal paths, the tangent, and the λ each search chose."""
    _theme()
    title = "Loss along λ and the λ each search chooses"
    base, panels = lambda_panels(frame)
    names = preset_names()
    if not panels:
        return FigureResult("lambda", title, note="No run records the loss along λ (extra.lambda_curve; databases "
                                                  "made before it existed lack it).")
    fig, axes = _facets(len(panels), size=(6.4, 4.4))
    markers = {"grid": "s", "bounded": "D", "newton": "o", "quadratic": "^"}
    bits = []
    for ax, pnl in zip(axes, panels, strict=True):
        c = pnl["curve"]
        lam = np.asarray(c["lam"], float)
        L0 = float(c["loss0"])
        fast, normal = np.asarray(c["fast"], float) - L0, np.asarray(c["normal"], float) - L0
        tangent = float(c["slope"]) * lam
        ax.plot(lam, fast, "-", color="#1f77b4", lw=1.8, label="fast path  L(S − λ X P̂ Xᵀ)")
        ax.plot(lam, normal, "--", color="#d62728", lw=1.8, label="normal path  L(X T(Z − λP̂) Xᵀ)")
        ax.plot(lam, tangent, ":", color="black", lw=1.2, label="first-order tangent  slope·λ")
        span = np.nanmax(np.r_[fast, normal, 0]) - np.nanmin(np.r_[fast, normal, 0])
        lo = np.nanmin(np.r_[fast, normal, 0]) - 0.25 * span
        hi = np.nanmax(np.r_[fast, normal, 0]) + 0.15 * span
        ax.set_ylim(lo, hi if hi > lo else lo + 1e-6)
        for m in sorted(pnl["marks"], key=lambda m: (m["line_search"], m["method"])):
            tag = f"{m['line_search']}:{m['method']}"
            col = "#1f77b4" if m["line_search"] == "fast" else "#d62728"
            ax.axvline(m["lam"], color=col, lw=0.6, alpha=0.5)
            ax.scatter([m["lam"]], [m["loss_after"] - L0], marker=markers.get(m["method"], "x"), s=55,
                       facecolors=col if m["line_search"] == "fast" else "white", edgecolors=col, zorder=5,
                       label=f"chosen λ: {tx(tag)}")
        ax.set_title(f"{tx(pnl['dataset'])} (seed {pnl['seed']})")
        ax.set_xlabel("λ (step in score space, units of ‖dS‖)")
        ax.set_ylabel("loss change L(λ) − L(0) (loss units)")
        marks = sorted(pnl["marks"], key=lambda m: (m["line_search"], m["method"]))
        dec = {f"{m['line_search']}:{m['method']}": L0 - m["loss_after"] for m in marks}
        i_min = int(np.nanargmin(normal))
        at_end = i_min == len(lam) - 1
        where = (f"the normal path still falls at the largest λ sampled ({lam[-1]:.3g})" if at_end else
                 f"the normal path has its minimum at λ≈{lam[i_min]:.3g}, {-normal[i_min]:.3g} below L(0)")
        top = max(dec.values()) if dec else math.nan
        if dec and top > 0:
            got = ", ".join(f"{k} λ={m['lam']:.3g} ({100 * v / top:.0f}%)"
                            for (k, v), m in zip(dec.items(), marks, strict=True))
            bits.append(f"{pnl['dataset']}: {got}; {where}")
        else:
            bits.append(f"{pnl['dataset']}: no search lowered the loss; {where}")
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), frameon=False,
               fontsize=8.5)
    fig.suptitle(f"{title}: direction of {tx(_label(base, names))} ({tx(base)})", fontweight="bold")
    fig.tight_layout(rect=(0, (0.25 + 0.22 * math.ceil(len(handles) / 4)) / fig.get_figheight(), 1, 1))
    caption = (f"Curves use {_label(base, names)}'s direction ({base}); markers are the λ chosen, and the loss "
               "reached, by the runs that differ from it only in line search / method. Per dataset: each search's λ "
               "and its loss decrease as a share of the largest decrease among these searches — " + "; ".join(bits)
               + ". The normal path lies above the fast one wherever truncation to rank d_k + p loses part of the "
               "step; the tangent (slope·λ) shows how soon the first-order model stops being accurate.")
    return FigureResult("lambda", title, caption, fig)


# ------------------------------------------------------------------ 7. CPU vs GPU
def devices(frame: pd.DataFrame) -> FigureResult:
    """Speed-up of GPU runs over CPU runs of otherwise equal configurations."""
    _theme()
    title = "CPU against GPU"
    ok = _ok(frame)
    kinds = ok.device.fillna("").map(lambda d: d.split(":")[0])
    if not ((kinds == "cpu").any() and (kinds == "cuda").any()):
        have = ", ".join(sorted(set(ok.device.dropna()))) or "none"
        return FigureResult("devices", title, note=f"No GPU comparison: the database has successful runs on "
                                                   f"{have} only, not on both CPU and CUDA.")
    keys = ["strategy", "dataset", "seed", *[c for c in CELL_COLUMNS if c != "device"]]
    cpu = ok[kinds == "cpu"].groupby(keys, dropna=False).t_total.median()
    gpu = ok[kinds == "cuda"].groupby(keys, dropna=False).t_total.median()
    both = pd.concat([cpu.rename("cpu"), gpu.rename("gpu")], axis=1, join="inner").reset_index()
    if both.empty:
        return FigureResult("devices", title, note="The database has CPU and GPU runs, but no configuration was run "
                                                   "on both.")
    names = preset_names()
    both["speedup"] = both.cpu / both.gpu
    both["label"] = both.strategy.map(lambda s: _label(s, names))
    order = both.groupby("label").speedup.median().sort_values().index.tolist()
    fig, ax = plt.subplots(figsize=(9.5, 1.4 + 0.32 * len(order)))
    sns.stripplot(data=both, x="speedup", y="label", hue="dataset", order=order,
                  ax=ax, orient="h", size=5, jitter=0.15)
    med = both.groupby("label").speedup.median().reindex(order)
    ax.scatter(med.values, range(len(order)), marker="|", s=300, color="black", lw=2, zorder=5, label="median")
    ax.set_yticks(range(len(order)), [tx(o) for o in order])
    ax.axvline(1, color="black", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed-up t_total(CPU) / t_total(GPU) (×, log scale)")
    ax.set_ylabel("")
    ax.set_title(title + ": speed-up of equal configurations", fontweight="bold")
    ax.legend(fontsize=8)
    fig.tight_layout()
    gpu_names = ", ".join(sorted(set(ok[kinds == "cuda"].device_name.dropna().astype(str)))) or "GPU"
    caption = (f"{len(both)} configurations ran on both devices ({gpu_names}). Median speed-up "
               f"{both.speedup.median():.2g}× (from {med.iloc[0]:.2g}× for {order[0]} to {med.iloc[-1]:.2g}× for "
               f"{order[-1]}); {int((both.speedup < 1).sum())} configurations were slower on the GPU.")
    return FigureResult("devices", title, caption, fig, data=both)


ALL = (pareto, ablation, breakdown, scaling, formula_convergence, loss_along_lambda, devices)
