"""Choose the default strategy from a results database, by a fixed and documented rule.

The rule (:data:`RULE`), applied by :func:`recommend`:

1. **Reference configuration.** For each dataset, only the runs of its *reference
   configuration* count: the group of runs sharing sizes (``d_s, d_e, b, d_k, p``),
   ``n_batches``, ``repeats``, ``warmup_steps``, ``dtype``, ``scale_policy`` and device
   that covers the most distinct strategies (ties: the most runs, then the smallest
   sizes). Every strategy is thus compared on the same problems and seeds; the
   scaling grids of a sweep (other sizes, fewer strategies) do not mix in.
2. **Eligible.** Growth strategies only (the baselines ``random``, ``zero``,
   ``gradmax`` and names that are not valid specs are excluded) that never failed on
   any run in the database (any configuration, any device) and that have at least one
   successful run in the reference configuration of every dataset present.
3. **Quality.** Per dataset, take each strategy's median over seeds of ``optimality``
   and of ``heldout_decrease``. The *best* value is the highest such median among the
   eligible strategies (a strategy that failed, or skipped a dataset, cannot veto the
   others; its own medians are still compared with the best in its runner-up line). A value is
   *within 2 %* of it when ``value >= best - 0.02 * |best|``: with a negative best
   (no strategy lowers the held-out loss) this allows an increase at most 2 % larger
   than the best one's; with a best of exactly 0 it asks for no increase at all.
   A strategy *qualifies* when both of its medians are within 2 % of the best on every
   dataset.
4. **Speed.** Time is ``t_total`` (the growth, statistics included): the median over
   seeds per dataset, then the **median of these per-dataset medians** (every dataset
   weighs the same, whatever its problem size). The recommendation is the fastest
   qualifying eligible strategy (ties: the spec string). ``time_metric="x_floor"``
   ranks by ``t_total / t_floor`` instead (same medians): the floor is timed
   interleaved with the growth's repeats, so the ratio cancels slow periods of a
   shared machine; it is a robustness check, not the documented rule.
5. **Fallback.** If no eligible strategy qualifies, the eligible strategy with the
   smallest worst shortfall ``(best - value) / |best|`` over datasets and both
   measures is returned (the first to qualify as the tolerance is raised; ties: the
   faster), flagged ``fallback``; ``growbench recommend --write`` then refuses unless
   ``--force``.

The evidence (per-dataset medians against the best) and every runner-up, with the
reason it lost, come with the choice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

import strategies
from harness.store.results import read_runs
from harness.store.schema import RUNS
from strategies.spec import check_default_choice

TOLERANCE = 0.02
QUALITY = ("optimality", "heldout_decrease")
QUALITY_NAMES = {"optimality": "optimality", "heldout_decrease": "held-out decrease"}
CELL_COLUMNS = ("d_s", "d_e", "b", "d_k", "p", "n_batches", "repeats", "warmup_steps", "dtype", "scale_policy",
                "device")
RULE = (
    "Among growth strategies (baselines excluded) that never failed on any run in the database and that ran on "
    "every dataset present, choose the fastest by the median over datasets of the per-dataset median {metric}, "
    "whose median optimality and median held-out loss decrease are, on every dataset, within {tol:g}% of the best "
    "eligible strategy's on that dataset (value >= best - {frac:g}*|best|). Per dataset only its reference "
    "configuration counts: the sizes/settings/device group with the most strategies. Medians are over seeds."
)


class NoResults(ValueError):
    """The database is missing, empty, or holds no successful run."""


def rule_text(tolerance: float = TOLERANCE, time_metric: str = "t_total") -> str:
    """The rule in one paragraph, with the tolerance filled in."""
    metric = "t_total" if time_metric == "t_total" else "t_total/t_floor (x_floor)"
    return RULE.format(tol=100 * tolerance, frac=tolerance, metric=metric)


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

    @property
    def runners_up(self) -> pd.DataFrame:
        return self.table[self.table.strategy != self.spec]

    def as_json(self, db: str | None = None) -> dict:
        """What ``--write`` stores in ``strategies/default.json`` (key ``spec`` first)."""
        return {
            "spec": self.spec,
            "rule": self.rule,
            "fallback": self.fallback,
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


def recommend(frame: pd.DataFrame, tolerance: float = TOLERANCE, device: str | None = None,
              time_metric: str = "t_total") -> Recommendation:
    """Apply the rule of the module docstring to a runs frame (as from :func:`load_frame`).

    Parameters
    ----------
    frame : pandas.DataFrame
        Every run of the database, failed ones included (they make a strategy ineligible).
    tolerance : float
        How far below the best a median may be, as a fraction of ``|best|``.
    device : str, optional
        Compare the runs of this device only; default as :func:`reference_runs`.
    time_metric : {"t_total", "x_floor"}
        ``"t_total"`` (the rule) or ``"x_floor"`` (``t_total / t_floor``, a robustness check).

    Returns
    -------
    Recommendation

    Raises
    ------
    NoResults
        ``frame`` holds no successful run.
    ValueError
        An unknown ``time_metric`` or a tolerance that is not a finite number >= 0.
    """
    _check_rule_arguments(tolerance, time_metric)
    key = "time_ms" if time_metric == "t_total" else "x_floor"
    if frame[frame.status == "ok"].empty:
        raise NoResults("no successful runs in the database")
    ref = reference_runs(frame, device)
    medians = _Medians.of(ref)
    failures = _failure_notes(frame)
    every_growth = sorted({s for s in frame.strategy.dropna().unique() if is_growth(s)})
    baselines = sorted({s for s in frame.strategy.dropna().unique() if not is_growth(s)})
    eligible = {s for s in every_growth if s not in failures and medians.datasets_of(s) >= set(medians.datasets)}
    best = medians.best(eligible)
    names = preset_names()
    rows = [_strategy_row(s, medians, best, s in eligible, failures.get(s), tolerance, names) for s in every_growth]
    table = pd.DataFrame(rows, columns=["strategy", "preset", "time_ms", "x_floor", "eligible", "qualifies",
                                        "worst_shortfall", "reason"])
    table = table.sort_values([key, "strategy"], na_position="last", kind="stable").reset_index(drop=True)
    chosen, fallback = _choose(table, key)
    evidence = {}
    if chosen is not None:
        _explain_choice(table, chosen, fallback, key)
        evidence = _evidence(chosen, fallback, medians, best, ref, table, tolerance)
    table["rank"] = range(1, len(table) + 1)
    return Recommendation(spec=chosen, rule=rule_text(tolerance, time_metric), fallback=fallback, tolerance=tolerance,
                          datasets=medians.datasets, cells=cell_description(ref), evidence=evidence, table=table,
                          excluded_baselines=baselines)


def _check_rule_arguments(tolerance: float, time_metric: str) -> None:
    """Refuse an unknown time metric or a tolerance that is not a finite number >= 0 (a bool is not a number)."""
    if time_metric not in ("t_total", "x_floor"):
        raise ValueError(f"unknown time metric {time_metric!r}; valid: t_total, x_floor")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


@dataclass(frozen=True)
class _Medians:
    """Medians over seeds of the growth strategies' reference runs (rule steps 1 and 3)."""

    table: pd.DataFrame  # index (strategy, dataset); columns t_total, x_floor and QUALITY
    datasets: list[str]  # every dataset of the reference runs, baselines' included

    @classmethod
    def of(cls, ref: pd.DataFrame) -> _Medians:
        growth = ref[ref.strategy.map(is_growth)].assign(x_floor=lambda d: d.t_total / d.t_floor)
        return cls(growth.groupby(["strategy", "dataset"])[["t_total", "x_floor", *QUALITY]].median(),
                   sorted(ref.dataset.unique()))

    def datasets_of(self, strategy: str) -> set[str]:
        """The datasets on which ``strategy`` has a successful reference run."""
        if strategy not in self.table.index.get_level_values("strategy"):
            return set()
        return set(self.table.loc[strategy].index)

    def value(self, strategy: str, dataset: str, column: str) -> float:
        """The median of ``column`` of ``strategy`` on ``dataset``."""
        return float(self.table.loc[(strategy, dataset), column])

    def over_datasets(self, strategy: str, column: str) -> float:
        """The median over datasets of the per-dataset medians of ``column`` (every dataset weighs the same)."""
        have = self.datasets_of(strategy)
        per_dataset = [self.value(strategy, ds, column) for ds in self.datasets if ds in have]
        return float(pd.Series(per_dataset).median()) if per_dataset else math.nan

    def best(self, eligible: set[str]) -> dict[str, dict[str, tuple[float, str]]]:
        """``{dataset: {measure: (best median, its strategy)}}`` among the ``eligible`` strategies.

        Only eligible strategies set the best, so that one that failed, or skipped a dataset, cannot veto the others.
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
    """``{strategy: "failed N of M runs (first: <error>)"}`` for every strategy with a failed run, on any device."""
    n_runs = frame.groupby("strategy").size()
    return {s: f"failed {len(runs)} of {int(n_runs[s])} runs (first: {first_error(runs.error)})"
            for s, runs in frame[frame.status != "ok"].groupby("strategy")}


def _quality_misses(strategy: str, medians: _Medians, best: dict, tolerance: float) -> tuple[float, list[str]]:
    """The worst shortfall of ``strategy``'s medians from the best, and per dataset the measures not within it."""
    worst, misses = 0.0, []
    have = medians.datasets_of(strategy)
    for ds in medians.datasets:
        if ds not in have:
            continue
        short = []
        for q in QUALITY:
            if q not in best.get(ds, {}):
                continue
            v, (b, _) = medians.value(strategy, ds, q), best[ds][q]
            worst = max(worst, shortfall(v, b))
            if not within(v, b, tolerance):
                pct = f"{-100 * shortfall(v, b):+.1f}%" if b != 0 else "below a best of 0"
                short.append(f"{QUALITY_NAMES[q]} {v:.3g} vs {b:.3g} ({pct})")
        if short:
            misses.append(f"{ds}: {', '.join(short)}")
    return worst, misses


def _strategy_row(strategy: str, medians: _Medians, best: dict, eligible: bool, failure: str | None,
                  tolerance: float, names: dict[str, str]) -> dict:
    """One line of the recommendation's table: times, eligibility, quality and the reasons it may lose."""
    worst, misses = _quality_misses(strategy, medians, best, tolerance)
    missing = [ds for ds in medians.datasets if ds not in medians.datasets_of(strategy)]
    reasons = [failure] if failure else []
    if missing:
        reasons.append(f"no run on {', '.join(missing)}")
    if misses:
        reasons.append(f"more than {100 * tolerance:g}% short of the best on " + "; ".join(misses))
    return dict(strategy=strategy, preset=names.get(strategy, ""),
                time_ms=1e3 * medians.over_datasets(strategy, "t_total"),
                x_floor=medians.over_datasets(strategy, "x_floor"), eligible=eligible,
                qualifies=eligible and not misses, worst_shortfall=worst, reason="; ".join(reasons))


def _choose(table: pd.DataFrame, key: str) -> tuple[str | None, bool]:
    """``(choice, fallback)``: the fastest qualifying strategy, else the eligible one that qualifies first as the
    tolerance is raised (rule steps 4 and 5); ``(None, False)`` when none is eligible."""
    qualifying = table[table.qualifies]
    if len(qualifying):
        return qualifying.iloc[0].strategy, False
    eligible = table[table.eligible]
    if len(eligible):
        return eligible.sort_values(["worst_shortfall", key, "strategy"], kind="stable").iloc[0].strategy, True
    return None, False


def _explain_choice(table: pd.DataFrame, chosen: str, fallback: bool, key: str) -> None:
    """Give the choice, and every qualifying strategy it beat on time, their reasons (in ``table``, in place)."""
    k_chosen = float(table.loc[table.strategy == chosen, key].iloc[0])
    unit = " ms" if key == "time_ms" else "× the floor"
    for i, r in table.iterrows():
        if r.strategy == chosen:
            table.at[i, "reason"] = "chosen" + (
                f" (fallback: nothing qualifies; qualifies from a tolerance of {100 * r.worst_shortfall:.1f}%)"
                if fallback else "")
        elif r.qualifies:
            table.at[i, "reason"] = (f"qualifies but slower: {r[key]:.3g}{unit} vs {k_chosen:.3g}{unit} "
                                     f"({r[key] / k_chosen:.2f}×)")


def _evidence(chosen: str, fallback: bool, medians: _Medians, best: dict, ref: pd.DataFrame, table: pd.DataFrame,
              tolerance: float) -> dict:
    """The choice's medians against the best, per dataset, and its medians over datasets."""
    evidence = {}
    for ds in medians.datasets:
        e = {"time_ms": _num(1e3 * medians.value(chosen, ds, "t_total")),
             "x_floor": _num(medians.value(chosen, ds, "x_floor")),
             "seeds": int(((ref.strategy == chosen) & (ref.dataset == ds)).sum())}
        for qn in QUALITY:
            if qn in best.get(ds, {}):
                b, who = best[ds][qn]
                v = medians.value(chosen, ds, qn)
                e[qn] = _num(v)
                e[f"best_{qn}"] = _num(b)
                e[f"best_{qn}_strategy"] = who
                e[f"{qn}_within"] = within(v, b, tolerance)
        evidence[ds] = e
    row = table.loc[table.strategy == chosen]
    evidence["median_time_ms"] = _num(float(row.time_ms.iloc[0]))
    evidence["median_x_floor"] = _num(float(row.x_floor.iloc[0]))
    if fallback:
        evidence["qualifies_from_tolerance"] = _num(float(row.worst_shortfall.iloc[0]))
    return evidence


# ------------------------------------------------------------------ output
def format_text(rec: Recommendation) -> str:
    """The rule, the choice, its evidence and the runners-up, as printed by ``growbench recommend``."""
    names = preset_names()
    lines = ["rule: " + rec.rule, "", "reference configurations:"]
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
            lines.append(f"  no eligible strategy is within {100 * rec.tolerance:g}% everywhere; this one qualifies "
                         "first as the tolerance is raised (from "
                         f"{100 * rec.evidence['qualifies_from_tolerance']:.1f}%)")
        lines.append("evidence (medians over seeds; best = best eligible strategy on that dataset):")
        ev = pd.DataFrame({ds: {
            "time_ms": f"{e['time_ms']:.3g}",
            "x_floor": f"{e['x_floor']:.3g}",
            "optimality": f"{e.get('optimality', math.nan):.4f}",
            "best_opt": f"{e.get('best_optimality', math.nan):.4f} ({label(e.get('best_optimality_strategy', ''))})",
            "heldout_dec": f"{e.get('heldout_decrease', math.nan):.4g}",
            "best_heldout": f"{e.get('best_heldout_decrease', math.nan):.4g} "
                            f"({label(e.get('best_heldout_decrease_strategy', ''))})",
            "within": "yes" if e.get("optimality_within") and e.get("heldout_decrease_within") else "NO",
        } for ds, e in rec.evidence.items() if isinstance(e, dict)}).T
        lines += ["  " + ln for ln in ev.to_string().splitlines()]
    lines += ["", "runners-up (by median time; ms and multiple of the floor):"]
    if rec.spec is not None:
        lines.append("  " + rank_note(rec))
    for r in rec.runners_up.itertuples():
        tag = f" [{r.preset}]" if r.preset else ""
        t = f"{r.time_ms:8.3g} ms {r.x_floor:6.3g}×fl" if math.isfinite(r.time_ms) else "       – ms"
        lines.append(f"  {r.rank:2d}. {t}  {r.strategy}{tag}: {r.reason}")
    return "\n".join(lines)


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


def write_default(rec: Recommendation, db: str | Path, path: str | Path | None = None) -> Path:
    """Write the recommendation to ``strategies/default.json`` (or ``path``); ``strategies.make("default")``
    reads its ``spec`` key.

    Raises
    ------
    ValueError
        When there is no choice, or it is ``default`` itself or a baseline
        (:func:`~strategies.spec.check_default_choice`); nothing is written.
    """
    if rec.spec is None:
        raise ValueError("no strategy to write: no growth strategy is eligible")
    path = Path(path) if path else default_file()
    try:
        # The same check as on load: a recursive ("default") or baseline choice would only be
        # replaced by the built-in default, with a warning, every time the file is read.
        check_default_choice(rec.spec)
    except ValueError as e:
        raise ValueError(f"not written to {path}: {e}") from None
    path.write_text(json.dumps(rec.as_json(str(Path(db).resolve())), indent=2) + "\n")
    return path
