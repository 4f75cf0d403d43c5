"""Speed against optimality: every strategy on each dataset's reference configuration, the Pareto front."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

import strategies
from harness.recommend import preset_names, reference_runs
from harness.report.figures.base import (
    FigureResult,
    bottom_legend,
    facets,
    label_points,
    log_axis,
    obstacle_boxes,
    panel_title,
    plain_text,
    theme,
)
from harness.report.figures.palette import BLACK, BLUE, GREY, ORANGE, PURPLE, YELLOW
from harness.report.names import category, short_label
from harness.report.wording import listing, plural, times

TITLE = "Speed against batch optimality (Pareto front; a diagnostic)"
CATEGORY_COLORS = {"preset": BLUE, "variant": ORANGE, "baseline": GREY, "other": PURPLE}
CATEGORY_NAMES = {"preset": "preset", "variant": "one-axis variant", "baseline": "baseline", "other": "other"}
# The presets the recommended strategy is compared with: the paper's formula and its best-known refinement.
COMPARED = ("formula1", "formula4")


def pareto_front(points: pd.DataFrame, x: str = "time", y: str = "optimality") -> list:
    """Index of the non-dominated rows (smaller ``x``, larger ``y``), fastest first."""
    front, best = [], -math.inf
    for idx, r in points.sort_values([x, y], ascending=[True, False]).iterrows():
        if r[y] > best:
            front.append(idx)
            best = r[y]
    return front


def pareto_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and strategy of the reference runs: median, min and max of time (ms) and optimality."""
    grouped = reference_runs(frame).groupby(["dataset", "strategy"])
    points = pd.DataFrame({
        "time": grouped.t_total.median() * 1e3, "t_lo": grouped.t_total.min() * 1e3,
        "t_hi": grouped.t_total.max() * 1e3, "optimality": grouped.optimality.median(),
        "o_lo": grouped.optimality.min(), "o_hi": grouped.optimality.max(), "seeds": grouped.size(),
    }).reset_index()
    return points[np.isfinite(points.time) & np.isfinite(points.optimality) & (points.time > 0)]


def _draw_panel(ax, points: pd.DataFrame, front: list, recommended: str | None, fallback: bool) -> None:
    """One dataset's points (bars min–max), its front, and the recommended strategy starred."""
    for cat, sub in points.groupby("category"):
        ax.errorbar(sub.time, sub.optimality, xerr=[sub.time - sub.t_lo, sub.t_hi - sub.time],
                    yerr=[sub.optimality - sub.o_lo, sub.o_hi - sub.optimality], fmt="o", ms=5,
                    color=CATEGORY_COLORS[cat], elinewidth=0.8, alpha=0.9, capsize=2, label=CATEGORY_NAMES[cat])
    right = points.t_hi.max() * 2.2
    on_front = points.loc[front].sort_values("time")
    ax.step([*on_front.time, right], [*on_front.optimality, on_front.optimality.iloc[-1]], where="post",
            color=BLACK, lw=1.2, alpha=0.8, label="Pareto front", zorder=1)
    ax.scatter(on_front.time, on_front.optimality, s=110, facecolors="none", edgecolors=BLACK, lw=1.3, zorder=3)
    if recommended is not None and recommended in set(points.strategy):
        r = points[points.strategy == recommended].iloc[0]
        ax.scatter([r.time], [r.optimality], marker="*", s=280, color=YELLOW, edgecolors=BLACK, lw=0.9, zorder=4,
                   label="recommended" + (" (fallback)" if fallback else ""))
    low = min(points.o_lo.min(), 0.0)
    # Room above optimality 1 (which no strategy exceeds) for the names of the best strategies, often crowded.
    ax.set_ylim(low - 0.08 * (1.0 - low), 1.0 + 0.3 * (1.0 - low))
    ax.set_yticks([t for t in np.arange(math.floor(5 * low) / 5, 1.01, 0.2)])
    ax.set_xlim(points.t_lo.min() / 1.6, right)
    log_axis(ax, "x")
    ax.set_title(panel_title(points.dataset.iloc[0]))
    ax.set_xlabel("median growth time t_total (ms, log scale)")
    ax.set_ylabel("median optimality (−⟨G,dS⟩/‖dS‖‖ΠG‖, unitless)")


def _shapes(points: pd.DataFrame) -> list[tuple[float, float, float, float, float]]:
    """Every marker (the ringed and starred ones are larger) and error bar of a panel, for label placement."""
    shapes = []
    for r in points.itertuples():
        # A bar's pad covers its caps (capsize 2 points, about 3 pixels either side).
        shapes += [(r.time, r.optimality, r.time, r.optimality, 9), (r.t_lo, r.optimality, r.t_hi, r.optimality, 4),
                   (r.time, r.o_lo, r.time, r.o_hi, 4)]
    return shapes


def _comparison(points: pd.DataFrame, spec: str, other: str) -> tuple[list[float], float, float]:
    """Per dataset, ``other``'s time over ``spec``'s; and the two median optimalities over those datasets."""
    other_spec = strategies.presets()[other]
    ratios, mine, theirs = [], [], []
    for _, at_dataset in points.groupby("dataset"):
        at_dataset = at_dataset.set_index("strategy")
        if spec in at_dataset.index and other_spec in at_dataset.index and spec != other_spec:
            ratios.append(at_dataset.loc[other_spec, "time"] / at_dataset.loc[spec, "time"])
            mine.append(at_dataset.loc[spec, "optimality"])
            theirs.append(at_dataset.loc[other_spec, "optimality"])
    return ratios, float(np.median(mine)) if mine else math.nan, float(np.median(theirs)) if theirs else math.nan


def _speed_clause(points: pd.DataFrame, spec: str, other: str) -> str:
    """``2.9× faster than formula1 (median over 7 datasets, per dataset 2.5–6.5×) at 0.670 against 0.094``."""
    ratios, mine, theirs = _comparison(points, spec, other)
    if not ratios:
        return ""
    factor = float(np.median(ratios))
    spread = ratios if factor >= 1 else [1 / x for x in ratios]
    if 1 / 1.1 <= factor <= 1.1:
        speed = f"about as fast as (×{factor:.2f})"
    else:
        speed = f"{times(factor)} faster than" if factor >= 1 else f"{times(1 / factor)} slower than"
    return (f"{speed} {other} (median over {len(ratios)} datasets, per dataset {min(spread):.2g}–{max(spread):.2g}×) "
            f"at median optimality {mine:.3f} against {theirs:.3f}")


def _numbers(points: pd.DataFrame, fronts: dict[str, list[str]], focus: list[str], names: dict[str, str]):
    """Per dataset: the front, and time and optimality of the recommended/default strategy and the presets
    it is compared with."""
    rows = []
    for ds, at_dataset in points.groupby("dataset"):
        at_dataset = at_dataset.set_index("strategy")
        row = {"dataset": ds, "Pareto front, fastest first": listing([short_label(s, names) for s in fronts[ds]])}
        for spec in focus:
            name = short_label(spec, names)
            have = spec in at_dataset.index
            row[f"{name} (ms)"] = at_dataset.loc[spec, "time"] if have else math.nan
            row[f"{name} optimality"] = at_dataset.loc[spec, "optimality"] if have else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def pareto(frame: pd.DataFrame, recommended: str | None = None, fallback: bool = False) -> FigureResult:
    """Time against optimality per strategy, one panel per dataset, the front highlighted.

    Parameters
    ----------
    frame : pandas.DataFrame
        The runs (:func:`harness.recommend.load_frame`).
    recommended : str, optional
        The recommended spec, starred; ``fallback`` when no strategy met the rule.
    """
    theme()
    points = pareto_points(frame)
    if points.empty:
        return FigureResult("pareto", TITLE, note="No successful runs to plot.")
    names = preset_names()
    points["category"] = points.strategy.map(lambda s: category(s, names))
    datasets = sorted(points.dataset.unique())
    fig, axes = facets(len(datasets), size=(5.6, 4.5))
    fronts = {}
    for ax, ds in zip(axes, datasets, strict=True):
        panel = points[points.dataset == ds]
        front = pareto_front(panel)
        fronts[ds] = panel.loc[front, "strategy"].tolist()
        _draw_panel(ax, panel, front, recommended, fallback)
    fig.suptitle(TITLE + ": medians over seeds, bars min–max", fontweight="bold")
    bottom_legend(fig, axes, ncol=5, top=0.97)
    for ax, ds in zip(axes, datasets, strict=True):  # once the layout is final: names are placed in screen space
        panel = points[points.dataset == ds]
        named = panel[panel.strategy.isin(names) | panel.strategy.isin(fronts[ds]) | (panel.strategy == recommended)]
        names_at = [(r.time, r.optimality, plain_text(short_label(r.strategy, names)), CATEGORY_COLORS[r.category])
                    for r in named.itertuples()]
        label_points(ax, names_at, obstacle_boxes(ax, _shapes(panel)), fontsize=8.5)

    default = strategies.presets()["default"]
    focus = list(dict.fromkeys(s for s in (recommended, default) if s is not None))
    who = ("recommended (fallback)" if fallback else "recommended") if recommended else "default"
    clauses = [c for c in (_speed_clause(points, focus[0], other) for other in COMPARED) if c]
    claim = (f" The {who} strategy ({short_label(focus[0], names)}) is " + ", and ".join(clauses) + "."
             if clauses else "")
    caption = (f"Each point is a strategy's median growth time against its median optimality on a dataset's "
               f"reference configuration ({plural(int(points.seeds.median()), 'seed')} per point), a measure of the "
               "step on the batches it was fitted to (the held-out gain decides: see the next figure); the black "
               "line is the Pareto front (no other strategy both faster and more optimal)." + claim)
    compared = [strategies.presets()[o] for o in COMPARED]
    table = _numbers(points, fronts, list(dict.fromkeys([*focus, *compared])), names)
    return FigureResult("pareto", TITLE, caption, fig, data=points, table=table,
                        wide=("Pareto front, fastest first",))
