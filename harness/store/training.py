"""Training runs in the results database: ``train_runs`` (one row per run) and ``train_curves``.

A run's row and its curve points are written in one transaction when the run ends, so
a killed training sweep loses at most the runs in flight and never leaves a partial
curve; resume skips every key already stored.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd

from harness.store.dbfile import DatabaseFileError, connect_read, connect_write
from harness.train import config_fields

SUMMARY_COLUMNS = {
    "final_heldout": "REAL", "best_heldout": "REAL", "final_train": "REAL", "wall_s": "REAL",
    "growth_wall_s": "REAL", "train_flops": "REAL", "growth_flops": "REAL", "total_flops": "REAL",
    "n_growths": "INTEGER", "final_d_k": "TEXT", "n_params": "INTEGER", "events": "TEXT", "checks": "TEXT",
}
ENV_COLUMNS = ("torch_version", "device_name", "threads", "git_commit", "code_version", "hostname", "python",
               "started_at", "finished_at")
CURVE_COLUMNS = ("step", "wall_s", "flops", "train_loss", "heldout_loss", "d_k")


def _columns() -> dict[str, str]:
    cols = {"key": "TEXT PRIMARY KEY", "status": "TEXT NOT NULL", "error": "TEXT"}
    cols.update({name: "" for name in config_fields()})  # SQLite keeps the Python type of each value
    cols.update(SUMMARY_COLUMNS)
    cols.update({name: "" for name in ENV_COLUMNS})
    return cols


class TrainDB:
    """The training tables of a results database at ``path`` (created with its folder if missing).

    The file is checked as :class:`harness.store.results.ResultsDB` checks it, before any training starts.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.columns = _columns()
        # Checked, created or upgraded, and marked before any training (harness.store.dbfile).
        self.conn = connect_write(self.path, self._create)

    def _create(self, conn: sqlite3.Connection) -> None:
        """Create the training tables, or give checked older ones the columns added since."""
        cols = ", ".join(f'"{c}" {t}'.strip() for c, t in self.columns.items())
        conn.execute(f"CREATE TABLE IF NOT EXISTS train_runs ({cols})")
        have = {r[1] for r in conn.execute("PRAGMA table_info(train_runs)")}
        for c, t in self.columns.items():
            if c not in have:  # never "key" or "status": a table without them was refused as foreign
                conn.execute(f'ALTER TABLE train_runs ADD COLUMN "{c}" '
                             f'{t.replace(" PRIMARY KEY", "").replace(" NOT NULL", "")}')
        conn.execute("CREATE TABLE IF NOT EXISTS train_curves (key TEXT NOT NULL, step INTEGER NOT NULL, "
                     "wall_s REAL, flops REAL, train_loss REAL, heldout_loss REAL, d_k TEXT, "
                     "PRIMARY KEY (key, step))")

    def keys(self, status: str | None = None) -> set[str]:
        """Keys of the stored runs (of one status if given)."""
        q, args = ("SELECT key FROM train_runs", ()) if status is None else (
            "SELECT key FROM train_runs WHERE status = ?", (status,))
        return {r[0] for r in self.conn.execute(q, args)}

    def write(self, row: dict) -> None:
        """Insert or replace one run and its curve, in one transaction."""
        curve = row.get("curve") or []
        vals = {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items() if k in self.columns}
        names = ", ".join(f'"{k}"' for k in vals)
        marks = ", ".join("?" for _ in vals)
        try:
            with self.conn:  # one transaction: the run and its curve land together or not at all
                self.conn.execute("DELETE FROM train_curves WHERE key = ?", (row["key"],))
                self.conn.execute(f"INSERT OR REPLACE INTO train_runs ({names}) VALUES ({marks})",
                                  tuple(vals.values()))
                self.conn.executemany(
                    "INSERT INTO train_curves VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(row["key"], c["step"], c["wall_s"], c["flops"], c["train_loss"], c["heldout_loss"],
                      json.dumps(c["d_k"])) for c in curve],
                )
        except sqlite3.Error as e:  # e.g. the disk filled up, or the file was made read-only mid-sweep
            raise DatabaseFileError(f"{self.path}: cannot write the training run: {e}") from e

    def runs(self) -> pd.DataFrame:
        """Every training run as a DataFrame."""
        return pd.read_sql_query("SELECT * FROM train_runs", self.conn)

    def curves(self) -> pd.DataFrame:
        """Every curve point, with ``key``."""
        return pd.read_sql_query("SELECT * FROM train_curves ORDER BY key, step", self.conn)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> TrainDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(db_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, curves)`` of a database, read only; empty frames if it is missing or has no training tables.

    Raises
    ------
    DatabaseFileError
        The file is not growbench's (foreign, a newer schema, not SQLite); the message names it.
    """
    path = Path(db_path)
    if not path.exists():
        return pd.DataFrame(), pd.DataFrame()
    conn = connect_read(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "train_runs" not in tables:
            return pd.DataFrame(), pd.DataFrame()
        return (pd.read_sql_query("SELECT * FROM train_runs", conn),
                pd.read_sql_query("SELECT * FROM train_curves ORDER BY key, step", conn))
    finally:
        conn.close()
