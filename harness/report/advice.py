"""The report's opening advice, in plain words and derived from the data: what to use, when to prefer
something else, and what does not matter.

Every statement comes from the recommendation (:mod:`harness.rule.choice`), the paired ablation
(:mod:`harness.report.figures.ablation`) or the training verdicts; nothing is written in advance.
"""

from __future__ import annotations

import math

import pandas as pd

from growbench import strategies
from growbench.harness.report.figures.ablation import ablation_pairs, ablation_summary
from growbench.harness.report.names import short_label
from growbench.harness.report.sections import Bullet, Bullets, Paragraph, Section, Span
from growbench.harness.report.train_runs import table_row
from growbench.harness.report.train_verdict import (
    FLOPS_TARGET,
    TARGET_BASELINES,
    change_text,
    measured_groups,
    noise_word,
)
from growbench.harness.report.training import TrainingSection
from growbench.harness.report.wording import duration, four_digits, listing, times
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.loading import preset_names
from growbench.harness.rule.parameters import CLOSEST, DOES_NOT_GENERALISE, TOLERANCE
from growbench.harness.rule.wording import rule_in_brief
from growbench.strategies.regimes import Regime

TITLE = "Advice"
# A change "does not matter" to quality when, on every dataset, its median effect over pairs stays within both
# bounds, and the evidence the report shows beside it agrees: on every pair, the path efficiency moves by at most
# NEGLIGIBLE_PATH (and, for a change of the line search, whose own quality it measures, no run of the pairs is
# below SEARCH_PATH_FLOOR), and the two sides' mean held-out gains are within the rule's tolerance of each other.
NEGLIGIBLE_OPTIMALITY = 0.005  # optimality is unitless, at most 1
NEGLIGIBLE_HELDOUT_PCT = 0.05  # held-out loss decrease, in % of the held-out loss
NEGLIGIBLE_PATH = 0.05  # path efficiency, unitless (1: the search finds what a scan of λ finds)
SEARCH_PATH_FLOOR = 0.9
SEARCH_AXES = ("line_search", "method", *strategies.Spec.LINE_SEARCH_FLAGS)
# It does not matter to time when its median time ratio over all pairs is within these.
NEGLIGIBLE_TIME = (1 / 1.1, 1.1)  # time ratio after / before
# A training setting "does not matter" on a dataset when its variants' final losses are this close (relative).
NEGLIGIBLE_TRAINING = 0.01


def _regime(rec: Recommendation) -> str:
    """The regime a recommendation answers for, as a reader reads it (``cpu, d_e ≤ 128``)."""
    return Regime.parse(rec.regime).describe() if rec.regime else "all runs"


def _use(rec: Recommendation) -> Bullet:
    """What to use in ``rec``'s regime, the regime named first."""
    where = Span(_regime(rec), "strong")
    if rec.spec is None:
        return Bullet((where, ": no recommendation (no growth strategy is eligible)."))
    name = short_label(rec.spec, preset_names())
    time = f"{duration(rec.evidence['median_time_ms'])} per growth (median over datasets)"
    if rec.verdict == DOES_NOT_GENERALISE:
        return Bullet((where, ": ", Span("do not count on growth here", "strong"), f". {rec.statement} ({time}.)"))
    if rec.verdict == CLOSEST:
        why = f", the fallback choice: {rec.statement} At {time}."
    else:
        why = f": the fastest growth strategy that {rule_in_brief(rec.tolerance)}, at {time}."
    return Bullet((where, ": ", Span("use", "strong"), " ", Span(rec.spec, "code"), f" ({name}){why}"))


def _quality_exceptions(rec: Recommendation) -> list[str]:
    """Where another strategy gains clearly more on held-out data than the choice: who, where, by how much."""
    names = preset_names()
    better: dict[str, list[str]] = {}
    for ds, e in rec.evidence.items():
        if isinstance(e, dict) and not e["within"]:
            who = short_label(e["best_strategy"], names)
            better.setdefault(who, []).append(f"{ds} (held-out gain {100 * e['best_heldout_gain']:+.3g}% against "
                                              f"{100 * e['heldout_gain'][0]:+.3g}%)")
    return [f"{_regime(rec)}, when the held-out loss matters most: {who} on {' and '.join(where)}."
            for who, where in better.items()]


def shortfall_words(gain: float, best: float, dataset: str) -> str:
    """How far a strategy's mean held-out gain on ``dataset`` falls from the best strategy's, in words.

    A shortfall of 631 % of the best's gain reads as what it is: the strategy raises the held-out loss there.

    Examples
    --------
    >>> shortfall_words(-0.0015, 0.00029, "text")
    "on text it raises the held-out loss (mean held-out gain -0.15% against the best strategy's +0.029%)"
    >>> shortfall_words(0.005, 0.01, "digits")
    "on digits it keeps 50% of the best strategy's held-out gain (+0.5% against +1%)"
    """
    mine, theirs = f"{100 * gain:+.3g}%", f"{100 * best:+.3g}%"
    if gain < 0:
        return (f"on {dataset} it raises the held-out loss (mean held-out gain {mine} against the best strategy's "
                f"{theirs})")
    if best > 0:
        return (f"on {dataset} it keeps {100 * gain / best:.0f}% of the best strategy's held-out gain ({mine} against "
                f"{theirs})")
    return f"on {dataset} its mean held-out gain is {mine} (the best strategy's: {theirs})"


def _faster(rec: Recommendation) -> list[str]:
    """The fastest growth strategy, when it is not the choice: what its speed costs, on its worst dataset."""
    first = rec.table.iloc[0] if len(rec.table) else None
    if first is None or first.strategy == rec.spec or first.strategy in rec.as_fast \
            or not math.isfinite(first.time_ms):  # as fast as the choice: its speed costs nothing to give up
        return []
    chosen = rec.evidence["median_time_ms"]
    worst = first.get("worst_dataset")
    cost = (shortfall_words(first.worst_dataset_gain, first.worst_dataset_best, worst)
            if isinstance(worst, str) and math.isfinite(first.worst_shortfall) and first.worst_shortfall > 0
            else "it falls short of the best held-out gain")
    missing = " and it did not run on every dataset" if not first.eligible else ""
    faster = f"{times(chosen / first.time_ms)} faster" if chosen else "faster"
    return [f"{_regime(rec)}, when time matters more than quality: {short_label(first.strategy, preset_names())} is "
            f"{faster} ({duration(first.time_ms)}), but {cost}{missing}."]


def _ended_at(method: str, final: float, change) -> str:
    """``random (2.068, within seed noise)``: a method's final held-out loss and whether its difference to the
    default's is beyond seed noise (:func:`harness.report.train_verdict.noise_word`)."""
    word = noise_word(change)
    return f"{method} ({four_digits(final)}{', ' + word if word else ''})"


def _training_exceptions(section: TrainingSection) -> list[str]:
    """Datasets where default growth misses a training target, with what did better."""
    out = []
    for v in section.verdicts:
        default = table_row(section.table, v.dataset, "default")
        large = table_row(section.table, v.dataset, "fixed-large")
        # Missing target (a) while ending below fixed-large is no reason to start at full width.
        if v.matches_fixed_large is False and large.final_heldout < default.final_heldout:
            reach = v.numbers.get("flops_ratio")
            how = (f"default growth reaches its final held-out loss at ×{reach:.3g} of its FLOPs"
                   if reach is not None and reach == reach else
                   f"default growth ends at ×{v.numbers['loss_ratio']:.4g} its final held-out loss")
            out.append(f"when the full width is affordable from the start on {v.dataset}: fixed-large; "
                       f"{how} (target: reach it at ×{FLOPS_TARGET:g} of its FLOPs).")
        if v.beats_baselines is False:
            better = [_ended_at(b, r.final_heldout, v.numbers[f"{b}_change"]) for b in TARGET_BASELINES
                      if (r := table_row(section.table, v.dataset, b)) is not None
                      and not default.final_heldout <= r.final_heldout]
            if better:
                out.append(f"when growing during training on {v.dataset}: {listing(better)} ended at a median final "
                           f"held-out loss below the default's ({four_digits(default.final_heldout)}).")
    for c in section.schedules:
        change = c.changes.get("default")
        if change is not None and change.n > 1 and change.high < 0:
            out.append(f"when growing during training on {c.dataset}: grow with {c.schedule} rather than {c.other} "
                       f"(the default's final held-out loss {change_text(change)}, against its growth with "
                       f"{c.other}, at ×{c.flops[0] / c.flops[1]:.2f} its FLOPs).")
    return out


def negligible_changes(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per one-axis change, whether each measure the advice reads leaves it negligible (see the bounds above).

    Parameters
    ----------
    pairs : pandas.DataFrame
        :func:`harness.report.figures.ablation.ablation_pairs`: the pairs of runs the ablation figure shows.

    Returns
    -------
    pandas.DataFrame
        One row per change (in axis order): ``axis``, ``time`` (median time ratio), ``medians`` (optimality and
        held-out decrease within their bounds on every dataset), ``lowest_path`` and ``largest_path_change``
        (over every run and pair), ``path`` (those within theirs), ``largest_gain_gap`` (on the worst dataset,
        how far apart the two sides' mean held-out gains are, as a share of the larger), ``heldout`` (within the
        rule's tolerance), ``same_quality`` (all three) and ``same_time``.
    """
    summary = ablation_summary(pairs)
    per_dataset = pairs.groupby(["change", "dataset"])
    medians = per_dataset[["d_optimality", "d_heldout_pct"]].median()
    moved = ((medians.d_optimality.abs() > NEGLIGIBLE_OPTIMALITY)
             | (medians.d_heldout_pct.abs() > NEGLIGIBLE_HELDOUT_PCT)).groupby(level="change").any()
    gains = per_dataset[["gain_a", "gain_b"]].mean()
    larger = gains.abs().max(axis=1)
    gap = ((gains.gain_b - gains.gain_a).abs() / larger).where(larger > 0, 0.0).groupby(level="change").max()
    paths = pairs.assign(lowest=pairs[["path_a", "path_b"]].min(axis=1), change_=(pairs.path_b - pairs.path_a).abs())
    out = pd.DataFrame({
        "axis": summary.axis, "time": summary.time,
        "medians": ~moved.reindex(summary.index, fill_value=True),
        "lowest_path": paths.groupby("change").lowest.min().reindex(summary.index),
        "largest_path_change": paths.groupby("change").change_.max().reindex(summary.index),
        "largest_gain_gap": gap.reindex(summary.index),
    })
    floor = out.axis.map(lambda axis: SEARCH_PATH_FLOOR if axis in SEARCH_AXES else -math.inf)
    # A missing value (no pair measured it) is no evidence of negligibility: the comparisons below are then False.
    out["path"] = (out.largest_path_change <= NEGLIGIBLE_PATH) & (out.lowest_path >= floor)
    out["heldout"] = out.largest_gain_gap <= TOLERANCE
    out["same_quality"] = out.medians & out.path & out.heldout
    out["same_time"] = out.time.between(*NEGLIGIBLE_TIME)
    return out


#: How the advice judges that a change does not matter, said once below its statements.
NEGLIGIBLE_RULE = (f"a change counts as not mattering to quality when, on every dataset, its median effect over "
                   f"pairs of runs keeps optimality within ±{NEGLIGIBLE_OPTIMALITY} and the held-out decrease within "
                   f"±{NEGLIGIBLE_HELDOUT_PCT}% of the held-out loss, the two sides' mean held-out gains are within "
                   f"{100 * TOLERANCE:g}% of each other, and on every pair path efficiency moves by at most "
                   f"{NEGLIGIBLE_PATH} (for a change of the line search, no run below {SEARCH_PATH_FLOOR:g}); and to "
                   "time when the median time ratio over all pairs is within ±10%.")


def _ablation_statements(frame: pd.DataFrame) -> list[str]:
    """The one-axis changes that change neither quality nor time, and those that change only time, on every dataset
    with pairs of runs (a change that matters on one dataset matters: medians pooled over datasets would hide it),
    by :func:`negligible_changes`."""
    pairs = ablation_pairs(frame)
    if pairs.empty:
        return []
    checked = negligible_changes(pairs)
    # The regimes the pairs come from: a change that does not matter there may matter elsewhere.
    where = " and ".join(Regime.parse(k).describe() for k in dict.fromkeys(pairs.regime.dropna())) or "all runs"
    out = []
    neither = checked[checked.same_quality & checked.same_time]
    if len(neither):
        out.append(f"{where}: the {' and the '.join(_change(c) for c in neither.index)}: neither quality nor time "
                   "changes.")
    time_only = checked[checked.same_quality & ~checked.same_time]
    if len(time_only):
        out.append(f"{where}: only the time, not the quality, changes with the "
                   + "; the ".join(_change(c, f"time ×{r.time:.2g}") for c, r in time_only.iterrows()) + ".")
    return out


def _change(change: str, effect: str = "") -> str:
    """``inverse (solve → pinv)`` from the ablation's ``inverse: solve → pinv``, with ``effect`` after the values."""
    axis, _, values = change.partition(": ")
    return f"{axis} ({values}{', ' + effect if effect else ''})"


def _training_settings(section: TrainingSection) -> list[str]:
    """Per dataset, the training settings whose variants end within 1 % of one another."""
    out = []
    for panel in sorted(section.table.dataset.unique()):
        close = [group for group, have in measured_groups(section.table, panel)
                 if max(r.final_heldout for _, r in have) <= (1 + NEGLIGIBLE_TRAINING) * min(r.final_heldout
                                                                                             for _, r in have)]
        if close:
            out.append(f"in training on {panel}: {listing(close)} (each setting's variants end within "
                       f"{100 * NEGLIGIBLE_TRAINING:g}% of one another in final held-out loss).")
    return out


def advice_section(frame: pd.DataFrame | None, recs: dict[str, Recommendation] | Recommendation | None,
                   error: str | None, training: TrainingSection | None) -> Section:
    """The opening advice of the report: every statement names the regime (or the training setting) it is for.

    Parameters
    ----------
    frame : pandas.DataFrame or None
        The growth sweep's runs; None when the database has only training runs.
    recs : dict of str to Recommendation, Recommendation or None
        Every regime's recommendation (``{regime key: Recommendation}``; one alone counts for its regime).
    error : str or None
        Why there is no recommendation, when there is none.
    training : TrainingSection or None
        The training section, when the database has training runs.
    """
    if isinstance(recs, Recommendation):
        recs = {recs.regime or "": recs}
    recs = recs or {}
    items = [_use(rec) for rec in recs.values()] if frame is not None else []
    if frame is not None and not recs:
        items.append(Bullet((Span("Use", "strong"), f": no recommendation ({error or 'no growth strategy is eligible'})"
                                                    ".")))
    chosen = [rec for rec in recs.values() if rec.spec is not None]
    prefer = [*(line for rec in chosen for line in _quality_exceptions(rec) + _faster(rec)),
              *(_training_exceptions(training) if training is not None else [])]
    if prefer:
        items.append(Bullet((Span("Prefer something else", "strong"), ":"), tuple(prefer)))
    changes = _ablation_statements(frame) if frame is not None else []
    moot = [*changes, *(_training_settings(training) if training is not None else []),
            *([NEGLIGIBLE_RULE] if changes else [])]
    if moot:
        items.append(Bullet((Span("What does not matter", "strong"), ":"), tuple(moot)))
    intro = Paragraph.of("What the data below say, in short, regime by regime (device × width d_e); every number is "
                         "a median, explained in the sections that follow.")
    return Section(TITLE, [intro, Bullets(items)], anchor="advice")
