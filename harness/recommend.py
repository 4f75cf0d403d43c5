"""Choose the default strategy of each regime from a results database, by a fixed and documented rule.

The rule (:data:`RULE`), applied by :func:`recommend` to the runs of one regime
(device kind × band of widths, :mod:`strategies.regimes`) and by
:func:`recommend_regimes` to each regime with runs:

1. **Regime.** Only the runs of the regime count: its device kind (cpu, or cuda for any
   accelerator) and its band of ``d_e`` (≤ 128, 128–1024, > 1024).
2. **Reference configuration.** For each dataset, only the runs of its *reference
   configuration* count: the group of runs sharing sizes (``d_s, d_e, b, d_k, p``),
   ``n_batches``, ``repeats``, ``warmup_steps``, ``dtype``, ``scale_policy`` and device
   that covers the most distinct strategies (ties: the most runs, then the smallest
   sizes). Every strategy is thus compared on the same problems and seeds.
3. **Eligible.** Growth strategies only (the baselines ``random``, ``zero``,
   ``gradmax`` and names that are not valid specs are excluded) that never failed on
   any run of the regime and that have a successful reference run for every seed of
   every dataset of it (a reference run on fewer seeds cannot be paired seed by seed).
4. **Quality, beyond noise.** Three measures: ``optimality``, ``path_efficiency`` and
   ``heldout_decrease``. Per dataset and measure the *best* is the eligible strategy
   with the highest median over seeds. A candidate is compared with it by the paired
   differences ``candidate − best`` over their common seeds, with a Student-t interval
   at 95 % (:class:`Paired`; one seed gives no interval, only the difference). It is
   *within the tolerance* when its most favourable value within noise, ``best + high``
   (``high``: the interval's upper bound), is ``>= best - 0.02 * |best|``: noise never
   disqualifies a candidate that may be as good, and a loss bigger than 2 % beyond noise
   always does. Path efficiency also has a floor: at least 95 % (:data:`PATH_EFFICIENCY_FLOOR`) on
   every seed of every dataset. It is exact for a seed, so one seed's miss is a miss of the search,
   not noise, and a downstream user meets single problems, not medians. A strategy *qualifies* when
   it is within on every dataset and measure and above the floor on every seed.
5. **Speed, within noise.** Time is ``t_total`` (the growth, statistics included): the
   median over seeds per dataset, then the **median of these per-dataset medians**. The
   fastest qualifying strategy by this measure is the *front-runner*; a qualifying strategy
   whose time is at most 5 % above the front-runner's is *as fast* (:data:`TIME_TOLERANCE`:
   the same strategy measured in two sweeps on a shared machine differs by a few per cent,
   so a smaller difference in time ranks noise). Among the strategies as fast as the
   front-runner (itself included), the recommendation is the one **closest to the best**:
   the smallest mean, over datasets, of the shortfalls of its medians of optimality and path
   efficiency from the best's (each capped at 100 %; ties: the faster, then the spec string).
   These two measures are exact for a seed, so the choice no longer flips with the timing
   noise of a rerun. ``time_metric="x_floor"`` ranks by ``t_total / t_floor`` instead (a
   robustness check on a shared machine, not the documented rule).
6. **Fallback.** If no eligible strategy qualifies, the eligible strategy with the
   smallest worst shortfall is returned (from the best beyond noise, or from the path
   efficiency floor: the first to qualify as both are relaxed; ties: the faster), flagged
   ``fallback``, with the datasets and measures that forced it (``forced_by``);
   ``growbench recommend --write`` then refuses unless ``--force``.

The evidence (per-dataset medians against the best, with the paired intervals) and every
runner-up, with the reason it lost, come with each choice.
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

import strategies
from harness.store.results import read_runs
from harness.store.schema import RUNS
from strategies.regimes import Regime, all_regimes
from strategies.spec import REFERENCE_REGIME, check_default_choice

TOLERANCE = 0.02
#: The least path efficiency a qualifying strategy reaches on every seed of every dataset (rule step 4).
PATH_EFFICIENCY_FLOOR = 0.95
#: How much slower than the fastest qualifying strategy another may be and still count as as fast (rule step 5).
TIME_TOLERANCE = 0.05
#: Confidence of the paired-difference intervals.
CONFIDENCE = 0.95
QUALITY = ("optimality", "path_efficiency", "heldout_decrease")
#: The measures of the step itself, exact for a seed, that break a tie in time (rule step 5). The held-out
#: decrease is left out there: near zero on small problems, its shortfall relative to the best is noise.
STEP_QUALITY = ("optimality", "path_efficiency")
QUALITY_NAMES = {"optimality": "optimality", "path_efficiency": "path efficiency",
                 "heldout_decrease": "held-out decrease"}
CELL_COLUMNS = ("d_s", "d_e", "b", "d_k", "p", "n_batches", "repeats", "warmup_steps", "dtype", "scale_policy",
                "device")
RULE = (
    "Per regime (device kind x band of d_e), among growth strategies (baselines excluded) that never failed on "
    "a run of the regime and that ran every seed of every dataset of it, choose the fastest by the median over "
    "datasets of the per-dataset median {metric}, whose optimality, path efficiency and held-out loss decrease "
    "are, on every dataset, within {tol:g}% of the best eligible strategy's beyond noise: best + (upper bound of "
    "the {conf:g}% t interval of the paired differences over seeds) >= best - {frac:g}*|best|, and whose path "
    "efficiency is at least {floor:g}% on every seed of every dataset. Per dataset only "
    "its reference configuration counts: the sizes/settings/device group with the most strategies. The best is "
    "the highest median over seeds. Strategies within {time_tol:g}% of the fastest qualifying one's time count as "
    "as fast; among them the one with the smallest mean shortfall of its optimality and path efficiency medians "
    "from the best's is chosen."
)


class NoResults(ValueError):
    """The database is missing, empty, or holds no successful run."""


def rule_text(tolerance: float = TOLERANCE, time_metric: str = "t_total", confidence: float = CONFIDENCE) -> str:
    """The rule in one paragraph, with the tolerance and confidence filled in."""
    metric = "t_total" if time_metric == "t_total" else "t_total/t_floor (x_floor)"
    return RULE.format(tol=100 * tolerance, frac=tolerance, metric=metric, conf=100 * confidence,
                       time_tol=100 * TIME_TOLERANCE, floor=100 * PATH_EFFICIENCY_FLOOR)


def rule_in_brief(tolerance: float = TOLERANCE) -> str:
    """The rule's quality and speed conditions in one clause, for prose that names the choice: "within 2% of the
    best on every dataset, beyond seed noise, with a path efficiency of at least 95% on every seed (...)"."""
    return (f"within {100 * tolerance:g}% of the best on every dataset, beyond seed noise, with a path efficiency of "
            f"at least {100 * PATH_EFFICIENCY_FLOOR:g}% on every seed (times within {100 * TIME_TOLERANCE:g}% of the "
            "fastest count as equal, and then the closer to the best wins)")


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
    frame = read_runs(path)
    if frame.empty:
        raise NoResults(f"no successful runs in {path}: the database has no runs")
    frame = RUNS.complete(frame)
    n_ok = int((frame.status == "ok").sum())
    if n_ok == 0:
        first = first_error(frame.error)
        raise NoResults(f"no successful runs in {path}: all {len(frame)} runs failed (first error: {first})")
    return frame


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


def reference_runs(frame: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """The successful runs of each dataset's reference configuration (see the module docstring).

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
        stats = stats.sort_values(["n_strategies", "n_runs", "d_s", "d_e", "b", "d_k", "p"],
                                  ascending=[False, False, True, True, True, True, True], kind="stable")
        best = stats.iloc[0]
        sel = pd.Series(True, index=runs.index)
        for c in CELL_COLUMNS:
            sel &= (runs[c] == best[c]) | (runs[c].isna() & pd.isna(best[c]))
        parts.append(runs[sel])
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
def within(value: float, best: float, tolerance: float = TOLERANCE) -> bool:
    """``value >= best - tolerance * |best|`` (False for a missing value)."""
    if value is None or not math.isfinite(value):
        return False
    return value >= best - tolerance * abs(best)


def shortfall(value: float, best: float) -> float:
    """``(best - value) / |best|``, 0 when at or above the best (inf for any loss against a best of 0)."""
    if value is None or not math.isfinite(value):
        return math.inf
    if value >= best:
        return 0.0
    return (best - value) / abs(best) if best != 0 else math.inf


@dataclass(frozen=True)
class Paired:
    """The paired differences ``candidate − best`` of one measure on one dataset, over their common seeds.

    ``low``/``high`` bound the mean difference at the rule's confidence (Student's t); with one
    seed there is no noise estimate and both equal the difference.
    """

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, diffs: np.ndarray, confidence: float = CONFIDENCE) -> Paired:
        diffs = np.asarray(diffs, dtype=float)
        diffs = diffs[np.isfinite(diffs)]
        n = len(diffs)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        mean = float(diffs.mean())
        if n == 1:
            return cls(mean, mean, mean, 1)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * diffs.std(ddof=1) / math.sqrt(n))
        return cls(mean, mean - half, mean + half, n)

    def describe(self) -> str:
        if self.n == 0:
            return "no common seed"
        if self.n == 1:
            return f"difference {self.mean:+.3g}, 1 seed (no noise estimate)"
        return f"paired difference {self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}] over {self.n} seeds"


@dataclass
class Recommendation:
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
    #: With a fallback: the ``(dataset, measure)`` pairs where the choice misses the tolerance.
    forced_by: list[dict] = field(default_factory=list)
    #: The qualifying strategies as fast as the front-runner (rule step 5): ``{spec: time / front-runner's}``.
    as_fast: dict[str, float] = field(default_factory=dict)

    @property
    def runners_up(self) -> pd.DataFrame:
        return self.table[self.table.strategy != self.spec]

    @property
    def runner_up(self) -> pd.Series | None:
        """The fastest other eligible strategy (it lost on quality if faster, on time if slower), or None."""
        others = self.runners_up[self.runners_up.eligible]
        return others.iloc[0] if len(others) else None

    def as_json(self, db: str | None = None) -> dict:
        """This regime's entry of ``strategies/default.json`` (key ``spec`` first)."""
        regime = Regime.parse(self.regime) if self.regime else None
        return {
            "spec": self.spec,
            "regime": regime.describe() if regime else None,
            "fallback": self.fallback,
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
        How far below the best a value may be, as a fraction of ``|best|``, beyond noise.
    device : str, optional
        Compare the runs of this device only (within the regime).
    time_metric : {"t_total", "x_floor"}
        ``"t_total"`` (the rule) or ``"x_floor"`` (``t_total / t_floor``, a robustness check).
    regime : Regime or str, optional
        The regime (``"cpu/small"``, ...) whose runs count; default the regime with the most
        successful growth runs (of ``device``'s kind when given).
    confidence : float
        Confidence of the paired-difference intervals.

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
    names = preset_names()
    rows = [_strategy_row(s, runs, best, s in eligible, failures.get(s) or partial.get(s), tolerance, names)
            for s in every_growth]
    table = pd.DataFrame(rows, columns=["strategy", "preset", "time_ms", "x_floor", "eligible", "qualifies",
                                        "worst_shortfall", "mean_shortfall", "misses", "reason"])
    table = table.sort_values([key, "strategy"], na_position="last", kind="stable").reset_index(drop=True)
    tied = as_fast(table, key)
    chosen, fallback = _choose(table, key, tied)
    evidence, forced_by = {}, []
    if chosen is not None:
        _explain_choice(table, chosen, fallback, key, tied)
        evidence = _evidence(chosen, fallback, runs, best, ref, table, tolerance)
        if tied:
            evidence["mean_shortfall"] = _num(float(table.loc[table.strategy == chosen, "mean_shortfall"].iloc[0]))
        if fallback:
            forced_by = table.loc[table.strategy == chosen, "misses"].iloc[0]
    table["rank"] = range(1, len(table) + 1)
    return Recommendation(spec=chosen, rule=rule_text(tolerance, time_metric, confidence), fallback=fallback,
                          tolerance=tolerance, datasets=runs.datasets, cells=cell_description(ref), evidence=evidence,
                          table=table.drop(columns="misses"), excluded_baselines=baselines, regime=regime.key,
                          forced_by=forced_by, as_fast=tied)


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
    """The growth strategies' reference runs: per seed, and medians over seeds (rule steps 1 and 3)."""

    per_seed: pd.DataFrame  # index (strategy, dataset, seed); columns t_total, x_floor and QUALITY
    table: pd.DataFrame  # medians over seeds, index (strategy, dataset)
    datasets: list[str]  # every dataset of the reference runs, baselines' included
    confidence: float

    @classmethod
    def of(cls, ref: pd.DataFrame, confidence: float = CONFIDENCE) -> _Runs:
        # Path efficiency above 1 means the search beat the 80-point scan, not that its path is better
        # than another's: every strategy that reaches its path's best is equal on this measure. It is
        # NaN where the path holds no decrease at all: nothing to miss there (optimality judges the path).
        growth = ref[ref.strategy.map(is_growth)].assign(x_floor=lambda d: d.t_total / d.t_floor,
                                                         path_efficiency=lambda d: d.path_efficiency.clip(upper=1.0)
                                                         .fillna(1.0))
        columns = ["t_total", "x_floor", *QUALITY]
        per_seed = growth.groupby(["strategy", "dataset", "seed"])[columns].median()
        return cls(per_seed, per_seed.groupby(level=["strategy", "dataset"]).median(), sorted(ref.dataset.unique()),
                   confidence)

    def datasets_of(self, strategy: str) -> set[str]:
        """The datasets on which ``strategy`` has a successful reference run."""
        if strategy not in self.table.index.get_level_values("strategy"):
            return set()
        return set(self.table.loc[strategy].index)

    def value(self, strategy: str, dataset: str, column: str) -> float:
        """The median of ``column`` of ``strategy`` on ``dataset``."""
        return float(self.table.loc[(strategy, dataset), column])

    def _by_seed(self, strategy: str, best: str, dataset: str, column: str) -> pd.DataFrame:
        """``column`` of ``strategy`` (``a``) and of ``best`` (``b``) on ``dataset``, one row per seed both have."""
        return pd.DataFrame({"a": self.per_seed.loc[(strategy, dataset), column],
                             "b": self.per_seed.loc[(best, dataset), column]}).dropna()

    def paired(self, strategy: str, best: str, dataset: str, column: str) -> Paired:
        """``strategy − best`` on ``column``, paired by seed on ``dataset``."""
        ab = self._by_seed(strategy, best, dataset, column)
        return Paired.of((ab.a - ab.b).to_numpy(), self.confidence)

    def on_common_seeds(self, strategy: str, best: str, dataset: str, column: str) -> tuple[float, float]:
        """The medians of ``column`` of ``strategy`` and of ``best`` over the seeds both ran on ``dataset``
        (what :meth:`paired` compares, as values a reader can set side by side)."""
        ab = self._by_seed(strategy, best, dataset, column)
        return float(ab.a.median()), float(ab.b.median())

    def worst_seed(self, strategy: str, dataset: str, column: str) -> tuple[float, int]:
        """The lowest value of ``column`` of ``strategy`` over its seeds on ``dataset``, and that seed."""
        by_seed = self.per_seed.loc[(strategy, dataset), column]
        return float(by_seed.min()), int(by_seed.idxmin())

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

    def over_datasets(self, strategy: str, column: str) -> float:
        """The median over datasets of the per-dataset medians of ``column`` (every dataset weighs the same)."""
        have = self.datasets_of(strategy)
        per_dataset = [self.value(strategy, ds, column) for ds in self.datasets if ds in have]
        return float(pd.Series(per_dataset).median()) if per_dataset else math.nan

    def best(self, eligible: set[str]) -> dict[str, dict[str, tuple[float, str]]]:
        """``{dataset: {measure: (best median, its strategy)}}`` among the ``eligible`` strategies.

        Only eligible strategies set the best, so that one that failed, or skipped a dataset, cannot veto the
        others. A measure that no eligible strategy has on a dataset (e.g. path efficiency of an older
        database) is left out there.
        """
        best = {}
        if not eligible:
            return best
        for ds in self.datasets:
            if ds not in self.table.index.get_level_values("dataset"):
                continue
            m = self.table.xs(ds, level="dataset")
            m = m[m.index.isin(eligible)]
            best[ds] = {q: (float(m[q].max()), str(m[q].idxmax())) for q in QUALITY if m[q].notna().any()}
        return best


def _failure_notes(frame: pd.DataFrame) -> dict[str, str]:
    """``{strategy: "failed N of M runs (first: <error>)"}`` for every strategy with a failed run."""
    n_runs = frame.groupby("strategy").size()
    return {s: f"failed {len(runs)} of {int(n_runs[s])} runs (first: {first_error(runs.error)})"
            for s, runs in frame[frame.status != "ok"].groupby("strategy")}


def _quality_misses(strategy: str, runs: _Runs, best: dict, tolerance: float) -> tuple[float, list[str], list[dict]]:
    """The worst shortfall of ``strategy`` from the best beyond noise, the misses per dataset as text, and as data.

    On each dataset and measure the candidate's most favourable value within noise is
    ``best + high`` (``high``: the upper bound of the paired difference); it must be within
    the tolerance of the best. Its path efficiency on its worst seed must reach
    :data:`PATH_EFFICIENCY_FLOOR`; a miss counts its shortfall from the floor.
    """
    worst, text, data = 0.0, [], []
    have = runs.datasets_of(strategy)
    for ds in runs.datasets:
        if ds not in have:
            continue
        short = []
        for q in QUALITY:
            if q not in best.get(ds, {}):
                continue
            b, who = best[ds][q]
            v = runs.value(strategy, ds, q)
            pair = runs.paired(strategy, who, ds, q)
            optimistic = b + pair.high if pair.n else math.nan
            worst = max(worst, shortfall(optimistic, b))
            if not within(optimistic, b, tolerance):
                # Shown on the seeds both ran: a candidate with one seed is not set against the best's median
                # over three (its 0.66 could read as above a best of 0.57 that was 0.70 on that seed).
                v_c, b_c = runs.on_common_seeds(strategy, who, ds, q) if pair.n else (v, b)
                pct = f"{-100 * shortfall(v_c, b_c):+.1f}%" if b_c != 0 else "below a best of 0"
                short.append(f"{QUALITY_NAMES[q]} {v_c:.3g} vs {b_c:.3g} ({pct}; {pair.describe()})")
                data.append({"dataset": ds, "measure": q, "value": _num(v), "best": _num(b), "best_strategy": who,
                             "difference": _num(pair.mean), "interval": [_num(pair.low), _num(pair.high)],
                             "seeds": pair.n})
        lowest, seed = runs.worst_seed(strategy, ds, "path_efficiency")
        if lowest < PATH_EFFICIENCY_FLOOR:
            worst = max(worst, shortfall(lowest, PATH_EFFICIENCY_FLOOR))
            short.append(f"path efficiency {lowest:.3g} on seed {seed}, below the floor of "
                         f"{100 * PATH_EFFICIENCY_FLOOR:g}%")
            data.append({"dataset": ds, "measure": "path_efficiency", "value": _num(lowest),
                         "best": PATH_EFFICIENCY_FLOOR, "best_strategy": "the floor", "seed": seed})
        if short:
            text.append(f"{ds}: {', '.join(short)}")
    return worst, text, data


def _strategy_row(strategy: str, runs: _Runs, best: dict, eligible: bool, failure: str | None,
                  tolerance: float, names: dict[str, str]) -> dict:
    """One line of the recommendation's table: times, eligibility, quality and the reasons it may lose."""
    worst, misses, data = _quality_misses(strategy, runs, best, tolerance)
    # Medians, not the optimistic values: what separates strategies that are as fast within noise.
    gaps = [min(shortfall(runs.value(strategy, ds, q), best[ds][q][0]), 1.0)
            for ds in sorted(runs.datasets_of(strategy)) for q in STEP_QUALITY if q in best.get(ds, {})]
    missing = [ds for ds in runs.datasets if ds not in runs.datasets_of(strategy)]
    reasons = [failure] if failure else []
    if missing:
        reasons.append(f"no run on {', '.join(missing)}")
    if misses:
        reasons.append(f"more than {100 * tolerance:g}% short of the best beyond noise, or under the path "
                       f"efficiency floor, on " + "; ".join(misses))
    return dict(strategy=strategy, preset=names.get(strategy, ""),
                time_ms=1e3 * runs.over_datasets(strategy, "t_total"),
                x_floor=runs.over_datasets(strategy, "x_floor"), eligible=eligible,
                qualifies=eligible and not misses, worst_shortfall=worst,
                mean_shortfall=float(np.mean(gaps)) if gaps else math.nan, misses=data, reason="; ".join(reasons))


def as_fast(table: pd.DataFrame, key: str) -> dict[str, float]:
    """The qualifying strategies as fast as the front-runner (rule step 5), each with its time as a multiple of
    the front-runner's (the front-runner first, at 1). ``table`` is sorted by time."""
    qualifying = table[table.qualifies]
    if qualifying.empty:
        return {}
    front = float(qualifying.iloc[0][key])
    return {r.strategy: float(getattr(r, key)) / front for r in qualifying.itertuples()
            if getattr(r, key) <= (1 + TIME_TOLERANCE) * front}


def _choose(table: pd.DataFrame, key: str, tied: dict[str, float]) -> tuple[str | None, bool]:
    """``(choice, fallback)``: of the strategies as fast as the front-runner (``tied``), the closest to the best;
    else the eligible one with the smallest worst shortfall, from the best beyond noise or from the path efficiency
    floor (rule steps 4 to 6); ``(None, False)`` when none is eligible."""
    if tied:
        candidates = table[table.strategy.isin(list(tied))]
        return candidates.sort_values(["mean_shortfall", key, "strategy"], kind="stable").iloc[0].strategy, False
    eligible = table[table.eligible]
    if len(eligible):
        return eligible.sort_values(["worst_shortfall", key, "strategy"], kind="stable").iloc[0].strategy, True
    return None, False


def _explain_choice(table: pd.DataFrame, chosen: str, fallback: bool, key: str, tied: dict[str, float]) -> None:
    """Give the choice, and every qualifying strategy it beat, their reasons (in ``table``, in place)."""
    mine = table.loc[table.strategy == chosen].iloc[0]
    front = mine[key] / tied[chosen] if chosen in tied else math.nan  # the front-runner's time
    unit = " ms" if key == "time_ms" else "× the floor"
    for i, r in table.iterrows():
        if r.strategy == chosen:
            table.at[i, "reason"] = "chosen" + (
                f" (fallback: nothing qualifies; its worst shortfall, from the best beyond noise or from the floor, "
                f"is {100 * r.worst_shortfall:.1f}%)"
                if fallback else "")
        elif r.strategy in tied:
            gaps = " vs ".join(_distinct_percents(r.mean_shortfall, mine.mean_shortfall))
            lost = (f"further from the best: mean shortfall in optimality and path efficiency {gaps}"
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


def _evidence(chosen: str, fallback: bool, runs: _Runs, best: dict, ref: pd.DataFrame, table: pd.DataFrame,
              tolerance: float) -> dict:
    """The choice's medians against the best, with the paired interval, per dataset; its medians over datasets."""
    evidence = {}
    for ds in runs.datasets:
        e = {"time_ms": _num(1e3 * runs.value(chosen, ds, "t_total")),
             "x_floor": _num(runs.value(chosen, ds, "x_floor")),
             "seeds": int(((ref.strategy == chosen) & (ref.dataset == ds)).sum())}
        for qn in QUALITY:
            if qn in best.get(ds, {}):
                b, who = best[ds][qn]
                v = runs.value(chosen, ds, qn)
                pair = runs.paired(chosen, who, ds, qn)
                e[qn] = _num(v)
                e[f"best_{qn}"] = _num(b)
                e[f"best_{qn}_strategy"] = who
                e[f"{qn}_difference"] = [_num(pair.mean), _num(pair.low), _num(pair.high), pair.n]
                e[f"{qn}_within"] = within(b + pair.high if pair.n else math.nan, b, tolerance)
        evidence[ds] = e
    row = table.loc[table.strategy == chosen]
    evidence["median_time_ms"] = _num(float(row.time_ms.iloc[0]))
    evidence["median_x_floor"] = _num(float(row.x_floor.iloc[0]))
    for qn in QUALITY:
        evidence[f"median_{qn}"] = _num(runs.over_datasets(chosen, qn))
    if fallback:
        evidence["qualifies_from_tolerance"] = _num(float(row.worst_shortfall.iloc[0]))
    return evidence


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
        lines.append(f"choice: {rec.spec}{tag}" + ("  [FALLBACK: no strategy meets the rule]" if rec.fallback else ""))
        lines.append(f"  median over datasets of per-dataset median t_total: {rec.evidence['median_time_ms']:.3g} ms; "
                     f"of t_total/t_floor: {rec.evidence['median_x_floor']:.3g}×")
        if rec.fallback:
            lines.append(f"  no eligible strategy is within {100 * rec.tolerance:g}% everywhere beyond noise and above "
                         "the path efficiency floor; this one has the smallest worst shortfall ("
                         f"{100 * rec.evidence['qualifies_from_tolerance']:.1f}%), forced by: "
                         + "; ".join(f"{f['dataset']} {QUALITY_NAMES[f['measure']]}" for f in rec.forced_by))
        lines.append("evidence (medians over seeds; best = best eligible strategy on that dataset):")
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
    """One row per dataset: the choice's time and each measure against the best (``value / best``), as text."""
    rows = {}
    for ds, e in rec.evidence.items():
        if not isinstance(e, dict):
            continue
        row = {"time_ms": f"{e['time_ms']:.3g}", "x_floor": f"{e['x_floor']:.3g}"}
        for q in QUALITY:
            if q in e:
                row[q] = f"{e[q]:.4g} / {e[f'best_{q}']:.4g}" + ("" if e[f"{q}_within"] else " (NO)")
        rows[ds] = row
    return pd.DataFrame(rows).T


def what_to_use(recs: dict[str, Recommendation]) -> pd.DataFrame:
    """One row per regime: its choice, time, quality medians over datasets, and the runner-up with its reason."""
    rows = []
    for key, rec in recs.items():
        ev, up = rec.evidence, rec.runner_up
        rows.append({
            "regime": Regime.parse(key).describe(), "spec": rec.spec or "none", "fallback": rec.fallback,
            "time_ms": ev.get("median_time_ms"), "x_floor": ev.get("median_x_floor"),
            **{q: ev.get(f"median_{q}") for q in QUALITY},
            "datasets": len(rec.datasets),
            "seeds": min((e["seeds"] for e in ev.values() if isinstance(e, dict)), default=0),
            "runner_up": None if up is None else up.strategy,
            "runner_up_reason": None if up is None else up.reason,
        })
    return pd.DataFrame(rows)


def format_regimes(recs: dict[str, Recommendation]) -> str:
    """Every regime's :func:`format_text`, after a what-to-use summary."""
    table = what_to_use(recs)
    summary = ["what to use (per regime; medians over datasets):"]
    for r in table.itertuples():
        quality = ", ".join(f"{QUALITY_NAMES[q]} {getattr(r, q):.3g}" for q in QUALITY
                            if getattr(r, q) is not None and math.isfinite(getattr(r, q)))
        summary.append(f"  {r.regime:24s} {r.spec}{'  [FALLBACK]' if r.fallback else ''}  "
                       f"({r.time_ms:.3g} ms, {r.x_floor:.3g}× floor; {quality})" if r.time_ms is not None else
                       f"  {r.regime:24s} none")
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
                  path: str | Path | None = None) -> Path:
    """Write one choice per regime to ``strategies/default.json`` (or ``path``), which
    ``strategies.make("default")`` reads.

    Parameters
    ----------
    recs : Recommendation or dict
        ``{regime key: Recommendation}`` (a single recommendation counts for its own regime).
    db : str or Path
        The database the evidence comes from (recorded).
    path : str or Path, optional
        Where to write; default the package's ``default.json``.

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
    db_text = str(Path(db).resolve())
    data = {"rule": next(iter(recs.values())).rule,
            "regimes": {key: rec.as_json(db_text) for key, rec in recs.items()},
            "db": db_text, "generated": datetime.now(UTC).isoformat(timespec="seconds")}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
