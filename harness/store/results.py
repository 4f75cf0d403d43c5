"""The results database: one SQLite row per run, written only by the sweep's parent process.

The file is checked and marked as growbench's when opened (:mod:`harness.store.dbfile`), and
the run key is the table's PRIMARY KEY, so a rerun replaces rows and never duplicates them.

Each row is committed as soon as its run finishes (WAL journal), so a killed sweep
loses at most the runs in flight, and ``--resume`` skips every key already stored.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd

from harness.store.dbfile import DatabaseFileError, connect_read, connect_write

# Column name -> SQLite type. Config columns first; their values (and the code version)
# make the run key.
CONFIG_COLUMNS = {
    "strategy": "TEXT", "dataset": "TEXT", "d_s": "INTEGER", "d_e": "INTEGER", "b": "INTEGER",
    "d_k": "INTEGER", "p": "INTEGER", "seed": "INTEGER", "device": "TEXT", "n_batches": "INTEGER",
    "repeats": "INTEGER", "warmup_steps": "INTEGER", "dtype": "TEXT", "scale_policy": "TEXT",
}
RESULT_COLUMNS = {
    "optimality": "REAL", "first_order_decrease": "REAL", "loss_before": "REAL", "loss_after": "REAL",
    "loss_decrease": "REAL", "heldout_before": "REAL", "heldout_after": "REAL", "heldout_decrease": "REAL",
    "bottleneck": "REAL", "lam": "REAL", "n_loss_evals": "INTEGER", "fallback": "TEXT",
    "t_statistics": "REAL", "t_direction": "REAL", "t_truncation": "REAL", "t_line_search": "REAL",
    "t_total": "REAL", "t_floor": "REAL", "t_loss_eval": "REAL", "peak_mem_bytes": "INTEGER",
    "peak_mem_method": "TEXT", "extra": "TEXT", "path_efficiency": "REAL", "scan_decrease": "REAL",
    "heldout_decrease_at_scan_best": "REAL", "host_syncs": "INTEGER", "reference_converged": "REAL",
    "reference_residual": "REAL",
}
ENV_COLUMNS = {
    "torch_version": "TEXT", "device_name": "TEXT", "threads": "INTEGER", "git_commit": "TEXT",
    "code_version": "TEXT", "hostname": "TEXT", "python": "TEXT", "started_at": "TEXT", "finished_at": "TEXT",
}
COLUMNS = {"key": "TEXT PRIMARY KEY", "status": "TEXT NOT NULL", "error": "TEXT",
           **CONFIG_COLUMNS, **RESULT_COLUMNS, **ENV_COLUMNS}


def _create_runs(conn: sqlite3.Connection) -> None:
    """Create ``runs``, or give a checked older one the columns added since (inside the opening transaction)."""
    cols = ", ".join(f'"{c}" {t}' for c, t in COLUMNS.items())
    conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
    have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    for c, t in COLUMNS.items():
        if c not in have:  # never "key": a table without it was refused as foreign
            conn.execute(f'ALTER TABLE runs ADD COLUMN "{c}" {t.replace(" PRIMARY KEY", "").replace(" NOT NULL", "")}')


def read_runs(path: str | Path) -> pd.DataFrame:
    """Every run of an existing results file, read only, after checking that the file is growbench's.

    Empty (no columns) when the file has no ``runs`` table, e.g. training runs only.

    Raises
    ------
    DatabaseFileError
        Missing, foreign, a newer schema, or unreadable; the message names the file.
    """
    conn = connect_read(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return pd.read_sql_query("SELECT * FROM runs", conn) if "runs" in tables else pd.DataFrame()
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as e:
        raise DatabaseFileError(f"{path}: cannot read the runs: {e}") from e
    finally:
        conn.close()


class ResultsDB:
    """A results database at ``path`` (created with its folder if missing), opened for writing.

    The file is checked before anything else (:func:`harness.store.dbfile.connect_write`): a
    foreign, newer, read-only or unusable file raises :class:`DatabaseFileError` at once,
    before any measurement, and is left as it was.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn = connect_write(self.path, _create_runs)

    def keys(self, status: str | None = None) -> set[str]:
        """Keys of the stored runs (of one status if given)."""
        if status is None:
            return {r[0] for r in self.conn.execute("SELECT key FROM runs")}
        return {r[0] for r in self.conn.execute("SELECT key FROM runs WHERE status = ?", (status,))}

    def write(self, row: dict) -> None:
        """Insert or replace one run and commit at once."""
        row = {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items() if k in COLUMNS}
        names = ", ".join(f'"{k}"' for k in row)
        marks = ", ".join("?" for _ in row)
        try:  # the key is the PRIMARY KEY: a rerun replaces its row, never duplicates it
            with self.conn:
                self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", tuple(row.values()))
        except sqlite3.Error as e:  # e.g. the disk filled up, or the file was made read-only mid-sweep
            raise DatabaseFileError(f"{self.path}: cannot write the run: {e}") from e

    def frame(self) -> pd.DataFrame:
        """Every run as a DataFrame."""
        return pd.read_sql_query("SELECT * FROM runs", self.conn)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
