"""What generalises: held-out gain against batch gain per component, and against the statistics' tokens.

Both figures read the held-out gain (docs/mathematics.md §7.2): the held-out loss decrease as a
share of the held-out loss before the growth, on test batches the step never saw; means over
seeds with their 95 % Student-t intervals, the rule's own numbers (:mod:`harness.recommend`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from growbench.harness.report.figures.base import (
    MAX_WIDTH_IN,
    FigureResult,
    bottom_legend,
    facets,
    log_axis,
    panel_title,
    theme,
)
from growbench.harness.report.figures.defaults import DEFAULT_LABEL, dataset_defaults
from growbench.harness.report.figures.palette import BLACK, BLUE, GREEN, ORANGE, PURPLE, VERMILLION
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.loading import is_growth, stored_spec
from growbench.harness.rule.paired import Paired
from growbench.harness.rule.reference import measures, reference_runs

GENERALISATION_TITLE = "What generalises: held-out gain against batch gain, per component"
TOKENS_TITLE = "How many statistics tokens does a step need?"
#: What judges λ, by the line search's ``+holdout`` and ``+shrink``: a colour each (``+damp`` is named beside it).
JUDGES = {(False, False): ("λ on the fitting batch", BLACK), (True, False): ("+holdout", BLUE),
          (False, True): ("+shrink", VERMILLION), (True, True): ("+holdout+shrink", PURPLE)}
#: The inverse: a marker each (the ridge apart from the unregularised inverses).
MARKERS = {"ridge": ("o", "ridge (strength chosen by split halves)"), "solve": ("s", "solve"), "pinv": ("^", "pinv")}


def _summaries(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: mean held-out gain and its 95 % interval over seeds, median batch gain, seeds."""
    rows = []
    for key, group in runs.groupby(by, sort=True):
        gain = Paired.of(group.heldout_gain.to_numpy())
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                     "heldout_gain": gain.mean, "low": gain.low, "high": gain.high, "seeds": gain.n,
                     "batch_gain": float(group.batch_gain.median()),
                     "positive_seeds": int((group.heldout_gain > 0).sum())})
    return pd.DataFrame(rows)


def _growth_reference(frame: pd.DataFrame) -> pd.DataFrame:
    ref = reference_runs(frame)
    ref = ref[ref.strategy.map(is_growth)]
    return ref.assign(**measures(ref)) if len(ref) else ref


def _limits(values: np.ndarray, pad: float = 0.08) -> tuple[float, float]:
    """Axis limits around ``values`` and 0 (the line that decides), padded; never an empty range."""
    finite = values[np.isfinite(values)]
    low, high = min(float(finite.min(initial=0.0)), 0.0), max(float(finite.max(initial=0.0)), 0.0)
    span = high - low or max(abs(high), 1e-6)
    return low - pad * span, high + pad * span


def generalisation(frame: pd.DataFrame, regimes: dict[str, Recommendation] | None = None) -> FigureResult:
    """Per dataset: each growth strategy's mean held-out gain (with its interval) against its batch gain, coloured by
    what judges λ and shaped by the inverse; the regime's default ringed. Each panel is scaled to its own points and
    intervals (a reference line must not stretch a panel whose points all sit at 0)."""
    theme()
    ref = _growth_reference(frame)
    if ref.empty or ref.heldout_gain.isna().all():
        return FigureResult("generalisation", GENERALISATION_TITLE,
                            note="No growth run records a held-out gain with its standard error.")
    data = _summaries(ref, ["dataset", "strategy"])
    specs = {s: stored_spec(s) for s in data.strategy.unique()}
    datasets = sorted(data.dataset.unique())
    defaults = dataset_defaults(ref, regimes)
    fig, axes = facets(len(datasets), ncols=2, size=(MAX_WIDTH_IN / 2, 4.4))
    for ax, ds in zip(axes, datasets, strict=False):
        at = data[data.dataset == ds]
        for r in at.itertuples():
            spec = specs[r.strategy]
            label, color = JUDGES[(spec.holdout, spec.shrink)]
            label += "+damp" if spec.damp else ""
            marker, inverse = MARKERS.get(spec.inverse, ("D", spec.inverse))
            fill = "none" if spec.damp else color
            ax.errorbar(100 * r.batch_gain, 100 * r.heldout_gain,
                        yerr=[[100 * (r.heldout_gain - r.low)], [100 * (r.high - r.heldout_gain)]],
                        fmt=marker, color=color, mfc=fill, ms=6, alpha=0.85, elinewidth=1, capsize=2,
                        label=f"{label}, {inverse}")
        mine = at[at.strategy == defaults.get(ds)]
        if len(mine):
            ax.scatter(100 * mine.batch_gain, 100 * mine.heldout_gain, s=260, facecolors="none", edgecolors=BLACK,
                       linewidths=1.8, zorder=6, label=f"{DEFAULT_LABEL} (ringed)")
        ax.axhline(0.0, color=BLACK, lw=0.8)
        x_lim = _limits(100 * at.batch_gain.to_numpy(dtype=float))
        y_lim = _limits(100 * np.r_[at.heldout_gain, at.low, at.high].astype(float))
        # The diagonal across the panel only: it shows where held-out = batch, and sets neither axis.
        ax.plot([min(x_lim[0], y_lim[0]), max(x_lim[1], y_lim[1])], [min(x_lim[0], y_lim[0]), max(x_lim[1], y_lim[1])],
                color=BLACK, lw=0.6, ls=":", scalex=False, scaley=False)
        ax.set_xlim(*x_lim)
        ax.set_ylim(*y_lim)
        ax.set_title(panel_title(ds))
        ax.set_xlabel("batch gain (% of the batch loss; median)")
        ax.set_ylabel("held-out gain (% of the held-out loss)")
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    fig.suptitle(GENERALISATION_TITLE + "\n(mean over seeds with its 95% interval; dotted: held-out = batch)",
                 fontweight="bold")
    bottom_legend(fig, axes[:len(datasets)], ncol=2, top=0.93)
    best = data.loc[data.groupby("dataset").heldout_gain.idxmax()]
    lowering = data[data.low > 0].groupby("dataset").strategy.nunique().reindex(datasets, fill_value=0)
    caption = (
        "Each point is a growth strategy on one dataset (ringed: the default of the dataset's regime), each panel "
        "scaled to its own points: to the right it lowers the loss of the batches it was fitted "
        "to more, up the loss of test batches it never saw; below the dotted line it overfits part of its batch gain, "
        "below 0 it raises the held-out loss, and an interval across 0 is no gain beyond seed noise. Strategies that "
        "lower the held-out loss beyond noise, per dataset: "
        + "; ".join(f"{ds} {n} of {data[data.dataset == ds].strategy.nunique()}" for ds, n in lowering.items())
        + "; the best held-out gain: "
        + "; ".join(f"{r.dataset} {100 * r.heldout_gain:+.3g}% ({r.strategy})" for r in best.itertuples()) + ".")
    table = data.assign(**{"held-out gain (%)": 100 * data.heldout_gain,
                           "95% interval (%)": [f"[{100 * a:+.3g}, {100 * b:+.3g}]" for a, b in
                                                zip(data.low, data.high, strict=True)],
                           "batch gain (%)": 100 * data.batch_gain})
    table = table[["dataset", "strategy", "held-out gain (%)", "95% interval (%)", "batch gain (%)", "seeds",
                   "positive_seeds"]].rename(columns={"positive_seeds": "seeds with a gain > 0"})
    return FigureResult("generalisation", GENERALISATION_TITLE, caption, fig, data=data, table=table,
                        formats={"held-out gain (%)": "+.3g", "batch gain (%)": "+.3g"})


def tokens_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Growth runs that differ from one another in ``n_batches`` only, with at least three token counts per dataset
    and strategy: the statistics-tokens study."""
    ok = frame[(frame.status == "ok") & frame.strategy.map(is_growth)]
    if ok.empty:
        return ok
    ok = ok.assign(**measures(ok))
    ok = ok[ok.statistics_tokens.notna() & ok.heldout_gain.notna()]
    keep = []
    fixed = ["dataset", "strategy", "d_s", "d_e", "b", "d_k", "p", "warmup_steps", "device"]
    for _, group in ok.groupby(fixed, dropna=False):
        if group.n_batches.nunique() >= 3:
            keep.append(group)
    return pd.concat(keep) if keep else ok.iloc[:0]


def smallest_enough(runs: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and strategy: the smallest statistics-token count at which the held-out gain is positive on every
    seed, and its tokens per entry of ``P`` (NaN where no count measured is)."""
    rows = []
    for (ds, strategy), group in runs.groupby(["dataset", "strategy"], sort=True):
        per = group.groupby("statistics_tokens")
        everywhere = [t for t, g in per if (g.heldout_gain > 0).all()]
        tokens = min(everywhere) if everywhere else math.nan
        d_e = float(group.d_e.iloc[0]) + (1 if "minilm" in ds else 0)
        rows.append({"dataset": ds, "strategy": strategy, "tokens": tokens, "per_entry": tokens / d_e**2,
                     "measured": ", ".join(f"{int(t)}" for t in sorted(per.groups))})
    return pd.DataFrame(rows)


def statistics_tokens(frame: pd.DataFrame, regimes: dict[str, Recommendation] | None = None) -> FigureResult:
    """Per dataset: the mean held-out gain (with its interval) against the tokens the statistics were fitted to; the
    regime's default drawn thick and named so in the legend."""
    theme()
    runs = tokens_runs(frame)
    if runs.empty:
        return FigureResult("tokens", TOKENS_TITLE, note="No growth strategy ran at three or more statistics token "
                                                         "counts with otherwise equal settings.")
    data = _summaries(runs, ["dataset", "strategy", "statistics_tokens"])
    datasets = sorted(data.dataset.unique())
    strategies = sorted(data.strategy.unique())
    colors = dict(zip(strategies, (VERMILLION, BLUE, GREEN, ORANGE, PURPLE, BLACK), strict=False))
    defaults = dataset_defaults(runs, regimes)
    fig, axes = facets(len(datasets), ncols=2, size=(MAX_WIDTH_IN / 2, 4.2))
    for ax, ds in zip(axes, datasets, strict=False):
        for strategy in strategies:
            at = data[(data.dataset == ds) & (data.strategy == strategy)].sort_values("statistics_tokens")
            if at.empty:
                continue
            mine = strategy == defaults.get(ds)
            ax.errorbar(at.statistics_tokens, 100 * at.heldout_gain,
                        yerr=[100 * (at.heldout_gain - at.low), 100 * (at.high - at.heldout_gain)], fmt="o-",
                        color=colors[strategy], ms=7 if mine else 5, capsize=2, lw=2.6 if mine else 1,
                        mec=BLACK if mine else colors[strategy], zorder=4 if mine else 3,
                        label=f"{strategy} ({DEFAULT_LABEL})" if mine else strategy)
        ax.axhline(0.0, color=BLACK, lw=0.8)
        log_axis(ax, "x", base=2)
        ax.set_title(panel_title(ds))
        ax.set_xlabel("statistics tokens (log scale)")
        ax.set_ylabel("held-out gain (% of the held-out loss)")
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    fig.suptitle(TOKENS_TITLE + "\n(mean over seeds with its 95% interval)", fontweight="bold")
    bottom_legend(fig, axes[:len(datasets)], ncol=1, top=0.93)
    enough = smallest_enough(runs)
    said = [f"{r.dataset} with {r.strategy}: " + (f"{int(r.tokens)} tokens ({r.per_entry:.3g} per entry of P)"
                                                  if np.isfinite(r.tokens) else f"none of {r.measured}")
            for r in enough.itertuples()]
    caption = ("Each line is one strategy grown from statistics over 1 to many batches of the same configuration; "
               "a gain above 0 with its interval is a step that generalises. The smallest token count measured at "
               "which the held-out gain is positive on every seed: " + "; ".join(said) + ".")
    table = enough.rename(columns={"per_entry": "tokens / d_e²", "measured": "token counts measured"})
    return FigureResult("tokens", TOKENS_TITLE, caption, fig, data=data, table=table,
                        formats={"tokens": ".0f", "tokens / d_e²": ".3g"})
