"""Growth runs in a results file: the ``runs`` table, one row per run, written only by the sweep's parent process.

The file is checked, marked and keyed as every store's (:class:`harness.store.base.RunStore`);
the table's columns are :data:`harness.store.schema.RUNS`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd

from growbench.harness.store.base import RunStore, read_tables
from growbench.harness.store.dbfile import DatabaseFileError
from growbench.harness.store.schema import RUNS


def read_runs(path: str | Path, *, numbers: bool = False) -> pd.DataFrame:
    """Every run of an existing results file, read only, after checking that the file is growbench's.

    The columns are the file's own: those of a file written before a column existed are not added
    (:meth:`harness.store.schema.Table.complete` adds them). Empty (no columns) when the file has no
    ``runs`` table, e.g. training runs only.

    Parameters
    ----------
    path : str or Path
    numbers : bool
        Refuse text in a numeric column (:func:`harness.store.base.check_numbers`), for a reader
        that computes with the results; off, the rows are read as stored.

    Raises
    ------
    DatabaseFileError
        Missing, foreign, a newer schema, damaged, or unreadable; with ``numbers``, text in a
        numeric column; the message names the file.
    """
    try:
        (runs,) = read_tables(path, RUNS, numbers=numbers)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as e:  # the CLI prints a one-line refusal
        raise DatabaseFileError(f"{path}: cannot read the runs: {e}") from e
    return runs


class ResultsDB(RunStore):
    """The growth runs of a results file at ``path`` (created with its folder if missing), opened for writing."""

    table = RUNS
