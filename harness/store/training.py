"""Training runs in a results file: ``train_runs`` (one row per run) and ``train_curves`` (its curve points).

The file is checked, marked and keyed as every store's (:class:`harness.store.base.RunStore`);
the tables' columns are :data:`harness.store.schema.TRAIN_RUNS` and :data:`~harness.store.schema.TRAIN_CURVES`.
A run's row and its curve points are written in one transaction when the run ends, so
a killed training sweep loses at most the runs in flight and never leaves a partial
curve; resume skips every key already stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from growbench.harness.store.base import RunStore, read_tables
from growbench.harness.store.schema import TRAIN_CURVES, TRAIN_RUNS


class TrainDB(RunStore):
    """The training runs of a results file at ``path`` (created with its folder if missing), opened for writing."""

    table = TRAIN_RUNS
    companions = (TRAIN_CURVES,)
    run_noun = "training run"

    def _write(self, row: dict) -> None:
        """The run's row and its curve (``row["curve"]``, replacing any stored under its key)."""
        self.conn.execute("DELETE FROM train_curves WHERE key = ?", (row["key"],))
        super()._write(row)
        self.conn.executemany(
            "INSERT INTO train_curves VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(row["key"], c["step"], c["wall_s"], c["flops"], c["train_loss"], c["heldout_loss"], json.dumps(c["d_k"]))
             for c in row.get("curve") or []],
        )

    def curves(self) -> pd.DataFrame:
        """Every curve point, with ``key``, by key and step."""
        return self._read(TRAIN_CURVES)


def load(db_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, curves)`` of a database, read only; an empty frame for a table it lacks, both if it is missing.

    The numeric columns must hold numbers (:func:`harness.store.base.check_numbers`): the report
    computes with them.

    Raises
    ------
    DatabaseFileError
        The file is not growbench's (foreign, a newer schema, damaged, not SQLite), or text is stored
        in a numeric column; the message names it.
    sqlite3.DatabaseError, pandas.errors.DatabaseError
        A table cannot be read (the report then shows no training: :mod:`harness.report.train_runs`).
    """
    if not Path(db_path).exists():
        return pd.DataFrame(), pd.DataFrame()
    runs, curves = read_tables(db_path, TRAIN_RUNS, TRAIN_CURVES, numbers=True)
    return runs, curves
