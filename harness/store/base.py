"""What every store of runs does: open a results file for writing, keep one row per run key, read it back.

:class:`RunStore` checks and marks the file before anything else
(:func:`harness.store.dbfile.connect_write`): a foreign, newer, read-only or unusable
file raises :class:`~harness.store.dbfile.DatabaseFileError` at once, before any run,
and is left as it was. It then creates its tables, or gives a checked older file the
columns added since. The run key is the table's PRIMARY KEY, so a rerun replaces its
row and never duplicates it. Each run is committed as soon as it is written (WAL
journal), so a killed sweep loses at most the runs in flight, and resume skips every
key already stored.

:func:`read_tables` is the one read-only loader of these tables.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import ClassVar, Self

import pandas as pd

from growbench.harness.store.dbfile import DatabaseFileError, connect_read, connect_write
from growbench.harness.store.schema import Table


def _create_or_upgrade(conn: sqlite3.Connection, table: Table) -> None:
    """Create ``table``, or give a checked older one the columns added since (inside the opening transaction)."""
    conn.execute(table.create_sql)
    have = {r[1] for r in conn.execute(f"PRAGMA table_info({table.name})")}
    for column in table.columns:
        if column not in have:
            conn.execute(table.add_column_sql(column))


def _insert(conn: sqlite3.Connection, table: Table, row: dict) -> None:
    """Insert or replace ``row``'s values of ``table``'s columns; lists and dicts are stored as JSON."""
    values = {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items() if k in table.columns}
    names = ", ".join(f'"{k}"' for k in values)
    marks = ", ".join("?" for _ in values)
    # The key is the PRIMARY KEY: a rerun replaces its row, never duplicates it.
    conn.execute(f"INSERT OR REPLACE INTO {table.name} ({names}) VALUES ({marks})", tuple(values.values()))


class RunStore:
    """One kind of run in a results file at ``path`` (created with its folder if missing), opened for writing.

    A subclass names its :attr:`table` (one row per run key) and any :attr:`companions`
    created with it; it may extend :meth:`_write` to store more of a run in the same transaction.

    Raises
    ------
    DatabaseFileError
        On opening: the file is foreign, newer, read-only or unusable (nothing is changed).
    """

    table: ClassVar[Table]
    companions: ClassVar[tuple[Table, ...]] = ()
    # What one row is, for messages: "cannot write the <run_noun>".
    run_noun: ClassVar[str] = "run"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn = connect_write(self.path, self._create)

    @classmethod
    def _create(cls, conn: sqlite3.Connection) -> None:
        for table in (cls.table, *cls.companions):
            _create_or_upgrade(conn, table)

    def keys(self, status: str | None = None) -> set[str]:
        """Keys of the stored runs (of one status if given)."""
        if status is None:
            return {r[0] for r in self.conn.execute(f"SELECT key FROM {self.table.name}")}
        return {r[0] for r in self.conn.execute(f"SELECT key FROM {self.table.name} WHERE status = ?", (status,))}

    def write(self, row: dict) -> None:
        """Insert or replace one run and commit at once.

        Raises
        ------
        DatabaseFileError
            SQLite cannot write, e.g. the disk filled up or the file was made read-only mid-sweep.
        """
        try:
            with self.conn:  # one transaction: all of a run lands, or none of it
                self._write(row)
        except sqlite3.Error as e:
            raise DatabaseFileError(f"{self.path}: cannot write the {self.run_noun}: {e}") from e

    def _write(self, row: dict) -> None:
        """Store ``row`` inside :meth:`write`'s transaction."""
        _insert(self.conn, self.table, row)

    def frame(self) -> pd.DataFrame:
        """Every stored run as a DataFrame."""
        return self._read(self.table)

    def _read(self, table: Table) -> pd.DataFrame:
        return pd.read_sql_query(table.select_sql, self.conn)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_tables(path: str | Path, *tables: Table, numbers: bool = False) -> tuple[pd.DataFrame, ...]:
    """Every row of each of ``tables`` in an existing results file, read only, through one connection.

    The file is checked first and never changed. A table the file lacks reads as an empty
    frame without columns (e.g. a file of training runs only has no ``runs``).

    Parameters
    ----------
    path : str or Path
    *tables : Table
    numbers : bool
        Refuse a file whose numeric columns hold anything but numbers (:func:`check_numbers`):
        what a reader that computes with them needs. Off, the rows are read as stored (an export).

    Raises
    ------
    DatabaseFileError
        Missing, foreign, a newer schema, damaged, or not SQLite; with ``numbers``, text in a
        numeric column; the message names the file.
    sqlite3.DatabaseError, pandas.errors.DatabaseError
        A table cannot be read; callers decide what that means for them.
    """
    conn = connect_read(path)
    try:
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        frames = tuple(pd.read_sql_query(t.select_sql, conn) if t.name in present else pd.DataFrame() for t in tables)
    finally:
        conn.close()
    if numbers:
        for table, frame in zip(tables, frames, strict=True):
            check_numbers(frame, table, path)
    return frames


def check_numbers(frame: pd.DataFrame, table: Table, path: str | Path) -> None:
    """Refuse ``frame`` (rows of ``table``) when a column declared numeric holds text or bytes.

    SQLite keeps whatever a program stores, but growbench stores only numbers or NULL there:
    anything else was put there by another hand, and a median or a comparison of it would fail
    or mislead.

    Raises
    ------
    DatabaseFileError
        One line naming the file, the table, the column and the first offending run.
    """
    for column in table.numeric_columns:
        if column not in frame.columns or frame[column].dtype != object:
            continue  # pandas gives a numeric dtype to a column of numbers and NULLs only
        values = frame[column]
        bad = values.map(lambda v: v is not None and not isinstance(v, int | float))
        if bad.any():
            first = bad.to_numpy().nonzero()[0][0]
            key = frame["key"].iloc[first] if "key" in frame.columns else first
            raise DatabaseFileError(f"{path}: damaged growbench database: column {column!r} of table {table.name} "
                                    f"holds {type(values.iloc[first]).__name__} where growbench stores numbers "
                                    f"(run {key!r}: {values.iloc[first]!r:.60}); refusing to compute with it")
