"""The rule: one regime's runs in, its choice, verdict and evidence out (:class:`Recommendation`).

One module of the recommendation (:mod:`harness.recommend` states the rule and lists the modules): steps 3 to 7,
on the runs :mod:`harness.rule.reference` selects and the statistics of :mod:`harness.rule.paired`; the words
come from :mod:`harness.rule.wording`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from growbench.harness.rule.loading import NoResults, first_error, is_growth, preset_names
from growbench.harness.rule.paired import SeedRuns, finite, interval, shortfall
from growbench.harness.rule.parameters import (
    CLOSEST,
    CONFIDENCE,
    DECIDING,
    DIAGNOSTICS,
    DOES_NOT_GENERALISE,
    GENERALISES,
    TIME_TOLERANCE,
    TOLERANCE,
)
from growbench.harness.rule.reference import (
    cell_description,
    dataset_name,
    reference_runs,
    regimes_with_runs,
    run_regimes,
)
from growbench.harness.rule.wording import budgets_tried, explain_choice, regime_statement, rule_text
from growbench.strategies.regimes import Regime
from growbench.strategies.spec import REFERENCE_REGIME


@dataclass
class Recommendation:
    """One regime's choice, why, and the evidence.

    Attributes
    ----------
    spec : str or None
        The chosen growth spec (None: no strategy is eligible).
    verdict : str
        :data:`GENERALISES` (a strategy qualifies), :data:`CLOSEST` (some lower the held-out loss
        everywhere, none is within the tolerance of the best everywhere) or :data:`DOES_NOT_GENERALISE`.
    statement : str
        The verdict in plain words (what to do when growth does not generalise).
    fallback : bool
        The choice does not qualify (the last two verdicts).
    """

    spec: str | None
    rule: str
    fallback: bool
    tolerance: float
    datasets: list[str]
    cells: dict[str, str]
    evidence: dict = field(default_factory=dict)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    excluded_baselines: list[str] = field(default_factory=list)
    regime: str | None = None
    #: With a fallback: the datasets where the choice misses the rule, and how.
    forced_by: list[dict] = field(default_factory=list)
    #: The qualifying strategies as fast as the front-runner (rule step 6): ``{spec: time / front-runner's}``.
    as_fast: dict[str, float] = field(default_factory=dict)
    verdict: str = GENERALISES
    statement: str = ""

    @property
    def runners_up(self) -> pd.DataFrame:
        """Every other growth strategy's row of the table, by time."""
        return self.table[self.table.strategy != self.spec]

    @property
    def runner_up(self) -> pd.Series | None:
        """The fastest other eligible strategy (it lost on quality if faster, on time if slower), or None."""
        others = self.runners_up[self.runners_up.eligible]
        return others.iloc[0] if len(others) else None

    @property
    def generalises(self) -> bool:
        """Some strategy lowers the held-out loss beyond noise on every dataset of the regime."""
        return self.verdict != DOES_NOT_GENERALISE

    def as_json(self, db: str | None = None) -> dict:
        """This regime's entry of ``strategies/default.json`` (key ``spec`` first)."""
        regime = Regime.parse(self.regime) if self.regime else None
        return {
            "spec": self.spec,
            "regime": regime.describe() if regime else None,
            "verdict": self.verdict,
            "generalises": self.generalises,
            "statement": self.statement,
            "fallback": self.fallback,
            "tolerance": self.tolerance,
            "forced_by": self.forced_by,
            "as_fast": self.as_fast,
            "datasets": self.cells,
            "evidence": self.evidence,
            "runners_up": [
                {"strategy": r.strategy, "time_ms": finite(r.time_ms), "reason": r.reason}
                for r in self.runners_up.itertuples()
            ],
            "db": db,
            "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        }


def recommend(frame: pd.DataFrame, tolerance: float = TOLERANCE, device: str | None = None,
              time_metric: str = "t_total", regime: Regime | str | None = None,
              confidence: float = CONFIDENCE) -> Recommendation:
    """Apply the rule of the module docstring to the runs of one regime (as from :func:`load_frame`).

    Parameters
    ----------
    frame : pandas.DataFrame
        Every run of the database, failed ones included (they make a strategy ineligible in their regime).
    tolerance : float
        How far below the best's mean held-out gain a strategy may be, as a share of it, beyond noise.
    device : str, optional
        Compare the runs of this device only (within the regime).
    time_metric : {"t_total", "x_floor"}
        ``"t_total"`` (the rule) or ``"x_floor"`` (``t_total / t_floor``, a robustness check).
    regime : Regime or str, optional
        The regime (``"cpu/small"``, ...) whose runs count; default the regime with the most
        successful growth runs (of ``device``'s kind when given).
    confidence : float
        Confidence of the intervals.

    Returns
    -------
    Recommendation

    Raises
    ------
    NoResults
        No successful run (in the regime).
    ValueError
        An unknown ``time_metric`` or regime, or a tolerance that is not a finite number >= 0.
    """
    _check_rule_arguments(tolerance, time_metric)
    key = "time_ms" if time_metric == "t_total" else "x_floor"
    if frame[frame.status == "ok"].empty:
        raise NoResults("no successful runs in the database")
    if device is not None:
        frame = frame[frame.device == device]
    regime = _pick_regime(frame, regime)
    frame = frame[run_regimes(frame) == regime.key] if len(frame) else frame
    if frame[frame.status == "ok"].empty:
        raise NoResults(f"no successful runs in the regime {regime.describe()}")
    ref = reference_runs(frame)
    runs = SeedRuns.of(ref, confidence)
    failures = _failure_notes(frame)
    every_growth = sorted({s for s in frame.strategy.dropna().unique() if is_growth(s)})
    baselines = sorted({s for s in frame.strategy.dropna().unique() if not is_growth(s)})
    partial = runs.missing_seeds()
    eligible = {s for s in every_growth
                if s not in failures and s not in partial and runs.datasets_of(s) >= set(runs.datasets)}
    best = runs.best(eligible)
    growable = runs.growable(eligible)
    # Where growth is noise, a strategy may give back at most the tolerance's share of the typical best gain of the
    # datasets where it works (gains are shares of each dataset's held-out loss, so they compare across datasets).
    margin = tolerance * float(np.median([abs(best[ds][0]) for ds in growable])) if growable else math.nan
    names = preset_names()
    rows = [_strategy_row(s, runs, best, s in eligible, failures.get(s) or partial.get(s), tolerance, names,
                          growable, margin)
            for s in every_growth]
    table = pd.DataFrame(rows, columns=["strategy", "preset", "time_ms", "x_floor", "eligible", "lowers", "within",
                                        "qualifies", "worst_shortfall", "worst_dataset", "worst_dataset_gain",
                                        "worst_dataset_best", "mean_shortfall", "worst_gain", "harmless",
                                        "qualifies_growable", "lowers_growable", "worst_shortfall_growable",
                                        "mean_shortfall_growable", "misses", "reason"])
    table = table.sort_values([key, "strategy"], na_position="last", kind="stable").reset_index(drop=True)
    tied = as_fast(table, key)
    chosen, verdict = _choose(table, key, tied)
    evidence, forced_by, statement = {}, [], ""
    if chosen is not None:
        explain_choice(table, chosen, verdict, key, tied)
        evidence = _evidence(chosen, runs, best, ref, table, tolerance)
        for ds, resolvable in runs.resolvable(eligible, best).items():
            if ds in evidence:
                evidence[ds]["resolvable_shortfall"] = finite(resolvable)
        if verdict != GENERALISES:
            forced_by = table.loc[table.strategy == chosen, "misses"].iloc[0]
        budgets = {ds: budgets_tried(frame, dataset_name(ds), confidence) for ds in runs.datasets}
        statement = regime_statement(table.loc[table.strategy == chosen].iloc[0], verdict, runs, eligible, evidence,
                                     tolerance, regime, budgets)
    table["rank"] = range(1, len(table) + 1)
    return Recommendation(spec=chosen, rule=rule_text(tolerance, time_metric, confidence),
                          fallback=chosen is not None and verdict != GENERALISES, tolerance=tolerance,
                          datasets=runs.datasets, cells=cell_description(ref), evidence=evidence,
                          table=table.drop(columns="misses"), excluded_baselines=baselines, regime=regime.key,
                          forced_by=forced_by, as_fast=tied, verdict=verdict, statement=statement)

def recommend_regimes(frame: pd.DataFrame, tolerance: float = TOLERANCE, time_metric: str = "t_total",
                      confidence: float = CONFIDENCE) -> dict[str, Recommendation]:
    """:func:`recommend` in every regime with a successful growth run: ``{regime key: Recommendation}``.

    Raises
    ------
    NoResults
        No successful growth run at all.
    """
    _check_rule_arguments(tolerance, time_metric)
    present = regimes_with_runs(frame)
    if not present:
        raise NoResults("no successful growth runs in the database")
    return {r.key: recommend(frame, tolerance, time_metric=time_metric, regime=r, confidence=confidence)
            for r in present}


def primary_regime(frame: pd.DataFrame) -> Regime:
    """The regime :func:`recommend` uses when none is given: the one with the most successful growth runs."""
    return _pick_regime(frame, None)


def _pick_regime(frame: pd.DataFrame, regime: Regime | str | None) -> Regime:
    if isinstance(regime, Regime):
        return regime
    if regime is not None:
        return Regime.parse(regime)
    present = regimes_with_runs(frame)
    if not present:
        ok = frame[frame.status == "ok"]
        return Regime.of(ok.device.iloc[0], int(ok.d_e.iloc[0])) if len(ok) else REFERENCE_REGIME
    counts = run_regimes(frame[(frame.status == "ok") & frame.strategy.map(is_growth)]).value_counts()
    return max(present, key=lambda r: counts.get(r.key, 0))  # ties: the first (cpu, narrowest)


def _check_rule_arguments(tolerance: float, time_metric: str) -> None:
    """Refuse an unknown time metric or a tolerance that is not a finite number >= 0 (a bool is not a number)."""
    if time_metric not in ("t_total", "x_floor"):
        raise ValueError(f"unknown time metric {time_metric!r}; valid: t_total, x_floor")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


def _failure_notes(frame: pd.DataFrame) -> dict[str, str]:
    """``{strategy: "failed N of M runs (first: <error>)"}`` for every strategy with a failed run."""
    n_runs = frame.groupby("strategy").size()
    return {s: f"failed {len(runs)} of {int(n_runs[s])} runs (first: {first_error(runs.error)})"
            for s, runs in frame[frame.status != "ok"].groupby("strategy")}


def _judged(strategy: str, runs: SeedRuns, best: dict, tolerance: float) -> list[dict]:
    """Rule step 4 for ``strategy`` on each of its datasets: its gain's interval, whether it lowers the held-out
    loss, its paired difference to the best and whether it is within the tolerance, and its shortfall."""
    out = []
    for ds in runs.datasets:
        if ds not in runs.datasets_of(strategy) or ds not in best:
            continue
        b, who = best[ds]
        gain, diff = runs.gain(strategy, ds), runs.paired(strategy, who, ds)
        out.append({"dataset": ds, "gain": gain, "lowers": gain.above_zero(), "best": b, "best_strategy": who,
                    "difference": diff, "within": diff.non_inferior(b, tolerance),
                    "shortfall": shortfall(gain.mean, b)})
    return out


def _strategy_row(strategy: str, runs: SeedRuns, best: dict, eligible: bool, failure: str | None,
                  tolerance: float, names: dict[str, str], growable: list[str], margin: float) -> dict:
    """One line of the recommendation's table: times, eligibility, the rule's verdicts and the reasons it may lose,
    and the same verdicts on the ``growable`` datasets only, with whether it is harmless on the others (the lower
    end of its gain's interval at least ``−margin`` on each: rule step 7)."""
    judged = _judged(strategy, runs, best, tolerance)
    on_growable = [j for j in judged if j["dataset"] in growable]
    complete_growable = bool(on_growable) and len(on_growable) == len(growable)
    missing = [ds for ds in runs.datasets if ds not in runs.datasets_of(strategy)]
    reasons = [failure] if failure else []
    if missing:
        reasons.append(f"no run on {', '.join(missing)}")
    misses = []
    for j in judged:
        if not j["lowers"]:
            misses.append({"dataset": j["dataset"], "measure": "lowers", "gain": interval(j["gain"])})
            reasons.append(f"{j['dataset']}: does not lower the held-out loss beyond noise (gain "
                           f"{j['gain'].describe(percent=True)})")
        if not j["within"]:
            misses.append({"dataset": j["dataset"], "measure": "within", "gain": finite(j["gain"].mean),
                           "best": finite(j["best"]), "best_strategy": j["best_strategy"],
                           "difference": interval(j["difference"])})
            reasons.append(f"{j['dataset']}: not shown within {100 * tolerance:g}% of the best's gain "
                           f"({100 * j['gain'].mean:.3g}% vs {100 * j['best']:.3g}%, paired difference "
                           f"{j['difference'].describe(percent=True)})")
    complete = bool(judged) and not missing
    # The dataset of the worst shortfall, with the gains behind it: the advice says it in words, not as a percentage.
    worst = max(judged, key=lambda j: j["shortfall"], default=None)
    return dict(strategy=strategy, preset=names.get(strategy, ""),
                time_ms=1e3 * runs.over_datasets(strategy, "t_total"), x_floor=runs.over_datasets(strategy, "x_floor"),
                eligible=eligible, lowers=complete and all(j["lowers"] for j in judged),
                within=complete and all(j["within"] for j in judged),
                qualifies=eligible and complete and not misses,
                worst_shortfall=max((j["shortfall"] for j in judged), default=math.inf),
                worst_dataset=worst["dataset"] if worst else None,
                worst_dataset_gain=worst["gain"].mean if worst else math.nan,
                worst_dataset_best=worst["best"] if worst else math.nan,
                mean_shortfall=float(np.mean([min(j["shortfall"], 1.0) for j in judged])) if judged else math.nan,
                worst_gain=min((j["gain"].mean for j in judged), default=-math.inf),
                harmless=complete and all(j["gain"].n > 1 and j["gain"].low >= -margin
                                          for j in judged if j["dataset"] not in growable),
                qualifies_growable=eligible and complete_growable and all(j["lowers"] and j["within"]
                                                                          for j in on_growable),
                lowers_growable=eligible and complete_growable and all(j["lowers"] for j in on_growable),
                worst_shortfall_growable=max((j["shortfall"] for j in on_growable), default=math.inf),
                mean_shortfall_growable=(float(np.mean([min(j["shortfall"], 1.0) for j in on_growable]))
                                         if on_growable else math.nan),
                misses=misses, reason="; ".join(reasons))


def as_fast(table: pd.DataFrame, key: str, qualifies: str = "qualifies") -> dict[str, float]:
    """The strategies of ``table`` whose column ``qualifies`` holds, as fast as the front-runner (rule step 6),
    each with its time as a multiple of the front-runner's (the front-runner first, at 1). ``table`` is sorted by
    time, strategies without a time (their runs' times unusable) last.

    When no qualifying strategy has a time, time cannot tell them apart: all count as as fast, each at 1."""
    qualifying = table[table[qualifies]]
    if qualifying.empty:
        return {}
    front = float(qualifying.iloc[0][key])
    if not math.isfinite(front):
        return dict.fromkeys(qualifying.strategy, 1.0)
    return {r.strategy: float(getattr(r, key)) / front for r in qualifying.itertuples()
            if getattr(r, key) <= (1 + TIME_TOLERANCE) * front}


def _closest_to_best(rows: pd.DataFrame, shortfall: str, key: str) -> str:
    """The strategy of ``rows`` with the smallest ``shortfall`` column (ties: the faster, then the spec)."""
    return rows.sort_values([shortfall, key, "strategy"], kind="stable").iloc[0].strategy


def _choose(table: pd.DataFrame, key: str, tied: dict[str, float]) -> tuple[str | None, str]:
    """``(choice, verdict)`` by rule steps 6 and 7; ``(None, verdict)`` when no strategy is eligible."""
    if tied:
        return _closest_to_best(table[table.strategy.isin(list(tied))], "mean_shortfall", key), GENERALISES
    eligible = table[table.eligible]
    lowering = eligible[eligible.lowers]
    if len(lowering):
        return _closest_to_best(lowering, "worst_shortfall", key), CLOSEST
    if len(eligible):
        return _spared(eligible, key), DOES_NOT_GENERALISE
    return None, DOES_NOT_GENERALISE


def _spared(eligible: pd.DataFrame, key: str) -> str:
    """Rule step 7 where growth does not generalise: steps 5–7 on the growable datasets among the harmless
    strategies (``eligible`` sorted by time), else the one that harms least."""
    harmless = eligible[eligible.harmless]
    tied = as_fast(harmless, key, "qualifies_growable")
    if tied:
        return _closest_to_best(harmless[harmless.strategy.isin(list(tied))], "mean_shortfall_growable", key)
    lowering = harmless[harmless.lowers_growable]
    if len(lowering):
        return _closest_to_best(lowering, "worst_shortfall_growable", key)
    return _closest_to_best(eligible.assign(harm=-eligible.worst_gain), "harm", key)


def _evidence(chosen: str, runs: SeedRuns, best: dict, ref: pd.DataFrame, table: pd.DataFrame,
              tolerance: float) -> dict:
    """The choice's held-out gain against the best per dataset, with its intervals and per-seed counts, and the
    step's diagnostics; its summaries over datasets."""
    evidence = {}
    for j in _judged(chosen, runs, best, tolerance):
        ds = j["dataset"]
        lowered, raised = runs.seed_verdicts(chosen, ds)
        evidence[ds] = {
            "time_ms": finite(1e3 * runs.value(chosen, ds, "t_total")),
            "x_floor": finite(runs.value(chosen, ds, "x_floor")),
            "seeds": int(((ref.strategy == chosen) & (ref.dataset == ds)).sum()),
            "heldout_gain": interval(j["gain"]),
            "lowers": j["lowers"],
            "seeds_lowered": lowered,
            "seeds_raised": raised,
            "best_heldout_gain": finite(j["best"]),
            "best_strategy": j["best_strategy"],
            "difference": interval(j["difference"]),
            "within": j["within"],
            **{q: finite(runs.value(chosen, ds, q)) for q in DIAGNOSTICS},
            "statistics_tokens": finite(runs.value(chosen, ds, "statistics_tokens")),
            "tokens_per_d_e2": finite(runs.value(chosen, ds, "statistics_tokens") / runs.value(chosen, ds, "d_e") ** 2),
        }
    row = table.loc[table.strategy == chosen].iloc[0]
    evidence["median_time_ms"] = finite(float(row.time_ms))
    evidence["median_x_floor"] = finite(float(row.x_floor))
    evidence["median_heldout_gain"] = finite(runs.over_datasets(chosen, DECIDING, "means"))
    for q in DIAGNOSTICS:
        evidence[f"median_{q}"] = finite(runs.over_datasets(chosen, q))
    evidence["mean_shortfall"] = finite(float(row.mean_shortfall))
    evidence["worst_shortfall"] = finite(float(row.worst_shortfall))
    return evidence
