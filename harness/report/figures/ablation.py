"""The paired effect of changing one axis of a strategy: time, optimality, held-out loss decrease."""

from __future__ import annotations

import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from growbench import strategies
from growbench.harness.report.figures.base import (
    MAX_WIDTH_IN,
    FigureResult,
    bottom_legend,
    log_axis,
    plain_text,
    strip_plot,
    theme,
)
from growbench.harness.report.figures.palette import dataset_colors
from growbench.harness.rule.loading import is_growth, stored_spec
from growbench.harness.rule.reference import CELL_COLUMNS, measures
from growbench.strategies.regimes import Regime

TITLE = "Ablation: the paired effect of changing one axis"
AXIS_TITLES = {"averaging": "averaging", "inverse": "inverse", "truncation": "truncation", "metric": "metric-aware",
               "line_search": "line search", "holdout": "λ on a held-out batch", "shrink": "λ without optimism",
               "damp": "λ damped", "method": "search method"}
#: The axes whose values are on and off (``+metric``, ``+holdout``, ``+shrink``, ``+damp``).
FLAGS = ("metric", *strategies.Spec.LINE_SEARCH_FLAGS)
PAIR_KEYS = ("dataset", "seed", *CELL_COLUMNS)
PAIR_COLUMNS = ["axis", "change", "dataset", "regime", "seed", "spec_a", "spec_b", "time_ratio", "raw_time_ratio",
                "d_optimality", "d_heldout_pct", "path_a", "path_b", "gain_a", "gain_b"]
EFFECTS = [("time_ratio", "time ratio after / before\n(of t_total / t_floor; ×, log scale)", 1.0, "time"),
           ("d_optimality", "Δ optimality\n(after − before, unitless)", 0.0, "optimality"),
           ("d_heldout_pct", "Δ held-out loss decrease\n(% of held-out loss)", 0.0, "held-out loss decrease")]


def floor_multiple(run) -> float:
    """``t_total / t_floor`` of a run (NaN when either is missing or not positive)."""
    total, floor = run.t_total, run.t_floor
    return total / floor if total and floor and total > 0 and floor > 0 else np.nan


def _axis_rank(axis: str):
    """Registry order of an axis's values (the order a change is written in when neither side is the default)."""
    values = ([True, False] if axis in FLAGS else list(strategies.METHODS) if axis == "method"
              else list(strategies.REGISTRY[axis]))
    return lambda v: values.index(v) if v in values else len(values)


def _value_text(axis: str, value) -> str:
    return ("on" if value else "off") if axis in FLAGS else str(value)


def _pair(run_a, spec_a, run_b, spec_b, default) -> dict | None:
    """The effect of going from ``a`` to ``b`` when they differ in exactly one axis (from the default's
    choice when one side has it, else in registry order); None otherwise."""
    diff = [axis for axis in strategies.Spec.AXES if getattr(spec_a, axis) != getattr(spec_b, axis)]
    if len(diff) != 1:
        return None
    axis = diff[0]
    rank = _axis_rank(axis)
    value_a, value_b, default_value = getattr(spec_a, axis), getattr(spec_b, axis), getattr(default, axis)
    if value_b == default_value or (value_a != default_value and rank(value_b) < rank(value_a)):
        run_a, spec_a, run_b, spec_b = run_b, spec_b, run_a, spec_a
        value_a, value_b = value_b, value_a
    before = run_a.heldout_before if run_a.heldout_before and np.isfinite(run_a.heldout_before) else np.nan
    return dict(
        axis=axis, change=f"{AXIS_TITLES[axis]}: {_value_text(axis, value_a)} → {_value_text(axis, value_b)}",
        dataset=run_a.dataset, regime=Regime.of(run_a.device, int(run_a.d_e)).key, seed=run_a.seed,
        spec_a=run_a.strategy, spec_b=run_b.strategy,
        time_ratio=floor_multiple(run_b) / floor_multiple(run_a),
        raw_time_ratio=run_b.t_total / run_a.t_total if run_a.t_total and run_a.t_total > 0 else np.nan,
        d_optimality=run_b.optimality - run_a.optimality,
        d_heldout_pct=100 * (run_b.heldout_decrease - run_a.heldout_decrease) / abs(before) if before else np.nan,
        # Each side's own path efficiency and held-out gain, as the rule reads them (harness.recommend.measures).
        path_a=run_a.path_efficiency, path_b=run_b.path_efficiency, gain_a=run_a.heldout_gain,
        gain_b=run_b.heldout_gain,
    )


def ablation_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Every pair of successful growth runs differing in exactly one axis, everything else equal."""
    ok = frame[(frame.status == "ok") & frame.strategy.map(is_growth)]
    if "path_efficiency" not in ok:  # a frame from a database written before the column existed
        ok = ok.assign(path_efficiency=np.nan)
    measured = measures(ok)
    ok = ok.assign(path_efficiency=measured["path_efficiency"], heldout_gain=measured["heldout_gain"])
    default = stored_spec(strategies.default_spec())
    rows = []
    for _, group in ok.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        runs = [(r, stored_spec(r.strategy)) for r in group.itertuples()]
        for (run_a, spec_a), (run_b, spec_b) in itertools.combinations(runs, 2):
            pair = _pair(run_a, spec_a, run_b, spec_b, default)
            if pair is not None:
                rows.append(pair)
    return _in_axis_order(pd.DataFrame(rows, columns=PAIR_COLUMNS))


def _in_axis_order(pairs: pd.DataFrame) -> pd.DataFrame:
    """Pairs sorted by axis (in spec order), then by change."""
    order = {axis: i for i, axis in enumerate(strategies.Spec.AXES)}
    return pairs.sort_values(["axis", "change"], key=lambda s: s.map(order) if s.name == "axis" else s,
                             kind="stable")


def ablation_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per change (in axis order): its axis, the number of pairs and the median effects."""
    changes = list(dict.fromkeys(pairs.change))
    grouped = pairs.groupby("change")
    return pd.DataFrame({
        "axis": grouped.axis.first(), "pairs": grouped.size(), "time": grouped.time_ratio.median(),
        "optimality": grouped.d_optimality.median(), "heldout_pct": grouped.d_heldout_pct.median(),
        "raw_time": grouped.raw_time_ratio.median(),
    }).reindex(changes)


def _draw(pairs: pd.DataFrame, changes: list[str]) -> plt.Figure:
    """Three panels (time, optimality, held-out), one row per change, one dot per pair."""
    fig, axes = plt.subplots(1, 3, figsize=(MAX_WIDTH_IN, 1.6 + 0.34 * len(changes)), sharey=True)
    datasets = sorted(pairs.dataset.unique())
    palette = dataset_colors(datasets)
    axis_of = pairs.groupby("change").axis.first()
    # The legend comes from the first panel with a dot: the time panel is empty when no pair has both times.
    keyed = next((ax for ax, (col, *_) in zip(axes, EFFECTS, strict=True) if np.isfinite(pairs[col]).any()), axes[0])
    for ax, (col, xlabel, neutral, title) in zip(axes, EFFECTS, strict=True):
        finite = pairs[np.isfinite(pairs[col])]
        strip_plot(data=finite, x=col, y="change", hue="dataset", order=changes, hue_order=datasets, palette=palette,
                   ax=ax, size=5, jitter=0.18, alpha=0.85, legend=ax is keyed, orient="h")
        med = finite.groupby("change")[col].median().reindex(changes)
        ax.scatter(med.values, range(len(changes)), marker="|", s=400, color="black", lw=2, zorder=5,
                   label="median over pairs" if ax is keyed else None)
        ax.axvline(neutral, color="black", lw=0.8, ls="--")
        if col == "time_ratio":
            log_axis(ax, "x")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("")
        ax.set_title(title)
        for i in range(1, len(changes)):  # a rule between the changes of different axes
            if axis_of[changes[i]] != axis_of[changes[i - 1]]:
                ax.axhline(i - 0.5, color="grey", lw=0.6)
    axes[0].set_yticks(range(len(changes)), [plain_text(c) for c in changes])
    if keyed.get_legend() is not None:
        keyed.get_legend().remove()
    fig.suptitle(TITLE + "\n(before = the default's choice; everything else equal; one dot per pair)",
                 fontweight="bold")
    bottom_legend(fig, [keyed], ncol=4, title="dataset")
    return fig


def ablation(frame: pd.DataFrame) -> FigureResult:
    """Paired effect of changing one axis: time ratio, Δ optimality, Δ held-out decrease."""
    theme()
    pairs = ablation_pairs(frame)
    if pairs.empty:
        return FigureResult("ablation", TITLE, note="No pairs of runs differing in exactly one axis (with "
                                                    "everything else equal) are in the database.")
    summary = ablation_summary(pairs)
    fig = _draw(pairs, list(summary.index))
    biggest_quality = summary.heldout_pct.abs().idxmax()
    timed = summary.time.notna().any()
    biggest_time = summary.time.map(lambda v: abs(math.log(v)) if v > 0 else 0).idxmax()
    caption = ("Each dot is a pair of runs that differ only in that axis (same dataset, sizes, seed and device), the "
               "bar their median; time ratios compare t_total / t_floor of the two runs, since each run's floor is "
               "timed between its repeats and cancels slow periods of the machine"
               + (f" (the plain t_total ratios have medians {summary.raw_time.min():.2g}–{summary.raw_time.max():.2g}×)"
                  if timed else "; no pair has a time on both sides, so the time panel is empty") + ". "
               f"Largest effect on the held-out loss decrease: {biggest_quality} "
               f"({summary.loc[biggest_quality, 'heldout_pct']:+.2g}% of the held-out loss, median over pairs)"
               + (f"; largest time effect: {biggest_time} (×{summary.loc[biggest_time, 'time']:.2g})." if timed
                  else "."))
    table = pd.DataFrame({"change": summary.index, "pairs": summary.pairs.to_numpy(),
                          "time ×": summary.time.to_numpy(), "Δ optimality": summary.optimality.to_numpy(),
                          "Δ held-out decrease (%)": summary.heldout_pct.to_numpy()})
    return FigureResult("ablation", TITLE, caption, fig, data=pairs, table=table,
                        formats={"time ×": ".2g", "Δ optimality": "+.3f", "Δ held-out decrease (%)": "+.2g"})
