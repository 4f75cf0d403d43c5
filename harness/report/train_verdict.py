"""Whether growth during training meets its two targets, per dataset, and how the variants compare.

Target (a): ``default`` growth reaches ``fixed-large``'s median final held-out loss at no more
than 0.7 × fixed-large's median total FLOPs (on the median curve over seeds). Target (b):
``default``'s final held-out loss is no higher than each of ``random``, ``zero``, ``gradmax``,
``fixed-small`` and ``fixed-large``'s on every seed; beside each count, the mean paired change
of the final held-out loss over seeds, with its 95 % t interval, says whether the difference is
beyond seed noise. Both use the variants at default settings (one head, ``rescale``, ``pad``,
``schedule``). Why a target is missed is measured too: the held-out loss just before and just
after each growth (recorded with every growth event), for the default and the baselines that grow,
and where that advantage goes in the training that follows (:func:`advantage_along`: default
against zero, paired over seeds, at every evaluation).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from growbench.harness.report.train_runs import (
    BASELINES,
    COMPARISONS,
    SCHEDULE_FIELDS,
    SETUP_FIELDS,
    growth_steps,
    median_curves,
    prepare,
    stored_json,
    table_row,
    training_table,
)
from growbench.harness.report.wording import four_digits, plural, ratio, three_digits
from growbench.harness.rule.paired import Paired

#: Target (a): the FLOPs at which default growth first reaches fixed-large's final held-out loss, as a share of
#: fixed-large's total FLOPs, at most this.
FLOPS_TARGET = 0.7
#: The methods default growth must end no higher than, on every seed (target (b)).
TARGET_BASELINES = (*BASELINES, "fixed-small", "fixed-large")
#: The growing methods whose held-out effect at each growth the verdict reports.
GROWERS = ("default", *BASELINES)
NEGATIVE = "A target that is not met is reported as measured, not hidden."
# How each compared variant is called inside its group (the setting that differs).
SETTING_NAMES = {
    "scale policy (default)": {"default": "rescale", "default fixed": "fixed", "default learnable": "learnable"},
    "scale policy (fixed-large)": {"fixed-large": "rescale", "fixed-large fixed": "fixed",
                                   "fixed-large learnable": "learnable"},
    "Adam state": {"default": "pad", "default reset": "reset"},
    "trigger": {"default": "schedule", "default bottleneck": "bottleneck"},
}


@dataclass
class Verdict:
    """The verdict of one panel: ``None`` for a target that could not be judged (runs missing).

    ``text`` is ``parts`` (target (a), target (b), other comparisons, ...) joined; ``numbers`` holds the
    medians the targets were judged on.
    """

    dataset: str
    matches_fixed_large: bool | None
    beats_baselines: bool | None
    text: str
    numbers: dict = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)


def _finals(runs: pd.DataFrame, panel: str, variant: str) -> pd.Series:
    """``variant``'s final held-out loss in ``panel`` per seed (successful runs only)."""
    ok = runs[(runs.panel == panel) & (runs.status == "ok") & (runs.variant == variant)]
    return ok.groupby("seed").final_heldout.median()


def _paired_finals(runs: pd.DataFrame, panel: str, a: str, b: str, panel_b: str | None = None) -> pd.DataFrame:
    """Per seed both ran successfully: ``a``'s final held-out loss in ``panel`` and ``b``'s in ``panel_b``
    (default the same panel), as columns ``a``, ``b``."""
    x, y = _finals(runs, panel, a), _finals(runs, panel_b or panel, b)
    return pd.concat([x.rename("a"), y.rename("b")], axis=1, join="inner")


def _change(both: pd.DataFrame) -> Paired:
    """Column ``a`` relative to ``b`` (``a / b − 1``, + = ``a`` ends higher), its mean over the rows and the 95 % t
    interval of that mean (:class:`harness.recommend.Paired`): whether a difference between two methods is beyond
    seed-to-seed noise."""
    return Paired.of((both.a / both.b - 1).to_numpy())


def noise_word(change: Paired) -> str:
    """``beyond seed noise`` when ``change``'s interval excludes 0, ``within seed noise`` when it spans 0, and
    nothing from one seed (no interval)."""
    if change.n < 2:
        return ""
    return "beyond seed noise" if change.low > 0 or change.high < 0 else "within seed noise"


def change_text(change: Paired) -> str:
    """``+1.2% [+0.3%, +2.1%], beyond seed noise`` (or ``within seed noise``; no interval from one seed)."""
    if change.n < 2:
        return f"{100 * change.mean:+.3g}% (one seed: no noise estimate)"
    return (f"{100 * change.mean:+.3g}% [{100 * change.low:+.3g}%, {100 * change.high:+.3g}%], "
            f"{noise_word(change)}")


def measured_groups(table: pd.DataFrame, panel: str) -> list[tuple[str, list[tuple[str, pd.Series]]]]:
    """The comparison groups with two or more measured variants in ``panel``, with their table rows."""
    out = []
    for group, names in COMPARISONS:
        have = [(v, table_row(table, panel, v)) for v in names]
        have = [(v, r) for v, r in have if r is not None and math.isfinite(r.final_heldout)]
        if len(have) >= 2:
            out.append((group, have))
    return out


def comparison_text(table: pd.DataFrame, panel: str) -> list[str]:
    """One sentence per comparison group with two or more measured variants in ``panel`` (medians over seeds)."""
    out = []
    for group, have in measured_groups(table, panel):
        setting = SETTING_NAMES.get(group, {})
        parts = [f"{setting.get(v, v)} {four_digits(r.final_heldout)}" for v, r in have]
        best_v, best_r = min(have, key=lambda t: t[1].final_heldout)
        ref_v, ref_r = have[0]
        text = f"{group}: median final held-out {', '.join(parts)}; lowest: {setting.get(best_v, best_v)}"
        if best_v != ref_v:
            text += (f" ({100 * (best_r.final_heldout / ref_r.final_heldout - 1):+.2g}% vs "
                     f"{setting.get(ref_v, ref_v)})")
        if group == "trigger":
            text += (f"; growths {', '.join(f'{setting.get(v, v)} {four_digits(r.n_growths)}' for v, r in have)}, "
                     f"total FLOPs {', '.join(f'{setting.get(v, v)} {three_digits(r.total_flops)}' for v, r in have)}")
        out.append(text)
    return out


def _target_a(default: pd.Series | None, fixed_large: pd.Series | None, curve: pd.DataFrame,
              numbers: dict) -> tuple[bool | None, str]:
    """Target (a) and its sentence from ``default``'s median curve; fills ``numbers`` with what it was judged on."""
    if default is None or fixed_large is None:
        missing = " and ".join(v for v, r in (("default", default), ("fixed-large", fixed_large)) if r is None)
        return None, f"(a) not judged: no successful {missing} run."
    if curve.empty:
        return None, "(a) not judged: no curve of the default's runs."
    goal, budget = fixed_large.final_heldout, fixed_large.total_flops
    reached = curve[curve.heldout <= goal].sort_values("flops")
    at = float(reached.flops.iloc[0]) if len(reached) else math.nan
    numbers.update(default_final=default.final_heldout, fixed_large_final=goal,
                   loss_ratio=default.final_heldout / goal, reach_flops=at, fixed_large_flops=budget,
                   flops_ratio=at / budget if budget else math.nan)
    target = f"target ≤ ×{FLOPS_TARGET:g} of fixed-large's {three_digits(budget)} FLOPs"
    if not len(reached):
        return False, (f"(a) NOT met: default growth never reaches fixed-large's final held-out loss "
                       f"{four_digits(goal)} (its own final: {four_digits(default.final_heldout)}, "
                       f"×{ratio(default.final_heldout / goal)}; {target}).")
    met = bool(at <= FLOPS_TARGET * budget)
    return met, (f"(a) {'met' if met else 'NOT met'}: default growth reaches fixed-large's final held-out loss "
                 f"{four_digits(goal)} at {three_digits(at)} FLOPs (×{ratio(at / budget)}; {target}).")


def _target_b(runs: pd.DataFrame, table: pd.DataFrame, panel: str, default: pd.Series | None,
              numbers: dict) -> tuple[bool | None, str]:
    """Target (b) and its sentence: default's final held-out loss no higher than each baseline's, seed by seed."""
    if default is None:
        return None, "(b) not judged: no successful default run."
    measured = {v: r for v in TARGET_BASELINES if (r := table_row(table, panel, v)) is not None}
    missing = [v for v in TARGET_BASELINES if v not in measured]
    if not measured:
        return None, "(b) not judged: no baseline ran."
    parts, lost = [], []
    for v, r in measured.items():
        both = _paired_finals(runs, panel, "default", v)
        wins, n, change = int((both.a <= both.b).sum()), len(both), _change(both)
        parts.append(f"{v} {four_digits(r.final_heldout)} (default no higher on {wins} of {plural(n, 'seed')}; "
                     f"default against it {change_text(change)})")
        numbers[f"{v}_final"] = r.final_heldout
        numbers[f"{v}_change"] = change
        if wins < n:
            lost.append(v)
    if lost:
        met: bool | None = False
        head = f"(b) NOT met: default ends above {', '.join(lost)} on some seed"
    elif missing:
        met, head = None, f"(b) not fully judged: default is no higher than the measured baselines, but " \
                          f"{', '.join(missing)} did not run"
    else:
        met, head = True, "(b) met: default ends no higher than every baseline on every seed"
    return met, (f"{head}: median final held-out loss default {four_digits(default.final_heldout)}, "
                 + ", ".join(parts) + ".")


def growth_effects(runs: pd.DataFrame, panel: str) -> dict[str, tuple[float, int]]:
    """Per growing method of ``panel``: the median over its growths (all seeds) of the relative change of the
    held-out loss across the growth itself, and the number of growths (events that recorded it)."""
    out = {}
    ok = runs[(runs.panel == panel) & (runs.status == "ok")]
    for v in GROWERS:
        changes = []
        for events in ok[ok.variant == v].events:
            seen = set()
            for e in stored_json(events, []):
                if not isinstance(e, dict) or "heldout_after" not in e or e.get("step") in seen:
                    continue
                seen.add(e.get("step"))  # one record per growth event, not per head
                before = e["heldout_before"]
                if before:
                    changes.append((e["heldout_after"] - before) / before)
        if changes:
            out[v] = (float(np.median(changes)), len(changes))
    return out


def _effects_text(effects: dict[str, tuple[float, int]]) -> str | None:
    if not effects:
        return None
    return ("The growth itself, on held-out data (median relative change of the held-out loss across a growth, "
            "before any training step): " + ", ".join(f"{v} {100 * c:+.3g}% over {plural(n, 'growth')}"
                                                      for v, (c, n) in effects.items()) + ".")


def advantage_along(runs: pd.DataFrame, curves: pd.DataFrame, panel: str, baseline: str = "zero"
                    ) -> list[tuple[int, Paired]]:
    """Where a growth's advantage goes: at each evaluation step, ``default``'s held-out loss relative to
    ``baseline``'s (``default / baseline − 1``), its mean over the seeds both ran and 95 % t interval.

    Parameters
    ----------
    runs : pandas.DataFrame
        Prepared training runs (with ``panel``).
    curves : pandas.DataFrame
        Stored curve points (``key``, ``step``, ``heldout_loss``).
    panel, baseline : str

    Returns
    -------
    list of (int, Paired)
        By step; empty when either method has no successful run with a curve.
    """
    ok = runs[(runs.panel == panel) & (runs.status == "ok") & runs.variant.isin(["default", baseline])]
    points = curves.merge(ok[["key", "variant", "seed"]], on="key")
    if points.empty or points.variant.nunique() < 2:
        return []
    table = points.pivot_table(index=["step", "seed"], columns="variant", values="heldout_loss").dropna()
    return [(int(step), Paired.of((g["default"] / g[baseline] - 1).to_numpy()))
            for step, g in table.groupby(level="step")]


def _advantage_text(along: list[tuple[int, Paired]], growths: list[int], baseline: str) -> str | None:
    """The paired change at the first evaluation after each growth and at the last step, as one sentence."""
    steps = [s for s, _ in along]
    picked = {next(s for s in steps if s > g): f"after the growth at step {g}" for g in growths
              if steps and steps[-1] > g}
    if not picked:
        return None
    picked[steps[-1]] = "at the end"
    by_step = dict(along)
    return (f"Where each growth's advantage goes (default against {baseline}, paired change of the held-out loss at "
            f"the first evaluation after each growth and at the end; + = the default is higher): "
            + "; ".join(f"{label} (step {s}): {change_text(by_step[s])}" for s, label in sorted(picked.items()))
            + ".")


def panel_verdict(runs: pd.DataFrame, table: pd.DataFrame, panel: str, curves: pd.DataFrame | None = None,
                  raw_curves: pd.DataFrame | None = None) -> Verdict:
    """Judge ``default`` growth on one panel against targets (a) and (b) (see the module docstring); ``curves``
    are the median curves, ``raw_curves`` the stored ones (for :func:`advantage_along` against ``zero``)."""
    default, fixed_large = table_row(table, panel, "default"), table_row(table, panel, "fixed-large")
    numbers: dict = {}
    curve = (curves[(curves.panel == panel) & (curves.variant == "default")] if curves is not None and len(curves)
             else pd.DataFrame(columns=["flops", "heldout"]))
    a, text_a = _target_a(default, fixed_large, curve, numbers)
    b, text_b = _target_b(runs, table, panel, default, numbers)
    effects = growth_effects(runs, panel)
    numbers["growth_effects"] = effects
    along = advantage_along(runs, raw_curves, panel) if raw_curves is not None and len(raw_curves) else []
    numbers["advantage_over_zero"] = along
    advantage = _advantage_text(along, growth_steps(runs, panel), "zero")
    parts = [text_a, text_b, *filter(None, [_effects_text(effects), advantage])]
    parts += [f"{t[0].upper()}{t[1:]}." for t in comparison_text(table, panel)]
    if a is False or b is False:
        parts.append(NEGATIVE)
    return Verdict(panel, a, b, " ".join(parts), numbers, parts)


def verdicts(runs: pd.DataFrame, table: pd.DataFrame | None = None, curves: pd.DataFrame | None = None
             ) -> list[Verdict]:
    """One :func:`panel_verdict` per panel of ``runs``; ``curves`` are the stored curves (target (a) reads their
    median over seeds)."""
    if runs.empty:
        return []
    if "panel" not in runs:
        runs = prepare(runs)
    table = training_table(runs) if table is None else table
    medians = median_curves(runs, curves) if curves is not None else None
    return [panel_verdict(runs, table, p, medians, curves) for p in sorted(runs.panel.unique())]


@dataclass
class ScheduleComparison:
    """Default growth on one schedule against the growing methods on another, for a dataset run on both.

    ``changes`` maps each method of the other schedule to the default's paired change against it
    (``default here / method there − 1``, + = the default here ends higher).
    """

    dataset: str
    schedule: str
    other: str
    changes: dict[str, Paired]
    wins: dict[str, tuple[int, int]]
    flops: tuple[float, float]

    @property
    def text(self) -> str:
        """The comparison in one sentence."""
        against = "; ".join(f"against {m} there {change_text(c)} (no higher on {self.wins[m][0]} of "
                            f"{plural(self.wins[m][1], 'seed')})" for m, c in self.changes.items())
        return (f"Default growth with {self.schedule} against the growing methods with {self.other} (final held-out "
                f"loss, paired by seed; + = higher with {self.schedule}): {against}. The default's median total FLOPs: "
                f"{self.flops[0]:.3g} with {self.schedule}, {self.flops[1]:.3g} with {self.other}.")


def schedule_comparisons(runs: pd.DataFrame) -> list[ScheduleComparison]:
    """For each dataset run on two growth schedules with the same sizes and settings (panels that differ only in
    :data:`~harness.report.train_runs.SCHEDULE_FIELDS`), default growth on the schedule where it ends lower
    against default, random and zero on the other: whether the schedule, rather than the step, decides the final
    loss."""
    if runs.empty:
        return []
    if "panel" not in runs:
        runs = prepare(runs)
    out = []
    growers = runs[runs.variant == "default"]
    for dataset, same in growers.groupby("dataset", sort=True):
        per_panel = same.groupby("panel")
        setups = per_panel[list(SETUP_FIELDS)].first().astype(str)
        schedules = per_panel[list(SCHEDULE_FIELDS)].first()
        differ = [f for f in SCHEDULE_FIELDS if schedules[f].nunique() > 1]
        label = {pnl: ", ".join(f"{f}={row[f]}" for f in differ) for pnl, row in schedules.iterrows()}
        for pair in itertools.combinations(sorted(same.panel.unique()), 2):
            if not setups.loc[pair[0]].equals(setups.loc[pair[1]]):
                continue
            # The schedule on which the default ends lower (median over seeds) is the one compared.
            here, there = sorted(pair, key=lambda pnl: _finals(runs, pnl, "default").median())
            changes, wins = {}, {}
            for method in ("default", "random", "zero"):
                both = _paired_finals(runs, here, "default", method, there)
                if len(both):
                    changes[method], wins[method] = _change(both), (int((both.a <= both.b).sum()), len(both))
            if changes:
                flops = tuple(float(per_panel.total_flops.median()[pnl]) for pnl in (here, there))
                out.append(ScheduleComparison(str(dataset), label[here], label[there], changes, wins, flops))
    return out


def overall_text(judged: list[Verdict]) -> str:
    """One sentence counting the panels where each target was met."""
    def count(attr: str) -> str:
        values = [getattr(v, attr) for v in judged if getattr(v, attr) is not None]
        return f"{sum(values)} of {plural(len(values), 'dataset')}"

    return (f"Target (a), default growth reaches fixed-large's final held-out loss at no more than "
            f"{FLOPS_TARGET:g}× its FLOPs: met on {count('matches_fixed_large')}. Target (b), default growth ends no "
            f"higher than random, zero, gradmax, fixed-small and fixed-large on every seed: met on "
            f"{count('beats_baselines')}.")
