"""The paired statistics of the rule: a mean over seeds with its t interval, and the runs summarised by seed.

One module of the recommendation (:mod:`harness.recommend` lists them all): rule steps 3 and 4's numbers.
:class:`Paired` is the interval every claim of the recommendation and the report rests on; :class:`SeedRuns`
holds the growth strategies' reference runs per seed and compares them, seed by seed, with the best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from growbench.harness.rule.loading import is_growth
from growbench.harness.rule.parameters import CONFIDENCE, DECIDING, DIAGNOSTICS
from growbench.harness.rule.reference import measures


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
        """The mean of the finite ``values`` and its Student-t interval at ``confidence`` (NaN for none)."""
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
        """``+1.2 [+0.3, +2.1] over 8 seeds`` (with ``percent``, the values as percentages)."""
        f = (lambda x: f"{100 * x:+.3g}%") if percent else (lambda x: f"{x:+.3g}")
        if self.n == 0:
            return "no common seed"
        if self.n == 1:
            return f"{f(self.mean)}, 1 seed (no noise estimate)"
        return f"{f(self.mean)} [{f(self.low)}, {f(self.high)}] over {self.n} seeds"


def finite(x: object) -> float | None:
    """``x`` as a float, or None when it is missing or not finite (JSON has no NaN or infinity)."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def interval(p: Paired) -> list:
    """``[mean, low, high, n]`` of ``p``, each number finite or None (as stored in JSON)."""
    return [finite(p.mean), finite(p.low), finite(p.high), p.n]


@dataclass(frozen=True)
class SeedRuns:
    """The growth strategies' reference runs: per seed, and their summaries over seeds (rule steps 1 to 4)."""

    per_seed: pd.DataFrame  # index (strategy, dataset, seed); columns t_total, x_floor, the gain and the diagnostics
    medians: pd.DataFrame  # medians over seeds, index (strategy, dataset)
    means: pd.DataFrame  # means over seeds, index (strategy, dataset)
    datasets: list[str]  # every dataset of the reference runs, baselines' included
    confidence: float

    COLUMNS = ("t_total", "x_floor", DECIDING, "heldout_gain_se", "heldout_batches", *DIAGNOSTICS,
               "statistics_tokens", "d_e")

    @classmethod
    def of(cls, ref: pd.DataFrame, confidence: float = CONFIDENCE) -> SeedRuns:
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
