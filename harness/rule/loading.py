"""Loading the runs the rule reads: the database as one frame, its timings cleaned, and which names are growth specs.

One module of the recommendation (:mod:`harness.recommend` lists them all).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from growbench import strategies
from growbench.harness.store.dbfile import DatabaseFileError
from growbench.harness.store.results import read_runs
from growbench.harness.store.schema import RUNS

#: What every successful run was measured at: the rule groups and compares runs by these.
CONFIGURATION_COLUMNS = ("strategy", "dataset", "device", "d_s", "d_e", "b", "d_k", "p", "seed", "n_batches")
#: The timings of a run (seconds), every one a duration.
TIMINGS = tuple(c for c in RUNS.columns if c.startswith("t_"))
#: The timings that a run's time rests on: a growth and the floor it is compared with both take time.
POSITIVE_TIMINGS = ("t_total", "t_floor")


class NoResults(ValueError):
    """The database is missing, empty, or holds no successful run."""


def load_frame(db_path: str | Path) -> pd.DataFrame:
    """Every run of the database (read only), with every column of today's ``runs`` table.

    Timings that are no duration (NULL, infinite, NaN, negative; a total or floor of 0) read as missing
    (:func:`clean_timings`): such a run keeps its quality measures, and :func:`untimed` tells the report to
    leave it out of what is timed.

    Raises
    ------
    NoResults
        The file is missing or has no successful run.
    harness.store.dbfile.DatabaseFileError
        A file that is not growbench's (also a ``ValueError``), naming the file; the file is left untouched.
    """
    path = Path(db_path)
    if not path.exists():
        raise NoResults(f"no successful runs in {path}: the file does not exist (run 'growbench run' first)")
    frame = read_runs(path, numbers=True)  # it computes with them: text in a numeric column is refused
    if frame.empty:
        raise NoResults(f"no successful runs in {path}: the database has no runs")
    frame = clean_timings(RUNS.complete(frame))
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


def clean_timings(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every timing a float, and each one that is no duration missing (NaN).

    A timing that is NULL, infinite, NaN or negative, and a total or floor of 0, cannot be a growth's time: kept,
    it turns medians, ratios and axis limits into infinities or errors. Quality columns are left as they are.

    Parameters
    ----------
    frame : pandas.DataFrame
        Runs as read from the database (a column that holds only NULL reads as objects).

    Returns
    -------
    pandas.DataFrame
        A copy; the timing columns it has are float.
    """
    frame = frame.copy()
    for column in TIMINGS:
        if column not in frame:
            continue
        values = pd.to_numeric(frame[column], errors="coerce").astype(float)
        bad = ~np.isfinite(values) | (values < 0)
        if column in POSITIVE_TIMINGS:
            bad |= values == 0
        frame[column] = values.mask(bad)
    return frame


def untimed(frame: pd.DataFrame) -> pd.Series:
    """Whether each run is a successful run without a time (its ``t_total`` missing after :func:`clean_timings`).

    Such runs count wherever quality is compared; figures and tables of time leave them out.
    """
    total = frame["t_total"] if "t_total" in frame else pd.Series(np.nan, index=frame.index)
    return (frame.status == "ok") & pd.to_numeric(total, errors="coerce").isna()


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
