"""The results database: one SQLite row per run, written only by the sweep's parent process.

Each row is committed as soon as its run finishes (WAL journal), so a killed sweep
loses at most the runs in flight, and ``--resume`` skips every key already stored.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd

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
    "heldout_decrease_at_scan_best": "REAL", "host_syncs": "INTEGER",
}
ENV_COLUMNS = {
    "torch_version": "TEXT", "device_name": "TEXT", "threads": "INTEGER", "git_commit": "TEXT",
    "code_version": "TEXT", "hostname": "TEXT", "python": "TEXT", "started_at": "TEXT", "finished_at": "TEXT",
}
COLUMNS = {"key": "TEXT PRIMARY KEY", "status": "TEXT NOT NULL", "error": "TEXT",
           **CONFIG_COLUMNS, **RESULT_COLUMNS, **ENV_COLUMNS}


class ResultsDB:
    """A results database at ``path`` (created with its folder if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(f'"{c}" {t}' for c, t in COLUMNS.items())
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
        # Databases written by an older version gain the columns added since.
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        for c, t in COLUMNS.items():
            if c not in have:
                self.conn.execute(f'ALTER TABLE runs ADD COLUMN "{c}" {t.replace(" PRIMARY KEY", "")}')
        self.conn.commit()

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
        self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", tuple(row.values()))
        self.conn.commit()

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
