"""Choose the default strategy of each regime from a results database, by a fixed rule judged on unseen data.

The rule (:func:`rule_text`), applied by :func:`recommend` to the runs of one regime
(device kind × band of widths, :mod:`strategies.regimes`) and by
:func:`recommend_regimes` to each regime with runs:

1. **Regime.** Only the runs of the regime count: its device kind (cpu, or cuda for any
   accelerator) and its band of ``d_e`` (≤ 128, 128–1024, > 1024).
2. **Reference configuration.** For each dataset, only the runs of its *reference
   configuration* count: the group of runs sharing sizes (``d_s, d_e, b, d_k, p``),
   ``n_batches``, ``repeats``, ``warmup_steps``, ``dtype``, ``scale_policy``,
   ``heldout_batches`` and device that covers the most distinct strategies and, among those, has
   the most runs. Configurations that still tie each count as a dataset of their own (the scale
   set's widths within one band, say), so that the band's smallest width does not decide for its
   largest. Every strategy is thus compared on the same problems and seeds.
3. **Eligible.** Growth strategies only (the baselines ``random``, ``zero``, ``gradmax`` and
   names that are not valid specs are excluded) that never failed on any run of the regime
   and that have a successful reference run for every seed of every dataset of it.
4. **The measure that decides: the held-out gain.** A run's held-out gain is its held-out
   loss decrease as a share of the held-out loss before the growth
   (``heldout_decrease / heldout_before``, measured on ``heldout_batches`` test batches the
   step never saw). Doing nothing (``zero``) has a gain of exactly 0. Per dataset, over seeds:
   a strategy **lowers the held-out loss** there when the lower end of the 95 % Student-t
   interval of its mean gain is above 0; the **best** is the eligible strategy with the highest
   mean gain; a strategy is **within** the tolerance of the best when the lower end of the 95 %
   t interval of its paired differences to the best (by seed) is at least
   ``−tolerance · |best|``. That is a non-inferiority test: a wide interval (few seeds, noisy
   data) makes a strategy *not* within, never within, and a strategy worse than the best by
   more than the tolerance on every seed is never within (:class:`Paired`).
5. **Qualifies:** lowers the held-out loss on every dataset of the regime, and is within the
   tolerance of the best on every dataset.
6. **Speed, within noise.** Time is ``t_total`` (the growth, statistics included): the
   median over seeds per dataset, then the median of these per-dataset medians. The fastest
   qualifying strategy is the *front-runner*; a qualifying strategy at most 5 % slower
   (:data:`TIME_TOLERANCE`) is *as fast*. Among those, the one with the smallest mean shortfall
   of its mean held-out gain from the best's is chosen (ties: the faster, then the spec).
7. **When nothing qualifies.** If some strategies lower the held-out loss on every dataset,
   the one with the smallest worst shortfall from the best is chosen, flagged ``fallback``.
   If none does, growth with these statistics does not generalise in the regime: the entry
   says so in plain words (:attr:`Recommendation.statement`, with the statistics tokens
   measured), and names the strategy that ``strategies.make("default")`` then runs,
   recording that in ``fallback``: among the *harmless* strategies, the one steps 5–7 choose
   on the datasets where some strategy lowers it (the *growable* ones), so that a dataset
   where every gain is noise does not decide by its noise. Harmless is shown, not assumed:
   on every other dataset the lower end of the strategy's interval is at least ``−margin``,
   with ``margin`` the tolerance times the median over growable datasets of the best's gain
   (gains are shares of each dataset's held-out loss); a wide interval is never harmless. If
   no dataset is growable or no strategy is harmless, the one that harms least (the highest
   mean gain on its worst dataset) is named.

Batch optimality, path efficiency and the batch decrease are diagnostics of the step: they are
in the evidence to explain the choice, never part of it. The evidence (per-dataset means with
their intervals, per-seed counts, the diagnostics) and every runner-up, with the reason it lost,
come with each choice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from growbench import strategies
from growbench.harness.files import replace_file
from growbench.harness.store.dbfile import DatabaseFileError
from growbench.harness.store.results import read_runs
from growbench.harness.store.schema import RUNS
from growbench.strategies.regimes import Regime, all_regimes
from growbench.strategies.spec import REFERENCE_REGIME, check_default_choice

#: How far below the best's mean held-out gain a strategy may be, as a share of it, and still be within
#: (rule step 4): a strategy within keeps at least 80 % of the best's gain, beyond noise.
TOLERANCE = 0.2
#: How much slower than the fastest qualifying strategy another may be and still count as as fast (rule step 6).
TIME_TOLERANCE = 0.05
#: Confidence of every interval of the rule.
CONFIDENCE = 0.95
#: The measure that decides (rule step 4).
DECIDING = "heldout_gain"
#: Diagnostics of the step, shown beside the decision (medians over seeds).
DIAGNOSTICS = ("optimality", "path_efficiency", "batch_gain")
QUALITY_NAMES = {"heldout_gain": "held-out gain", "optimality": "optimality", "path_efficiency": "path efficiency",
                 "batch_gain": "batch gain"}
CELL_COLUMNS = ("d_s", "d_e", "b", "d_k", "p", "n_batches", "repeats", "warmup_steps", "dtype", "scale_policy",
                "heldout_batches", "device")
#: Verdicts of a regime (:attr:`Recommendation.verdict`).
GENERALISES, CLOSEST, DOES_NOT_GENERALISE = "generalises", "closest", "does not generalise"
RULE = (
    "Per regime (device kind x band of d_e), among growth strategies (baselines excluded) that never failed on a run "
    "of the regime and ran every seed of every dataset of it, the decision is made on the held-out gain (held-out "
    "loss decrease as a share of the held-out loss before growth, on test batches the step never saw; doing nothing "
    "gains 0). A strategy qualifies when, on every dataset, the {conf:g}% t interval of its mean gain over seeds lies "
    "above 0 (it lowers the held-out loss beyond noise) and the lower end of the {conf:g}% t interval of its paired "
    "differences to the best strategy's gain is at least -{frac:g}*|best| (non-inferior to the best, which has the "
    "highest mean gain). Among qualifying strategies, the fastest by the median over datasets of the per-dataset "
    "median {metric} is chosen; strategies within {time_tol:g}% of its time count as as fast, and among them the one "
    "with the smallest mean shortfall from the best's gain wins. If none qualifies, the one with the smallest worst "
    "shortfall among those that lower the held-out loss on every dataset is chosen (fallback); if no strategy does, "
    "growth does not generalise in the regime, and the same steps are applied to the datasets where some strategy "
    "lowers the held-out loss, among the strategies shown harmless on the others (there the lower end of their "
    "interval is at least -{frac:g} times the median best gain of those datasets); if no dataset or no strategy "
    "allows that, the strategy with the highest mean gain on its worst dataset (the one that harms least) is named. "
    "Per dataset only its reference configuration counts: the sizes/settings/device group with the most strategies "
    "(then the most runs); groups that still tie count as datasets of their own."
)
class NoResults(ValueError):
    """The database is missing, empty, or holds no successful run."""


def rule_text(tolerance: float = TOLERANCE, time_metric: str = "t_total", confidence: float = CONFIDENCE) -> str:
    """The rule in one paragraph, with the tolerance and confidence filled in."""
    metric = "t_total" if time_metric == "t_total" else "t_total/t_floor (x_floor)"
    return RULE.format(frac=tolerance, metric=metric, conf=100 * confidence, time_tol=100 * TIME_TOLERANCE)


def rule_in_brief(tolerance: float = TOLERANCE) -> str:
    """The rule's conditions in one clause, for prose that names the choice: "lowers the held-out loss beyond noise
    on every dataset and keeps at least 80% of the best's held-out gain there (...)"."""
    return (f"lowers the held-out loss beyond seed noise on every dataset and keeps, beyond noise, at least "
            f"{100 * (1 - tolerance):g}% of the best strategy's held-out gain there (times within "
            f"{100 * TIME_TOLERANCE:g}% of the fastest count as equal, and then the closer to the best wins)")


# ------------------------------------------------------------------ loading
def load_frame(db_path: str | Path) -> pd.DataFrame:
    """Every run of the database (read only), with every column of today's ``runs`` table.

    :class:`NoResults` when it is missing or has no successful run.

    A file that is not growbench's raises :class:`harness.store.dbfile.DatabaseFileError` instead
    (also a ``ValueError``), naming the file, and the file is left untouched.
    """
    path = Path(db_path)
    if not path.exists():
        raise NoResults(f"no successful runs in {path}: the file does not exist (run 'growbench run' first)")
    frame = read_runs(path, numbers=True)  # it computes with them: text in a numeric column is refused
    if frame.empty:
        raise NoResults(f"no successful runs in {path}: the database has no runs")
    frame = RUNS.complete(frame)
    n_ok = int((frame.status == "ok").sum())
    if n_ok == 0:
        first = first_error(frame.error)
        raise NoResults(f"no successful runs in {path}: all {len(frame)} runs failed (first error: {first})")
    ok = frame[frame.status == "ok"]
    for column in CONFIGURATION_COLUMNS:
        missing = ok[column].isna().to_numpy().nonzero()[0]
        if len(missing):
            raise DatabaseFileError(f"{path}: damaged growbench database: a successful run has no {column} "
                                    f"(run {ok.key.iloc[missing[0]]!r}); growbench stores it with every run")
    return frame


#: What every successful run was measured at: the rule groups and compares runs by these.
CONFIGURATION_COLUMNS = ("strategy", "dataset", "device", "d_s", "d_e", "b", "d_k", "p", "seed", "n_batches")


def first_error(errors: pd.Series) -> str:
    """The first line of text of the first stored error, skipping empty ones; a note when none is stored.

    A traceback may start with a blank line, and a failed row may carry an empty string:
    neither must hide a real message further down.
    """
    for err in errors:
        if isinstance(err, str):
            for line in err.splitlines():
                if line.strip():
                    return line.strip()
    return "no error message stored with the failed runs"


def stored_spec(name: object) -> strategies.Spec | None:
    """The :class:`strategies.Spec` of a stored strategy name, or None when it is not a valid spec.

    A database may hold names of components that are not registered in this process (an
    outside component, or one since removed): those rows are kept, as unknown.
    """
    try:
        return strategies.Spec.parse(name)
    except (ValueError, AttributeError, TypeError):
        return None


def is_growth(name: object) -> bool:
    """Whether ``name`` is a valid growth spec (not a baseline, not unknown)."""
    spec = stored_spec(name)
    return spec is not None and not spec.is_baseline


def preset_names() -> dict[str, str]:
    """``{canonical spec: preset name}``."""
    return {spec: name for name, spec in strategies.presets().items()}


def label(spec: str, names: dict[str, str] | None = None) -> str:
    """The preset name of a spec, or the spec itself."""
    names = preset_names() if names is None else names
    return names.get(spec, spec)


#: Between a dataset's name and the configuration that tells apart its tied reference configurations, in the
#: ``dataset`` column of :func:`reference_runs` ("teacher @ d_e=768").
PROBLEM_SEPARATOR = " @ "


def reference_runs(frame: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """The successful runs of each dataset's reference configurations (see the module docstring).

    Where several configurations of a dataset tie, each counts as a dataset of its own: its rows' ``dataset`` reads
    ``"<dataset> @ <what differs>"`` (:data:`PROBLEM_SEPARATOR`; ``d_e=768`` when the widths differ).

    ``device``: restrict to one device; default the one with the most successful runs
    (``cpu`` on a tie).
    """
    ok = frame[frame.status == "ok"]
    if ok.empty:
        return ok
    if device is None:
        counts = ok.device.value_counts()
        top = counts[counts == counts.max()].index
        device = "cpu" if "cpu" in top else sorted(top)[0]
    ok = ok[ok.device == device]
    parts = []
    for _, runs in ok.groupby("dataset", sort=True):
        cells = runs.groupby(list(CELL_COLUMNS), dropna=False)
        stats = pd.DataFrame({"n_strategies": cells.strategy.nunique(), "n_runs": cells.size()}).reset_index()
        top = stats[(stats.n_strategies == stats.n_strategies.max()) & (stats.n_runs == stats.n_runs.max())]
        top = top.sort_values(["d_s", "d_e", "b", "d_k", "p"], kind="stable")
        # Configurations that tie are each a problem of their own (the scale set's widths of one band, say): one of
        # them alone would let the band's smallest width decide for its largest.
        named_by = ["d_e"] if top.d_e.nunique() > 1 else [c for c in CELL_COLUMNS if top[c].nunique(dropna=False) > 1]
        for _, cell in top.iterrows():
            sel = pd.Series(True, index=runs.index)
            for c in CELL_COLUMNS:
                sel &= (runs[c] == cell[c]) | (runs[c].isna() & pd.isna(cell[c]))
            part = runs[sel]
            if len(top) > 1:
                part = part.assign(dataset=f"{part.dataset.iloc[0]}{PROBLEM_SEPARATOR}"
                                           + ",".join(f"{c}={cell[c]}" for c in named_by))
            parts.append(part)
    return pd.concat(parts) if parts else ok.iloc[:0]


def cell_description(ref: pd.DataFrame) -> dict[str, str]:
    """``{dataset: "d_s=.. d_e=.. b=.. d_k=.. p=.. n_batches=.. device, N seeds"}`` of the reference runs."""
    out = {}
    for ds, runs in ref.groupby("dataset", sort=True):
        r = runs.iloc[0]
        out[ds] = (f"d_s={r.d_s} d_e={r.d_e} b={r.b} d_k={r.d_k} p={r.p} n_batches={r.n_batches} "
                   f"repeats={r.repeats} on {r.device}, seeds {sorted(runs.seed.unique().tolist())}")
    return out


# ------------------------------------------------------------------ the rule
def shortfall(value: float, best: float) -> float:
    """``(best - value) / |best|``, 0 when at or above the best (inf for any loss against a best of 0)."""
    if value is None or not math.isfinite(value):
        return math.inf
    if value >= best:
        return 0.0
    return (best - value) / abs(best) if best != 0 else math.inf


@dataclass(frozen=True)
class Paired:
    """A mean over seeds and its Student-t interval: of one strategy's values, or of paired differences.

    ``low``/``high`` bound the mean at the rule's confidence; with one seed there is no noise
    estimate and both equal the mean.
    """

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: np.ndarray, confidence: float = CONFIDENCE) -> Paired:
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        n = len(values)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        mean = float(values.mean())
        if n == 1:
            return cls(mean, mean, mean, 1)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * values.std(ddof=1) / math.sqrt(n))
        return cls(mean, mean - half, mean + half, n)

    def above_zero(self) -> bool:
        """The interval lies above 0 (a single seed, with no noise estimate, never does)."""
        return self.n > 1 and self.low > 0

    def non_inferior(self, best: float, tolerance: float) -> bool:
        """As paired differences to ``best``: the interval's lower end is at least ``−tolerance · |best|``
        (for the best itself, whose differences are all 0, always)."""
        if self.n == 0:
            return False
        if self.low == self.high == 0.0:
            return True
        return self.n > 1 and self.low >= -tolerance * abs(best)

    def describe(self, percent: bool = False) -> str:
        f = (lambda x: f"{100 * x:+.3g}%") if percent else (lambda x: f"{x:+.3g}")
        if self.n == 0:
            return "no common seed"
        if self.n == 1:
            return f"{f(self.mean)}, 1 seed (no noise estimate)"
        return f"{f(self.mean)} [{f(self.low)}, {f(self.high)}] over {self.n} seeds"


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
        return self.table[self.table.strategy != self.spec]

    @property
    def runner_up(self) -> pd.Series | None:
        """The fastest other eligible strategy (it lost on quality if faster, on time if slower), or None."""
        others = self.runners_up[self.runners_up.eligible]
        return others.iloc[0] if len(others) else None

    @property
    def generalises(self) -> bool:
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
                {"strategy": r.strategy, "time_ms": _num(r.time_ms), "reason": r.reason}
                for r in self.runners_up.itertuples()
            ],
            "db": db,
            "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        }
def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def run_regimes(frame: pd.DataFrame) -> pd.Series:
    """The regime key (``device/band``) of every run, from its device and ``d_e``."""
    keys = {(dev, d): Regime.of(dev, int(d)).key for dev, d in set(zip(frame.device, frame.d_e, strict=True))}
    return pd.Series([keys[(dev, d)] for dev, d in zip(frame.device, frame.d_e, strict=True)], index=frame.index,
                     dtype=object)


def regimes_with_runs(frame: pd.DataFrame) -> list[Regime]:
    """The regimes with a successful growth run, cpu first, narrowest band first."""
    ok = frame[(frame.status == "ok") & frame.strategy.map(is_growth)]
    present = set(run_regimes(ok)) if len(ok) else set()
    return [r for r in all_regimes() if r.key in present]


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
    runs = _Runs.of(ref, confidence)
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
                                        "qualifies", "worst_shortfall", "mean_shortfall", "worst_gain", "harmless",
                                        "qualifies_growable", "lowers_growable", "worst_shortfall_growable",
                                        "mean_shortfall_growable", "misses", "reason"])
    table = table.sort_values([key, "strategy"], na_position="last", kind="stable").reset_index(drop=True)
    tied = as_fast(table, key)
    chosen, verdict = _choose(table, key, tied)
    evidence, forced_by, statement = {}, [], ""
    if chosen is not None:
        _explain_choice(table, chosen, verdict, key, tied)
        evidence = _evidence(chosen, runs, best, ref, table, tolerance)
        for ds, resolvable in runs.resolvable(eligible, best).items():
            if ds in evidence:
                evidence[ds]["resolvable_shortfall"] = _num(resolvable)
        if verdict != GENERALISES:
            forced_by = table.loc[table.strategy == chosen, "misses"].iloc[0]
        statement = _statement(table.loc[table.strategy == chosen].iloc[0], verdict, runs, eligible, evidence,
                               tolerance, regime)
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


@dataclass(frozen=True)
class _Runs:
    """The growth strategies' reference runs: per seed, and their summaries over seeds (rule steps 1 to 4)."""

    per_seed: pd.DataFrame  # index (strategy, dataset, seed); columns t_total, x_floor, the gain and the diagnostics
    medians: pd.DataFrame  # medians over seeds, index (strategy, dataset)
    means: pd.DataFrame  # means over seeds, index (strategy, dataset)
    datasets: list[str]  # every dataset of the reference runs, baselines' included
    confidence: float

    COLUMNS = ("t_total", "x_floor", DECIDING, "heldout_gain_se", "heldout_batches", *DIAGNOSTICS,
               "statistics_tokens", "d_e")

    @classmethod
    def of(cls, ref: pd.DataFrame, confidence: float = CONFIDENCE) -> _Runs:
        growth = ref[ref.strategy.map(is_growth)]
        per_seed = growth.assign(**measures(growth)).groupby(["strategy", "dataset", "seed"])[
            list(cls.COLUMNS)].median()
        by = per_seed.groupby(level=["strategy", "dataset"])
        return cls(per_seed, by.median(), by.mean(), sorted(ref.dataset.unique()), confidence)

    def datasets_of(self, strategy: str) -> set[str]:
        """The datasets on which ``strategy`` has a successful reference run."""
        if strategy not in self.medians.index.get_level_values("strategy"):
            return set()
        return set(self.medians.loc[strategy].index)

    def value(self, strategy: str, dataset: str, column: str) -> float:
        """The median of ``column`` of ``strategy`` on ``dataset``."""
        return float(self.medians.loc[(strategy, dataset), column])

    def seeds(self, strategy: str, dataset: str, column: str = DECIDING) -> pd.Series:
        """``column`` of ``strategy`` on ``dataset``, one value per seed."""
        return self.per_seed.loc[(strategy, dataset), column]

    def gain(self, strategy: str, dataset: str) -> Paired:
        """The mean held-out gain over seeds and its interval."""
        return Paired.of(self.seeds(strategy, dataset).to_numpy(), self.confidence)

    def differences(self, strategy: str, best: str, dataset: str, column: str = DECIDING) -> pd.Series:
        """``strategy − best`` on ``column`` per seed of ``dataset`` that both ran."""
        ab = pd.DataFrame({"a": self.seeds(strategy, dataset, column), "b": self.seeds(best, dataset, column)}).dropna()
        return ab.a - ab.b

    def paired(self, strategy: str, best: str, dataset: str, column: str = DECIDING) -> Paired:
        """``strategy − best`` on ``column``, paired by seed on ``dataset``."""
        return Paired.of(self.differences(strategy, best, dataset, column).to_numpy(), self.confidence)

    def seed_verdicts(self, strategy: str, dataset: str) -> tuple[int, int]:
        """Seeds on which ``strategy`` lowered, and raised, the held-out loss beyond that run's own noise (its gain
        beyond the 95 % t bound of its standard error over the held-out batches)."""
        rows = self.per_seed.loc[(strategy, dataset)]
        k = pd.to_numeric(rows.heldout_batches, errors="coerce").fillna(2).clip(lower=2).to_numpy(dtype=float)
        se = pd.to_numeric(rows.heldout_gain_se, errors="coerce").fillna(np.inf).to_numpy(dtype=float)
        bound = stats.t.ppf(0.5 + self.confidence / 2, k - 1) * se
        return int((rows[DECIDING] > bound).sum()), int((rows[DECIDING] < -bound).sum())

    def growable(self, eligible: set[str]) -> list[str]:
        """The datasets where some ``eligible`` strategy lowers the held-out loss beyond noise."""
        return [ds for ds in self.datasets
                if any(self.gain(s, ds).above_zero() for s in sorted(eligible) if ds in self.datasets_of(s))]

    def resolvable(self, eligible: set[str], best: dict, power: float = 0.8) -> dict[str, float]:
        """Per dataset, the shortfall from the best's gain (a share of it) that the rule's paired comparison detects
        with probability ``power`` over these seeds: ``(t_{1−α/2} + t_{power}) · sd / √n / |best|`` with ``sd`` the
        median standard deviation of the eligible strategies' paired differences to the best (the noise of a
        comparison) and ``n`` the seeds."""
        out = {}
        for ds, (b, who) in best.items():
            sds, n = [], 0
            for s in sorted(eligible):
                if s == who or ds not in self.datasets_of(s):
                    continue
                diffs = self.differences(s, who, ds)
                if len(diffs) > 1:
                    sds.append(float(diffs.std(ddof=1)))
                    n = len(diffs)
            if sds and b != 0:
                t = stats.t.ppf(0.5 + self.confidence / 2, n - 1) + stats.t.ppf(power, n - 1)
                out[ds] = t * float(np.median(sds)) / math.sqrt(n) / abs(b)
        return out

    def missing_seeds(self) -> dict[str, str]:
        """``{strategy: "ran 1 of 3 seeds on <dataset>"}`` for strategies without every seed of a dataset's
        reference runs: they cannot be paired seed by seed with the others."""
        seeds = self.per_seed.index.to_frame(index=False)
        out = {}
        for ds, runs in seeds.groupby("dataset"):
            wanted = set(runs.seed)
            for strategy, mine in runs.groupby("strategy"):
                if set(mine.seed) != wanted and strategy not in out:
                    out[strategy] = f"ran {mine.seed.nunique()} of {len(wanted)} seeds on {ds}"
        return out

    def over_datasets(self, strategy: str, column: str, table: str = "medians") -> float:
        """The median over datasets of the per-dataset medians (or means) of ``column``: every dataset weighs the
        same."""
        have = self.datasets_of(strategy)
        summary = getattr(self, table)
        per_dataset = [float(summary.loc[(strategy, ds), column]) for ds in self.datasets if ds in have]
        return float(pd.Series(per_dataset).median()) if per_dataset else math.nan

    def best(self, eligible: set[str]) -> dict[str, tuple[float, str]]:
        """``{dataset: (best mean held-out gain, its strategy)}`` among the ``eligible`` strategies.

        Only eligible strategies set the best, so that one that failed, or skipped a dataset, cannot veto the others.
        """
        best = {}
        for ds in self.datasets:
            if not eligible or ds not in self.means.index.get_level_values("dataset"):
                continue
            m = self.means.xs(ds, level="dataset")
            m = m[m.index.isin(eligible)][DECIDING].dropna()
            if len(m):
                best[ds] = (float(m.max()), str(m.idxmax()))
        return best


def measures(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The rule's per-run measures from a runs table: the held-out gain and its standard error, the batch gain,
    ``x_floor``, and path efficiency as the rule reads it (capped at 1: above means the search beat the scan; NaN,
    where the path holds no decrease at all, counts as 1)."""
    return {"heldout_gain": runs.heldout_decrease / runs.heldout_before,
            "heldout_gain_se": runs.heldout_decrease_se / runs.heldout_before,
            "batch_gain": runs.loss_decrease / runs.loss_before,
            "x_floor": runs.t_total / runs.t_floor,
            "path_efficiency": runs.path_efficiency.clip(upper=1.0).fillna(1.0)}


def _failure_notes(frame: pd.DataFrame) -> dict[str, str]:
    """``{strategy: "failed N of M runs (first: <error>)"}`` for every strategy with a failed run."""
    n_runs = frame.groupby("strategy").size()
    return {s: f"failed {len(runs)} of {int(n_runs[s])} runs (first: {first_error(runs.error)})"
            for s, runs in frame[frame.status != "ok"].groupby("strategy")}


def _judged(strategy: str, runs: _Runs, best: dict, tolerance: float) -> list[dict]:
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


def _strategy_row(strategy: str, runs: _Runs, best: dict, eligible: bool, failure: str | None,
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
            misses.append({"dataset": j["dataset"], "measure": "lowers", "gain": _interval(j["gain"])})
            reasons.append(f"{j['dataset']}: does not lower the held-out loss beyond noise (gain "
                           f"{j['gain'].describe(percent=True)})")
        if not j["within"]:
            misses.append({"dataset": j["dataset"], "measure": "within", "gain": _num(j["gain"].mean),
                           "best": _num(j["best"]), "best_strategy": j["best_strategy"],
                           "difference": _interval(j["difference"])})
            reasons.append(f"{j['dataset']}: not shown within {100 * tolerance:g}% of the best's gain "
                           f"({100 * j['gain'].mean:.3g}% vs {100 * j['best']:.3g}%, paired difference "
                           f"{j['difference'].describe(percent=True)})")
    complete = bool(judged) and not missing
    return dict(strategy=strategy, preset=names.get(strategy, ""),
                time_ms=1e3 * runs.over_datasets(strategy, "t_total"), x_floor=runs.over_datasets(strategy, "x_floor"),
                eligible=eligible, lowers=complete and all(j["lowers"] for j in judged),
                within=complete and all(j["within"] for j in judged),
                qualifies=eligible and complete and not misses,
                worst_shortfall=max((j["shortfall"] for j in judged), default=math.inf),
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


def _interval(p: Paired) -> list:
    return [_num(p.mean), _num(p.low), _num(p.high), p.n]


def as_fast(table: pd.DataFrame, key: str, qualifies: str = "qualifies") -> dict[str, float]:
    """The strategies of ``table`` whose column ``qualifies`` holds, as fast as the front-runner (rule step 6),
    each with its time as a multiple of the front-runner's (the front-runner first, at 1). ``table`` is sorted by
    time."""
    qualifying = table[table[qualifies]]
    if qualifying.empty:
        return {}
    front = float(qualifying.iloc[0][key])
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


def _spared_how(row: pd.Series) -> str:
    """How step 7 chose ``row``'s strategy where growth does not generalise, in words."""
    if row.harmless and row.qualifies_growable:
        return ("this one is the rule's choice on the datasets where some strategy lowers it, and is shown harmless on "
                "the others")
    if row.harmless and row.lowers_growable:
        return (f"this one comes closest to the best's gain on the datasets where some strategy lowers it (worst "
                f"shortfall {100 * row.worst_shortfall_growable:.0f}%), and is shown harmless on the others")
    return f"this one harms least, mean held-out gain {100 * row.worst_gain:+.3g}% on its worst dataset"


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


def _explain_choice(table: pd.DataFrame, chosen: str, verdict: str, key: str, tied: dict[str, float]) -> None:
    """Give the choice, and every qualifying strategy it beat, their reasons (in ``table``, in place)."""
    mine = table.loc[table.strategy == chosen].iloc[0]
    front = mine[key] / tied[chosen] if chosen in tied else math.nan  # the front-runner's time
    unit = " ms" if key == "time_ms" else "× the floor"
    why = {GENERALISES: "",
           CLOSEST: f" (fallback: nothing qualifies; its worst shortfall from the best's held-out gain is "
                    f"{100 * mine.worst_shortfall:.1f}%)",
           DOES_NOT_GENERALISE: (" (fallback: no strategy lowers the held-out loss on every dataset; "
                                 f"{_spared_how(mine)})")}
    for i, r in table.iterrows():
        if r.strategy == chosen:
            table.at[i, "reason"] = "chosen" + why[verdict]
        elif r.strategy in tied:
            gaps = " vs ".join(_distinct_percents(r.mean_shortfall, mine.mean_shortfall))
            lost = (f"further from the best: mean shortfall from the best's held-out gain {gaps}"
                    if r.mean_shortfall > mine.mean_shortfall else
                    f"as close to the best (mean shortfall {gaps}) and "
                    + ("slower" if r[key] > mine[key] else "after it in spec order"))
            table.at[i, "reason"] = (f"qualifies and is as fast ({r[key]:.3g}{unit} vs {mine[key]:.3g}{unit}; both "
                                     f"within {100 * TIME_TOLERANCE:g}% of the fastest) but {lost}")
        elif r.qualifies:
            table.at[i, "reason"] = (f"qualifies but slower: {r[key]:.3g}{unit} vs {mine[key]:.3g}{unit} "
                                     f"({r[key] / mine[key]:.2f}×; more than {100 * TIME_TOLERANCE:g}% above the "
                                     f"fastest qualifying strategy's {front:.3g}{unit})")


def _distinct_percents(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` as percentages with two decimals, or with as many more (up to six) as it takes for two
    different values not to read as equal (a tie broken at the fourth decimal must not print "4.37% vs 4.37%")."""
    for decimals in range(2, 7):
        pa, pb = f"{100 * a:.{decimals}f}%", f"{100 * b:.{decimals}f}%"
        if pa != pb or a == b:
            break
    return pa, pb


def _evidence(chosen: str, runs: _Runs, best: dict, ref: pd.DataFrame, table: pd.DataFrame,
              tolerance: float) -> dict:
    """The choice's held-out gain against the best per dataset, with its intervals and per-seed counts, and the
    step's diagnostics; its summaries over datasets."""
    evidence = {}
    for j in _judged(chosen, runs, best, tolerance):
        ds = j["dataset"]
        lowered, raised = runs.seed_verdicts(chosen, ds)
        evidence[ds] = {
            "time_ms": _num(1e3 * runs.value(chosen, ds, "t_total")),
            "x_floor": _num(runs.value(chosen, ds, "x_floor")),
            "seeds": int(((ref.strategy == chosen) & (ref.dataset == ds)).sum()),
            "heldout_gain": _interval(j["gain"]),
            "lowers": j["lowers"],
            "seeds_lowered": lowered,
            "seeds_raised": raised,
            "best_heldout_gain": _num(j["best"]),
            "best_strategy": j["best_strategy"],
            "difference": _interval(j["difference"]),
            "within": j["within"],
            **{q: _num(runs.value(chosen, ds, q)) for q in DIAGNOSTICS},
            "statistics_tokens": _num(runs.value(chosen, ds, "statistics_tokens")),
            "tokens_per_d_e2": _num(runs.value(chosen, ds, "statistics_tokens") / runs.value(chosen, ds, "d_e") ** 2),
        }
    row = table.loc[table.strategy == chosen].iloc[0]
    evidence["median_time_ms"] = _num(float(row.time_ms))
    evidence["median_x_floor"] = _num(float(row.x_floor))
    evidence["median_heldout_gain"] = _num(runs.over_datasets(chosen, DECIDING, "means"))
    for q in DIAGNOSTICS:
        evidence[f"median_{q}"] = _num(runs.over_datasets(chosen, q))
    evidence["mean_shortfall"] = _num(float(row.mean_shortfall))
    evidence["worst_shortfall"] = _num(float(row.worst_shortfall))
    return evidence


def _statement(mine: pd.Series, verdict: str, runs: _Runs, eligible: set[str], evidence: dict, tolerance: float,
               regime: Regime) -> str:
    """The regime's verdict in plain words (``mine``: the chosen strategy's row of the table)."""
    chosen = mine.strategy
    if verdict == GENERALISES:
        return (f"{chosen} lowers the held-out loss beyond noise on every dataset of {regime.describe()} and keeps, "
                f"beyond noise, at least {100 * (1 - tolerance):g}% of the best strategy's held-out gain there.")
    if verdict == CLOSEST:
        return (f"Every dataset of {regime.describe()} has growth strategies that lower the held-out loss beyond "
                f"noise, but none keeps {100 * (1 - tolerance):g}% of the best one's gain on every dataset beyond "
                f"noise; {chosen} comes closest (its worst shortfall from the best's gain: "
                f"{100 * evidence['worst_shortfall']:.0f}%).")
    growable = runs.growable(eligible)
    nowhere = [ds for ds in runs.datasets if ds not in growable]
    tokens = [f"{ds}: {evidence[ds]['statistics_tokens']:.0f} tokens, {evidence[ds]['tokens_per_d_e2']:.2g} per entry "
              "of P" for ds in nowhere if ds in evidence and evidence[ds]["statistics_tokens"] is not None]
    worst = min((ds for ds in evidence if isinstance(evidence[ds], dict)),
                key=lambda ds: evidence[ds]["heldout_gain"][0], default=None)
    if worst is None:
        return ("These runs hold no held-out gain (runs from before it was measured): the rule cannot tell whether "
                f"growth generalises here; {chosen} is named only as the first eligible strategy.")
    if mine.harmless and (mine.qualifies_growable or mine.lowers_growable):
        how = ("the rule's choice there (it lowers the held-out loss beyond noise and keeps, beyond noise, at least "
               f"{100 * (1 - tolerance):g}% of the best strategy's gain)" if mine.qualifies_growable else
               f"the closest there to the best strategy's gain (worst shortfall "
               f"{100 * mine.worst_shortfall_growable:.0f}%)")
        why = (f"the strategy that, on the datasets where growth generalises ({', '.join(growable)}), is {how}, and "
               f"that is shown not to raise the held-out loss on {', '.join(nowhere)} by more than "
               f"{100 * tolerance:g}% of the best gain where growth works")
    else:
        why = (f"the strategy that harms least (mean held-out gain {100 * evidence[worst]['heldout_gain'][0]:+.3g}% "
               f"on its worst dataset, {worst})")
    return (f"Growth with these statistics does not generalise here: on {', '.join(nowhere)}, no growth strategy "
            f"lowers the held-out loss beyond noise ({'; '.join(tokens) or 'statistics tokens not recorded'}). Use "
            f"more statistics tokens, or do not grow. strategies.make(\"default\") runs {chosen}, {why}, and records "
            "this in the growth's fallback.")


# ------------------------------------------------------------------ output
def format_text(rec: Recommendation) -> str:
    """The rule, the choice, its evidence and the runners-up, as printed by ``growbench recommend``."""
    names = preset_names()
    regime = Regime.parse(rec.regime).describe() if rec.regime else "all runs"
    lines = [f"=== regime: {regime} ===", "rule: " + rec.rule, "", "reference configurations:"]
    lines += [f"  {ds:15s} {desc}" for ds, desc in rec.cells.items()]
    if rec.excluded_baselines:
        lines.append(f"not eligible (baselines / not growth specs): {', '.join(rec.excluded_baselines)}")
    lines.append("")
    if rec.spec is None:
        lines.append("choice: none: no growth strategy is eligible (never failed and ran on every dataset)")
    else:
        tag = f" (preset {names[rec.spec]})" if rec.spec in names else ""
        flag = {GENERALISES: "", CLOSEST: "  [FALLBACK: nothing qualifies]",
                DOES_NOT_GENERALISE: "  [GROWTH DOES NOT GENERALISE HERE]"}[rec.verdict]
        lines.append(f"choice: {rec.spec}{tag}{flag}")
        lines.append("  " + rec.statement)
        lines.append(f"  median over datasets of per-dataset median t_total: {rec.evidence['median_time_ms']:.3g} ms; "
                     f"of t_total/t_floor: {rec.evidence['median_x_floor']:.3g}×")
        lines.append("evidence (held-out gain: mean over seeds [95% interval]; best = best eligible strategy's mean; "
                     "diagnostics: medians):")
        lines += ["  " + ln for ln in evidence_frame(rec).to_string().splitlines()]
    lines += ["", "runners-up (by median time; ms and multiple of the floor):"]
    if rec.spec is not None:
        lines.append("  " + rank_note(rec))
    for r in rec.runners_up.itertuples():
        tag = f" [{r.preset}]" if r.preset else ""
        t = f"{r.time_ms:8.3g} ms {r.x_floor:6.3g}×fl" if math.isfinite(r.time_ms) else "       – ms"
        lines.append(f"  {r.rank:2d}. {t}  {r.strategy}{tag}: {r.reason}")
    return "\n".join(lines)


def evidence_frame(rec: Recommendation) -> pd.DataFrame:
    """One row per dataset: the choice's held-out gain with its interval against the best, per-seed counts, time and
    the diagnostics, as text."""
    rows = {}
    for ds, e in rec.evidence.items():
        if not isinstance(e, dict):
            continue
        mean, low, high, n = e["heldout_gain"]
        rows[ds] = {
            "held-out gain": f"{100 * mean:+.3g}% [{100 * low:+.3g}, {100 * high:+.3g}]"
                             + ("" if e["lowers"] else " (not > 0)"),
            "best": f"{100 * e['best_heldout_gain']:+.3g}%" + ("" if e["within"] else " (NOT within)"),
            "seeds lowered/raised": f"{e['seeds_lowered']}/{e['seeds_raised']} of {n}",
            "time_ms": f"{e['time_ms']:.3g}",
            **{QUALITY_NAMES[q]: f"{e[q]:.3g}" if e[q] is not None else "–" for q in DIAGNOSTICS},
        }
    return pd.DataFrame(rows).T


def what_to_use(recs: dict[str, Recommendation]) -> pd.DataFrame:
    """One row per regime: its choice and verdict, time, held-out gain and diagnostics over datasets, the runner-up."""
    rows = []
    for key, rec in recs.items():
        ev, up = rec.evidence, rec.runner_up
        rows.append({
            "regime": Regime.parse(key).describe(), "spec": rec.spec or "none", "verdict": rec.verdict,
            "fallback": rec.fallback, "time_ms": ev.get("median_time_ms"), "x_floor": ev.get("median_x_floor"),
            "heldout_gain": ev.get("median_heldout_gain"), **{q: ev.get(f"median_{q}") for q in DIAGNOSTICS},
            "datasets": len(rec.datasets),
            "seeds": min((e["seeds"] for e in ev.values() if isinstance(e, dict)), default=0),
            "runner_up": None if up is None else up.strategy,
            "runner_up_reason": None if up is None else up.reason,
        })
    return pd.DataFrame(rows)


def format_regimes(recs: dict[str, Recommendation]) -> str:
    """Every regime's :func:`format_text`, after a what-to-use summary."""
    table = what_to_use(recs)
    summary = ["what to use (per regime; held-out gain: median over datasets of the mean over seeds):"]
    for r in table.itertuples():
        if r.time_ms is None:
            summary.append(f"  {r.regime:24s} none")
            continue
        flag = "" if r.verdict == GENERALISES else f"  [{r.verdict.upper()}]"
        summary.append(f"  {r.regime:24s} {r.spec}{flag}  ({r.time_ms:.3g} ms, {r.x_floor:.3g}× floor; held-out "
                       f"gain {100 * r.heldout_gain:+.3g}%)")
    return "\n\n".join(["\n".join(summary), *(format_text(rec) for rec in recs.values())])


def rank_note(rec: Recommendation) -> str:
    """Why the runners-up's ranks skip one: the ranks count every growth strategy, the choice included.

    Returns
    -------
    str
        One sentence naming the choice's rank; empty when there is no choice.
    """
    if rec.spec is None:
        return ""
    rank = int(rec.table.loc[rec.table.strategy == rec.spec, "rank"].iloc[0])
    above = (" The strategies ranked above it are faster but lost for the reason on their line."
             if rank > 1 else "")
    name = preset_names().get(rec.spec)
    who = rec.spec + (f" [{name}]" if name else "")
    return (f"Ranks order all {len(rec.table)} growth strategies by median time; rank {rank}, missing below, "
            f"is the choice itself, {who}.{above}")


def default_file() -> Path:
    """``strategies/default.json`` of the installed package."""
    return Path(strategies.__file__).resolve().parent / "default.json"


def write_default(recs: Recommendation | dict[str, Recommendation], db: str | Path,
                  path: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write one choice per regime into ``strategies/default.json`` (or ``path``), which
    ``strategies.make("default")`` reads, keeping the regimes this database has no evidence for.

    The file is written to a temporary file beside it and renamed over it (never through a symlink
    at ``path``, and a kill leaves the old file whole).

    Parameters
    ----------
    recs : Recommendation or dict
        ``{regime key: Recommendation}`` (a single recommendation counts for its own regime).
    db : str or Path
        The database the evidence comes from (recorded).
    path : str or Path, optional
        Where to write; default the package's ``default.json``.

    Returns
    -------
    (Path, list of str)
        The file, and one line per regime whose entry changed, was added or was kept from the file.

    Raises
    ------
    ValueError
        When a regime has no choice, or it is ``default`` itself or a baseline
        (:func:`~strategies.spec.check_default_choice`); nothing is written.
    """
    if isinstance(recs, Recommendation):
        recs = {recs.regime or REFERENCE_REGIME.key: recs}
    path = Path(path) if path else default_file()
    for key, rec in recs.items():
        if rec.spec is None:
            raise ValueError(f"not written to {path}: no growth strategy is eligible in {key}")
        try:
            # The same check as on load: a recursive ("default") or baseline choice would only be
            # replaced by the built-in default, with a warning, every time the file is read.
            check_default_choice(rec.spec)
        except ValueError as e:
            raise ValueError(f"not written to {path}: {e}") from None
    shipped = _shipped_regimes(path)
    db_text = str(Path(db).resolve())
    regimes = {r.key: shipped[r.key] for r in all_regimes() if r.key in shipped and r.key not in recs}
    regimes.update({key: rec.as_json(db_text) for key, rec in recs.items()})
    changes = []
    for key in (r.key for r in all_regimes()):
        old, new = shipped.get(key, {}).get("spec"), regimes.get(key, {}).get("spec")
        if key not in recs and key in shipped:
            changes.append(f"{key}: kept {old} (no evidence in this database)")
        elif key in recs:
            changes.append(f"{key}: {new} ({'unchanged' if old == new else f'was {old}' if old else 'added'}; "
                           f"{recs[key].verdict})")
    data = {"rule": next(iter(recs.values())).rule, "regimes": regimes, "db": db_text,
            "generated": datetime.now(UTC).isoformat(timespec="seconds")}
    replace_file(path, json.dumps(data, indent=2) + "\n")
    return path, changes


def _shipped_regimes(path: Path) -> dict[str, dict]:
    """The regime entries of the file at ``path`` that name a valid choice; none when it is missing, not a regular
    file (a FIFO would block the read) or not a default file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}
    regimes = data.get("regimes") if isinstance(data, dict) else None
    if not isinstance(regimes, dict):
        return {}
    out = {}
    for key, entry in regimes.items():
        try:
            Regime.parse(key)
            check_default_choice(entry.get("spec") if isinstance(entry, dict) else None)
        except ValueError:
            continue
        out[key] = entry
    return out
