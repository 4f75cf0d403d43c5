"""Does formula 2 converge to formula 1 as d_s/d_e grows? Their gap as recorded by formula 2's runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from growbench.harness.report.figures.base import (
    FigureResult,
    bottom_legend,
    cover_powers,
    log_axis,
    plain_text,
    stored_extra,
    theme,
)
from growbench.harness.report.figures.palette import dataset_colors

TITLE = "Does formula 2 converge to formula 1 as d_s/d_e grows?"
GAP_COLUMNS = ["dataset", "d_s", "d_e", "b", "seed", "ratio", "rel_diff", "score_cosine"]
# A dataset is judged only with formula 2 runs at this many values of d_s/d_e or more (a trend needs three).
MIN_RATIOS = 3
# A median at one ratio this far on the wrong side of both its neighbours' is a reversal of the trend, said in the
# caption: the score cosine (at most 1) by an absolute 0.1, the relative difference by a factor 1.1.
COSINE_DIP, GAP_BUMP = 0.1, 1.1
VERDICT_WORDS = {"confirm": "confirm", "refute": "do not confirm (refute, within the range measured)",
                 "inconclusive": "neither confirm nor refute"}


def formula_gaps(frame: pd.DataFrame) -> pd.DataFrame:
    """Per formula 2 run that recorded it (``extra.formula_gap``): its sizes, d_s/d_e and the gap."""
    rows = []
    for r in frame[frame.status == "ok"].itertuples():
        gap = stored_extra(r.extra).get("formula_gap")
        if isinstance(gap, dict) and "rel_diff" in gap:
            rows.append(dict(dataset=r.dataset, d_s=r.d_s, d_e=r.d_e, b=r.b, seed=r.seed, ratio=r.d_s / r.d_e,
                             rel_diff=gap.get("rel_diff", np.nan), score_cosine=gap.get("score_cosine", np.nan)))
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def _spearman(x, y) -> float:
    x, y = pd.Series(np.asarray(x, float)), pd.Series(np.asarray(y, float))
    if x.nunique() < 2 or y.nunique() < 2:
        return math.nan
    return float(x.rank().corr(y.rank()))


@dataclass
class FormulaVerdict:
    """``verdict`` on the starting notes' claim (docs/mathematics.md §3.1), the statement per judged dataset, and
    the datasets not judged."""

    verdict: str
    statements: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    reversals: list[str] = field(default_factory=list)


def reversals(dataset: str, per_ratio: pd.DataFrame) -> list[str]:
    """Where one dataset's medians per ratio go against the claim at a ratio between two others: the score cosine
    dipping below both neighbours (by :data:`COSINE_DIP`), the relative difference rising above both (by a factor
    :data:`GAP_BUMP`).

    Returns
    -------
    list of str
        One statement per reversal, e.g. ``on teacher the score cosine dips to +0.03 at d_s/d_e = 1
        (+0.58 at 0.5, +0.92 at 2)``.
    """
    checks = (("score_cosine", "the score cosine dips", "+.2f", lambda x, n: x < min(n) - COSINE_DIP),
              ("rel_diff", "the relative difference rises", ".3g", lambda x, n: x > GAP_BUMP * max(n)))
    out = []
    ratios = list(per_ratio.index)
    for i in range(1, len(ratios) - 1):
        for column, what, fmt, reverses in checks:
            before, here, after = per_ratio[column].iloc[i - 1:i + 2]
            if reverses(here, (before, after)):
                out.append(f"on {dataset} {what} to {here:{fmt}} at d_s/d_e = {ratios[i]:.3g} ({before:{fmt}} at "
                           f"{ratios[i - 1]:.3g}, {after:{fmt}} at {ratios[i + 1]:.3g})")
    return out


def _judge(per_ratio: pd.DataFrame) -> tuple[str, float]:
    """One dataset's verdict from its medians per ratio, and the Spearman ρ of the difference against the ratio."""
    rho = _spearman(per_ratio.index, per_ratio.rel_diff)
    first, last = per_ratio.rel_diff.iloc[0], per_ratio.rel_diff.iloc[-1]
    if rho <= -0.5 and last < 0.5 * first:
        return "confirm", rho
    if rho >= -0.2 or last >= 0.8 * first:
        return "refute", rho
    return "inconclusive", rho


def formula_verdict(gaps: pd.DataFrame) -> FormulaVerdict:
    """Confirm, refute or inconclusive, on the starting notes' claim that formula 2 → formula 1
    (docs/mathematics.md §3.1).

    Judged per dataset with formula 2 runs at three or more values of ``d_s/d_e`` (medians per
    ratio): *confirm* when the relative difference falls with the ratio (Spearman ρ ≤ −0.5) and
    ends below half its value at the smallest ratio; *refute* when it does not fall (ρ ≥ −0.2)
    or ends above 80 % of it; otherwise inconclusive. Datasets measured at fewer ratios are
    named apart, not judged.
    """
    verdicts, out = [], FormulaVerdict("inconclusive")
    for ds, at_dataset in gaps.groupby("dataset"):
        per_ratio = at_dataset.groupby("ratio")[["rel_diff", "score_cosine"]].median()
        if len(per_ratio) < MIN_RATIOS:
            out.not_judged.append(ds)
            continue
        verdict, rho = _judge(per_ratio)
        verdicts.append(verdict)
        out.reversals += reversals(ds, per_ratio)
        first, last = per_ratio.iloc[0], per_ratio.iloc[-1]
        out.statements.append(
            f"on {ds}, the relative difference goes from {first.rel_diff:.3g} at d_s/d_e = {per_ratio.index[0]:.3g} "
            f"to {last.rel_diff:.3g} at {per_ratio.index[-1]:.3g} (Spearman ρ = {rho:+.2f} over {len(per_ratio)} "
            f"ratios) and the score cosine from {first.score_cosine:+.2f} to {last.score_cosine:+.2f}")
    if verdicts and len(set(verdicts)) == 1 and verdicts[0] != "inconclusive":
        out.verdict = verdicts[0]
    return out


def _draw(gaps: pd.DataFrame) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 5.0))
    datasets = sorted(gaps.dataset.unique())
    colors = dataset_colors(datasets)
    positive = gaps.rel_diff[gaps.rel_diff > 0]
    log_gap = bool(len(positive)) and positive.max() / positive.min() > 10
    panels = ((axes[0], "rel_diff", "‖P₂ − P₁‖_F / ‖P₁‖_F (unitless" + (", log scale)" if log_gap else ")"),
               "relative difference of the directions"),
              (axes[1], "score_cosine", "cosine of X P₂ Xᵀ and X P₁ Xᵀ (unitless)", "agreement of the score changes"))
    for ax, col, ylabel, title in panels:
        for ds in datasets:
            at_dataset = gaps[gaps.dataset == ds]
            ax.scatter(at_dataset.ratio, at_dataset[col], color=colors[ds], alpha=0.85, s=30, label=plain_text(ds),
                       zorder=3)
            per_ratio = at_dataset.groupby("ratio")[col].median()
            if len(per_ratio) > 1:  # through the median at every ratio: the line spans all its markers
                ax.plot(per_ratio.index, per_ratio.values, color=colors[ds], lw=1, alpha=0.8)
        ax.axhline(1.0, color="black", lw=0.6, ls=":")
        log_axis(ax, "x", base=2)
        cover_powers(ax, gaps.ratio)
        ax.set_xlabel("d_s / d_e (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    if log_gap:
        log_axis(axes[0], "y")
    else:
        axes[0].ticklabel_format(axis="y", useOffset=False)
    axes[1].set_ylim(min(-0.1, gaps.score_cosine.min() - 0.05), 1.05)
    fig.suptitle(TITLE + "\n(formula 2 = gram/pinv, formula 1 = per-sample/pinv, same batches)", fontweight="bold")
    bottom_legend(fig, axes[:1], ncol=4, top=0.97)
    return fig


def formula_convergence(frame: pd.DataFrame) -> FigureResult:
    """Relative difference and score cosine of formula 2 against formula 1 vs d_s/d_e."""
    theme()
    gaps = formula_gaps(frame)
    if gaps.empty:
        return FigureResult("formula_gap", TITLE, note="No formula 2 run in the database records the formula gap "
                                                       "(extra.formula_gap; databases made before it existed lack "
                                                       "it).")
    fig = _draw(gaps)
    judged = formula_verdict(gaps)
    top = gaps.ratio.max()
    why = "; ".join(judged.statements) or f"no dataset has formula 2 runs at {MIN_RATIOS} or more values of d_s/d_e"
    if judged.reversals:
        why += "; but not at every step: " + "; ".join(judged.reversals)
    aside = (f"Datasets measured at fewer than {MIN_RATIOS} ratios ({', '.join(judged.not_judged)}) are in the table "
             "but not judged; the " if judged.not_judged else "The ")
    caption = (f"The data {VERDICT_WORDS[judged.verdict]} the starting notes' claim (docs/mathematics.md §3.1) "
               "that formula 2 approaches formula 1 as "
               f"d_s ≫ d_e: {why}. {aside}largest d_s/d_e measured is {top:.3g}"
               + (" (d_s ≫ d_e is only approached)." if top < 10 else "."))
    table = gaps.groupby(["dataset", "ratio"])[["rel_diff", "score_cosine"]].median().reset_index()
    table["judged"] = ~table.dataset.isin(judged.not_judged)
    table = table.rename(columns={"ratio": "d_s/d_e", "rel_diff": "relative difference",
                                  "score_cosine": "score cosine"})
    return FigureResult("formula_gap", TITLE, caption, fig, data=gaps, table=table,
                        formats={"d_s/d_e": ".3g", "relative difference": ".3g", "score cosine": "+.2f"})
