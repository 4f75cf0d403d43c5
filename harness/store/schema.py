"""The tables of a results file: their names, columns, keys and SQL, and nothing else.

Columns are only ever added, never renamed or dropped, so a table's columns are also
every column growbench has ever written to it: :mod:`harness.store.dbfile` accepts an
unmarked older file only when its tables use no other, and a writer adds the missing
ones (:class:`harness.store.base.RunStore`).

The column lists are written out here rather than taken from the configuration
dataclasses (:class:`harness.measure.RunConfig`, :class:`harness.train.TrainConfig`):
the file format is a contract of its own, readable without torch, and a test keeps the
two in step (``tests/test_db_schema.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Table:
    """One table of a results file.

    Attributes
    ----------
    name : str
    columns : dict of str to str
        Column name -> its SQLite declaration, in table order. An empty declaration
        leaves each value the type Python gave it.
    primary_key : tuple of str
        The key columns in key order. A one-column key is declared on its column
        (``"TEXT PRIMARY KEY"``); a longer one becomes a table constraint.
    order_by : tuple of str
        Row order of a full read; empty for the order SQLite stores them in.
    bare_names : bool
        Leave column names unquoted in ``CREATE TABLE``.
    """

    name: str
    columns: dict[str, str]
    primary_key: tuple[str, ...]
    order_by: tuple[str, ...] = ()
    # train_curves has always been created with bare names: keeping them keeps the
    # CREATE statement that SQLite stores in new files identical to older files'.
    bare_names: bool = False

    @property
    def create_sql(self) -> str:
        """``CREATE TABLE IF NOT EXISTS`` with every column and the key."""
        parts = [f"{self._quoted(c)} {decl}".strip() for c, decl in self.columns.items()]
        if len(self.primary_key) > 1:
            parts.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(parts)})"

    def add_column_sql(self, column: str) -> str:
        """``ALTER TABLE ... ADD COLUMN`` for a column an older file lacks.

        SQLite adds no key or ``NOT NULL`` column to a table with rows, so those clauses are dropped;
        the key and ``status`` are never missing (:mod:`harness.store.dbfile` refuses such tables).
        """
        decl = self.columns[column].replace(" PRIMARY KEY", "").replace(" NOT NULL", "")
        return f'ALTER TABLE {self.name} ADD COLUMN "{column}" {decl}'

    @property
    def numeric_columns(self) -> tuple[str, ...]:
        """The columns declared ``REAL`` or ``INTEGER``: growbench stores only numbers (or nothing) in them."""
        return tuple(c for c, decl in self.columns.items() if decl.split()[:1] in (["REAL"], ["INTEGER"]))

    @property
    def select_sql(self) -> str:
        """Every row, in :attr:`order_by` order."""
        order = f" ORDER BY {', '.join(self.order_by)}" if self.order_by else ""
        return f"SELECT * FROM {self.name}{order}"

    def complete(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with every column of the table, in table order, then any others.

        A file written before a column existed reads without it; here it is added, empty.
        """
        return frame.reindex(columns=list(dict.fromkeys([*self.columns, *frame.columns])))

    def _quoted(self, column: str) -> str:
        return column if self.bare_names else f'"{column}"'


# ------------------------------------------------------------------ growth runs: runs
# A run's key is made of its configuration columns' values and the code version.
CONFIG_COLUMNS = {
    "strategy": "TEXT", "dataset": "TEXT", "d_s": "INTEGER", "d_e": "INTEGER", "b": "INTEGER",
    "d_k": "INTEGER", "p": "INTEGER", "seed": "INTEGER", "device": "TEXT", "n_batches": "INTEGER",
    "repeats": "INTEGER", "warmup_steps": "INTEGER", "dtype": "TEXT", "scale_policy": "TEXT",
    "heldout_batches": "INTEGER",
}
RESULT_COLUMNS = {
    "optimality": "REAL", "first_order_decrease": "REAL", "loss_before": "REAL", "loss_after": "REAL",
    "loss_decrease": "REAL", "heldout_before": "REAL", "heldout_after": "REAL", "heldout_decrease": "REAL",
    "bottleneck": "REAL", "lam": "REAL", "n_loss_evals": "INTEGER", "fallback": "TEXT",
    "t_statistics": "REAL", "t_direction": "REAL", "t_truncation": "REAL", "t_line_search": "REAL",
    "t_total": "REAL", "t_floor": "REAL", "t_loss_eval": "REAL", "peak_mem_bytes": "INTEGER",
    "peak_mem_method": "TEXT", "extra": "TEXT", "path_efficiency": "REAL", "scan_decrease": "REAL",
    "heldout_decrease_at_scan_best": "REAL", "host_syncs": "INTEGER", "reference_converged": "REAL",
    "reference_residual": "REAL", "heldout_decrease_se": "REAL", "heldout_tokens": "INTEGER",
    "statistics_tokens": "INTEGER",
}
# Where and with what each run was made (harness.env.recorded); both run tables have them.
ENV_COLUMNS = {
    "torch_version": "TEXT", "device_name": "TEXT", "threads": "INTEGER", "git_commit": "TEXT",
    "code_version": "TEXT", "hostname": "TEXT", "python": "TEXT", "started_at": "TEXT", "finished_at": "TEXT",
    "allocator": "TEXT", "cpu_capability": "TEXT",
}
_RUN_STATUS = {"key": "TEXT PRIMARY KEY", "status": "TEXT NOT NULL", "error": "TEXT"}
RUNS = Table("runs", {**_RUN_STATUS, **CONFIG_COLUMNS, **RESULT_COLUMNS, **ENV_COLUMNS}, ("key",))
COLUMNS = RUNS.columns

# ------------------------------------------------------------------ training runs: train_runs, train_curves
# Fields of harness.train.TrainConfig, in order; undeclared, so SQLite keeps each value's Python type.
TRAIN_CONFIG_COLUMNS = (
    "method", "dataset", "d_s", "d_e", "b", "d_k0", "d_k_max", "p", "grow_every", "steps", "n_heads", "head_split",
    "trigger", "threshold", "scale_policy", "opt_state", "lr", "seed", "eval_every", "stats_batches", "device", "dtype",
)
SUMMARY_COLUMNS = {
    "final_heldout": "REAL", "best_heldout": "REAL", "final_train": "REAL", "wall_s": "REAL",
    "growth_wall_s": "REAL", "train_flops": "REAL", "growth_flops": "REAL", "total_flops": "REAL",
    "n_growths": "INTEGER", "final_d_k": "TEXT", "n_params": "INTEGER", "events": "TEXT", "checks": "TEXT",
}
TRAIN_RUNS = Table("train_runs", {**_RUN_STATUS, **dict.fromkeys(TRAIN_CONFIG_COLUMNS, ""), **SUMMARY_COLUMNS,
                                  **dict.fromkeys(ENV_COLUMNS, "")}, ("key",))
# One point of a run's curve; d_k is the JSON list of every head's width.
TRAIN_CURVES = Table("train_curves", {"key": "TEXT NOT NULL", "step": "INTEGER NOT NULL", "wall_s": "REAL",
                                      "flops": "REAL", "train_loss": "REAL", "heldout_loss": "REAL", "d_k": "TEXT"},
                     ("key", "step"), order_by=("key", "step"), bare_names=True)

TABLES = {table.name: table for table in (RUNS, TRAIN_RUNS, TRAIN_CURVES)}
