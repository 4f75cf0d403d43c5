"""Speed against optimality: every strategy on each dataset's reference configuration, the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from growbench import strategies
from growbench.harness.report.figures.base import (
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
from growbench.harness.report.figures.palette import BLACK, BLUE, GREY, ORANGE, PURPLE, YELLOW
from growbench.harness.report.names import category, short_label
from growbench.harness.report.wording import duration, listing, plural, times
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.loading import preset_names
from growbench.harness.rule.reference import reference_runs, run_regimes
from growbench.strategies.regimes import Regime, all_regimes

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
    """Per dataset and strategy of the reference runs: median, min and max of time (ms) and optimality, and the
    regime (device kind × band of d_e, :mod:`strategies.regimes`) the dataset's reference configuration is in."""
    ref = reference_runs(frame)
    ref = ref.assign(regime=run_regimes(ref)) if len(ref) else ref.assign(regime=pd.Series(dtype=object))
    grouped = ref.groupby(["dataset", "strategy"])
    points = pd.DataFrame({
        "time": grouped.t_total.median() * 1e3, "t_lo": grouped.t_total.min() * 1e3,
        "t_hi": grouped.t_total.max() * 1e3, "optimality": grouped.optimality.median(),
        "o_lo": grouped.optimality.min(), "o_hi": grouped.optimality.max(), "seeds": grouped.size(),
        "regime": grouped.regime.first(),
    }).reset_index()
    return points[np.isfinite(points.time) & np.isfinite(points.optimality) & (points.time > 0)]


@dataclass(frozen=True)
class Starred:
    """The strategy starred on a panel: the recommended spec of the panel's regime, and whether it is a fallback."""

    spec: str | None
    fallback: bool = False

    @property
    def legend(self) -> str:
        """The star's legend entry, which says when the choice is a fallback."""
        return "recommended" + (" (fallback)" if self.fallback else "")


def starred_per_regime(recommended: str | None, fallback: bool,
                       regimes: Mapping[str, Recommendation] | None) -> Callable[[str], Starred]:
    """The star of each regime.

    Parameters
    ----------
    recommended, fallback : str or None, bool
        The spec starred on every panel when ``regimes`` is None, and whether it is a fallback.
    regimes : mapping, optional
        ``{regime key: Recommendation}``: a regime's star is its own recommendation (none when the regime has
        no choice or no recommendation).

    Returns
    -------
    callable
        The :class:`Starred` of a regime key.
    """
    def of(regime: str) -> Starred:
        if regimes is not None and regime in regimes:
            rec = regimes[regime]
            return Starred(rec.spec, bool(rec.fallback))
        return Starred(recommended, fallback) if regimes is None else Starred(None)
    return of


def _draw_panel(ax, points: pd.DataFrame, front: list, star: Starred) -> None:
    """One dataset's points (bars min–max), its front, and its regime's recommended strategy starred."""
    for cat, sub in points.groupby("category"):
        ax.errorbar(sub.time, sub.optimality, xerr=[sub.time - sub.t_lo, sub.t_hi - sub.time],
                    yerr=[sub.optimality - sub.o_lo, sub.o_hi - sub.optimality], fmt="o", ms=5,
                    color=CATEGORY_COLORS[cat], elinewidth=0.8, alpha=0.9, capsize=2, label=CATEGORY_NAMES[cat])
    right = points.t_hi.max() * 2.2
    on_front = points.loc[front].sort_values("time")
    ax.step([*on_front.time, right], [*on_front.optimality, on_front.optimality.iloc[-1]], where="post",
            color=BLACK, lw=1.2, alpha=0.8, label="Pareto front", zorder=1)
    ax.scatter(on_front.time, on_front.optimality, s=110, facecolors="none", edgecolors=BLACK, lw=1.3, zorder=3)
    if star.spec is not None and star.spec in set(points.strategy):
        r = points[points.strategy == star.spec].iloc[0]
        ax.scatter([r.time], [r.optimality], marker="*", s=280, color=YELLOW, edgecolors=BLACK, lw=0.9, zorder=4,
                   label=star.legend)
    low = min(points.o_lo.min(), 0.0)
    # Room above optimality 1 (which no strategy exceeds) for the names of the best strategies.
    ax.set_ylim(low - 0.08 * (1.0 - low), 1.0 + 0.35 * (1.0 - low))
    ax.set_yticks([t for t in np.arange(math.floor(5 * low) / 5, 1.01, 0.2)])
    ax.set_xlim(points.t_lo.min() / 1.6, right)
    log_axis(ax, "x")
    ax.set_title(panel_title(points.dataset.iloc[0]))
    ax.set_xlabel("median growth time t_total (ms, log scale)")
    ax.set_ylabel("median optimality\n(−⟨G,dS⟩/‖dS‖‖ΠG‖, unitless)")


def named_strategies(panel: pd.DataFrame, star: Starred) -> list[str]:
    """The few strategies a panel names: its regime's recommended one, the fastest growth strategy and the most
    optimal one (naming every point made a smear; the figure's table lists the front, the summary every strategy)."""
    growth = panel[panel.category.isin(["preset", "variant"])]
    named = [star.spec] if star.spec in set(panel.strategy) else []
    if len(growth):
        named += [growth.loc[growth.time.idxmin(), "strategy"], growth.loc[growth.optimality.idxmax(), "strategy"]]
    return list(dict.fromkeys(named))


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


def _claims(points: pd.DataFrame, star_of: Callable[[str], Starred], names: dict[str, str]) -> str:
    """Per regime, how its starred strategy (the default where none is) compares with the presets of
    :data:`COMPARED`, as one sentence (``The recommended strategy (default) is 2.9× faster than formula1 ...``)."""
    present = set(points.regime.dropna())
    regimes = [r.key for r in all_regimes() if r.key in present]  # cpu first, narrowest band first
    bits = []
    for regime in regimes:
        star = star_of(regime)
        spec = star.spec or strategies.presets()["default"]
        at_regime = points[points.regime == regime]
        clauses = [c for c in (_speed_clause(at_regime, spec, other) for other in COMPARED) if c]
        if not clauses:
            continue
        who = star.legend if star.spec else "default"
        where = f" of {Regime.parse(regime).describe()}" if len(regimes) > 1 else ""
        bits.append(f"the {who} strategy{where} ({short_label(spec, names)}) is " + ", and ".join(clauses))
    if not bits:
        return ""
    text = "; ".join(bits)
    return f" {text[0].upper()}{text[1:]}."


def _numbers(points: pd.DataFrame, fronts: dict[str, list[str]], star_of: Callable[[str], Starred],
             names: dict[str, str]) -> pd.DataFrame:
    """Per dataset: the front, the starred strategy (its regime's recommendation) with its time and optimality, and
    those of the default and of the presets it is compared with (the panels name only a few points)."""
    rows = []
    compared = list(dict.fromkeys(strategies.presets()[p] for p in ("default", *COMPARED)))
    for ds, at_dataset in points.groupby("dataset"):
        at_dataset = at_dataset.set_index("strategy")
        star = star_of(at_dataset.regime.iloc[0])
        have = star.spec in at_dataset.index
        # One column per strategy, its time and optimality together: a column each made the table twice a laptop's
        # window wide.
        row = {"dataset": ds, "Pareto front, fastest first": listing([short_label(s, names) for s in fronts[ds]]),
               "★ recommended": short_label(star.spec, names) if have else "",
               "★ time, optimality": _point_text(at_dataset, star.spec if have else None)}
        for spec in compared:
            row[f"{short_label(spec, names)}: time, optimality"] = _point_text(at_dataset, spec)
        rows.append(row)
    return pd.DataFrame(rows)


def _point_text(at_dataset: pd.DataFrame, spec: str | None) -> str:
    """``9.25 ms, 0.985``: a strategy's median time and optimality on one dataset ("" when it did not run there)."""
    if spec is None or spec not in at_dataset.index:
        return ""
    return f"{duration(at_dataset.loc[spec, 'time'])}, {at_dataset.loc[spec, 'optimality']:.3g}"


def pareto(frame: pd.DataFrame, recommended: str | None = None, fallback: bool = False, *,
           regimes: Mapping[str, Recommendation] | None = None) -> FigureResult:
    """Time against optimality per strategy, one panel per dataset, the front highlighted.

    Parameters
    ----------
    frame : pandas.DataFrame
        The runs (:func:`harness.recommend.load_frame`).
    recommended : str, optional
        The spec starred on every panel (``fallback`` when no strategy met the rule); ignored with ``regimes``.
    regimes : mapping, optional
        ``{regime key: Recommendation}`` (:func:`harness.recommend.recommend_regimes`): each panel stars the
        recommended spec of its dataset's regime.
    """
    theme()
    points = pareto_points(frame)
    if points.empty:
        return FigureResult("pareto", TITLE, note="No successful runs to plot.")
    names = preset_names()
    star_of = starred_per_regime(recommended, fallback, regimes)
    points["category"] = points.strategy.map(lambda s: category(s, names))
    datasets = sorted(points.dataset.unique())
    fig, axes = facets(len(datasets), size=(5.6, 4.6))
    fronts = {}
    for ax, ds in zip(axes, datasets, strict=True):
        panel = points[points.dataset == ds]
        front = pareto_front(panel)
        fronts[ds] = panel.loc[front, "strategy"].tolist()
        _draw_panel(ax, panel, front, star_of(panel.regime.iloc[0]))
    fig.suptitle(TITLE + ":\nmedians over seeds, bars min–max; ★ the recommended strategy of the panel's regime",
                 fontweight="bold")
    bottom_legend(fig, axes, ncol=3, top=0.95)
    for ax, ds in zip(axes, datasets, strict=True):  # once the layout is final: names are placed in screen space
        panel = points[points.dataset == ds]
        named = panel.set_index("strategy").loc[named_strategies(panel, star_of(panel.regime.iloc[0]))]
        names_at = [(r.time, r.optimality, plain_text(short_label(s, names)), CATEGORY_COLORS[r.category])
                    for s, r in named.iterrows()]
        label_points(ax, names_at, obstacle_boxes(ax, _shapes(panel)))

    caption = (f"Each point is a strategy's median growth time against its median optimality on a dataset's "
               f"reference configuration ({plural(int(points.seeds.median()), 'seed')} per point), a measure of the "
               "step on the batches it was fitted to (the held-out gain decides: see the next figure); the black "
               "line is the Pareto front (no other strategy both faster and more optimal), and each panel names its "
               "regime's recommended strategy (★), the fastest and the most optimal growth strategy (the table "
               "lists the front)." + _claims(points, star_of, names))
    table = _numbers(points, fronts, star_of, names)
    return FigureResult("pareto", TITLE, caption, fig, data=points, table=table,
                        wide=("Pareto front, fastest first",))
