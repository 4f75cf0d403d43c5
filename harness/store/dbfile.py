"""Opening growbench's SQLite results files safely: check first, write only to our own files.

A results file is growbench's when its header carries :data:`APPLICATION_ID`
(``PRAGMA application_id``); ``PRAGMA user_version`` is its schema version,
:data:`SCHEMA_VERSION` for files this code writes. Both are set in the transaction
that creates the tables, so no file exists with tables but without the mark.

Files written by growbench before the mark existed (application id 0, user version 0)
are accepted when they look exactly like what that code wrote: only the tables
``runs``, ``train_runs`` and ``train_curves``; each keyed by its PRIMARY KEY (every
growbench version declared ``key`` so, and ``(key, step)`` for curves); a ``status``
column in the two run tables; and no column growbench never wrote. Such a file is
marked (and gains the columns added since) the first time a writing command opens
it; reading commands leave it as it is. Anything else is foreign and is refused
before it is touched: a file of another application, an unrelated SQLite file, a
table named ``runs`` of another shape, text, a directory. A newer schema version is
refused too, since this code cannot know what it means.

A growbench file, marked or not, holds exactly growbench's schema: its tables (with
the indexes SQLite makes for their keys) and nothing else. A trigger could rewrite or
delete results as they are stored, and a view, a virtual table or an index on an
expression could fail or change a write, so a file holding any of them is refused, as
foreign, before anything is written. A file whose pages are damaged (``PRAGMA
quick_check``) is refused by every command, reading or writing, in the same words.

Every refusal and every filesystem failure is a :class:`DatabaseFileError`, a
``ValueError`` whose message is one line that starts with the path, which the command
line prints and turns into exit status 2.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from growbench.harness.store.schema import TABLES

APPLICATION_ID = 0x47726F77  # "Grow"; a signed 32-bit value, as SQLite stores it
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
# Seconds a connection waits for another writer's lock (concurrent sweeps on one file).
TIMEOUT_S = 30.0
# How SQLite stores a virtual table's statement (an fts5 table named runs is not growbench's runs).
_VIRTUAL = re.compile(r"\s*CREATE\s+VIRTUAL\s", re.IGNORECASE)
# SQLite's answers for a file whose pages are not a database's (the primary code, without extended bits).
_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class DatabaseFileError(ValueError):
    """A results file growbench refuses to use or cannot use; the message names the file."""


def _short(names: list[str], n: int = 5) -> str:
    """``a, b, c`` with at most ``n`` names, so that a refusal stays one readable line."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _not_growbench(objects: list[tuple[str, str, str | None]]) -> list[str]:
    """What a schema's ``(type, name, sql)`` rows hold besides growbench's own tables: triggers, views, indexes,
    other tables, virtual tables (even one named like growbench's), as ``"trigger 'name'"``."""
    others = []
    for kind, name, text in objects:
        if _VIRTUAL.match(text or ""):
            others.append(f"virtual table {name!r}")
        elif not (kind == "table" and name in TABLES):
            others.append(f"{kind} {name!r}")
    return others


def _table_info(conn: sqlite3.Connection, table: str) -> tuple[list[str], tuple[str, ...]]:
    """``(column names, primary key columns in key order)`` of ``table``."""
    info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    pk = tuple(r[1] for r in sorted((r for r in info if r[5] > 0), key=lambda r: r[5]))
    return [r[1] for r in info], pk


def classify(conn: sqlite3.Connection, path: Path) -> str:
    """``"current"``, ``"legacy"`` (unmarked, made by older growbench) or ``"empty"``; raise for anything else.

    Only reads: it never changes the file.

    Raises
    ------
    DatabaseFileError
        The file is foreign (another application's, tables growbench did not make, or, even under
        growbench's mark, anything beside its tables: a trigger, a view, an index, a virtual table)
        or of a newer schema version.
    """
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    # SQLite's own objects (sqlite_*: the indexes of the keys, statistics) are not counted.
    objects = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
                           ).fetchall()
    tables = [name for kind, name, _ in objects if kind == "table"]
    others = _not_growbench(objects)
    if app == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise DatabaseFileError(f"{path}: written by a newer growbench (schema version {version}; this one "
                                    f"knows up to {SCHEMA_VERSION}); upgrade growbench or use another --db")
        if others:
            # The mark is two numbers anyone can set: what the file holds decides.
            raise DatabaseFileError(f"{path}: marked as growbench's but not growbench's schema (it holds "
                                    f"{_short(others)}, which growbench never makes and which could change "
                                    f"results as they are stored); refusing to touch it")
        for table in tables:
            if table in TABLES and _table_info(conn, table)[1] != TABLES[table].primary_key:
                raise DatabaseFileError(f"{path}: damaged growbench database: table {table!r} lacks its "
                                        f"PRIMARY KEY ({', '.join(TABLES[table].primary_key)})")
        return "current"
    foreign = f"{path}: not a growbench database"
    if app != 0:
        raise DatabaseFileError(f"{foreign} (SQLite application_id {app:#x}); refusing to touch it")
    if version != 0:
        raise DatabaseFileError(f"{foreign} (user_version {version} without growbench's mark); refusing to touch it")
    if not objects:
        return "empty"
    if others:
        raise DatabaseFileError(f"{foreign} (it holds {_short(others)}); refusing to touch it")
    for table in tables:
        cols, pk = _table_info(conn, table)
        if pk != TABLES[table].primary_key:
            raise DatabaseFileError(f"{foreign}: its table {table!r} lacks growbench's PRIMARY KEY "
                                    f"({', '.join(TABLES[table].primary_key)}); refusing to touch it")
        if "status" in TABLES[table].columns and "status" not in cols:
            raise DatabaseFileError(f"{foreign}: its table {table!r} has no status column; refusing to touch it")
        unknown = [c for c in cols if c not in TABLES[table].columns]  # columns are only ever added
        if unknown:
            raise DatabaseFileError(f"{foreign}: its table {table!r} has columns growbench never wrote "
                                    f"({_short(unknown)}); refusing to touch it")
    return "legacy"


def check_file(path: Path) -> None:
    """Refuse a path that cannot be an SQLite file: a directory, a device, text or other bytes.

    A missing or empty file passes (SQLite treats an empty file as an empty database).
    """
    if path.is_dir():
        raise DatabaseFileError(f"{path}: is a directory, not a database file")
    if not path.exists():
        return
    if not path.is_file():
        raise DatabaseFileError(f"{path}: is not a regular file")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise DatabaseFileError(f"{path}: cannot read the file: {e.strerror or e}") from e
    if head and head != SQLITE_MAGIC:
        raise DatabaseFileError(f"{path}: not an SQLite database (no SQLite header: a text or other file); "
                                f"refusing to touch it")


def _check_writable(path: Path) -> None:
    """Create the file's folder if missing; refuse a read-only file or folder (SQLite journals next to the file)."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseFileError(f"{path}: cannot create its folder {folder}: {e.strerror or e}") from e
    if path.exists() and not os.access(path, os.W_OK):
        raise DatabaseFileError(f"{path}: the database file is read-only")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DatabaseFileError(f"{path}: its folder {folder} is not writable (SQLite writes its journal and "
                                f"WAL files next to the database)")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection for reading: read-only if SQLite can, else plain, else immutable.

    SQLite refuses a read-only open of a WAL database whose ``-shm`` file is missing and
    cannot be created; a plain connection that only reads changes nothing either. In a
    read-only folder neither can open such a file, and no writer can be at work there, so
    the file is read as immutable (no locks, no side files).
    """
    uri = path.resolve().as_uri()
    error: sqlite3.OperationalError | None = None
    for target, uri_mode in ((uri + "?mode=ro", True), (path, False), (uri + "?immutable=1", True)):
        conn = sqlite3.connect(target, uri=uri_mode, timeout=TIMEOUT_S)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError as e:
            conn.close()
            error = e
    raise error


def _inspect(path: Path) -> str:
    """:func:`classify` an existing file without leaving anything behind.

    A read-only connection to a WAL file leaves ``-wal`` and ``-shm`` files next to it,
    clutter by a foreign file. With neither a ``-wal`` nor a ``-journal`` file present
    the main file holds the whole database and no writer is at work, so it is read as
    immutable: no locks, no side files. Otherwise the ordinary reading connection is used.
    """
    quiet = not any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))
    try:
        if quiet:
            conn = sqlite3.connect(path.resolve().as_uri() + "?immutable=1", uri=True)
        else:
            conn = _connect_read_only(path)
        try:
            kind = classify(conn, path)
            _check_intact(conn, path)
            return kind
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        if getattr(e, "sqlite_errorcode", 0) & 0xFF in _DAMAGED:
            raise _damaged(path, str(e)) from e
        raise


def _check_intact(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file whose pages SQLite finds damaged (``PRAGMA quick_check``: every page, not the indexes' content).

    Every command inspects the file this way before it reads or writes (:func:`_inspect`), so a
    damaged file is refused in the same words by all of them, and before a sweep measures a run
    whose row could not be stored.
    """
    problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise _damaged(path, problems[0] if problems else "no answer")


def _damaged(path: Path, problem: str) -> DatabaseFileError:
    """The one refusal of a damaged file, with SQLite's first finding on one line."""
    detail = " ".join(str(problem).split())[:200]
    return DatabaseFileError(f"{path}: damaged database file (SQLite: {detail}); refusing to use it: restore it "
                             f"from a copy, or salvage its rows with the sqlite3 shell's .recover into a new file")


def connect_read(path: str | Path) -> sqlite3.Connection:
    """Open an existing results file for reading after checking that it is growbench's.

    Raises
    ------
    DatabaseFileError
        Missing, a directory, not SQLite, foreign, a newer schema, or unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise DatabaseFileError(f"{path}: no such database file")
    check_file(path)
    try:
        _inspect(path)
        return _connect_read_only(path)
    except sqlite3.DatabaseError as e:
        raise DatabaseFileError(f"{path}: not a readable SQLite database ({e})") from e


def connect_write(path: str | Path, create: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """Open (or create) a results file for writing, before any work: check, create ``create``'s tables, mark.

    The file is inspected read-only first, so that a foreign file is refused without a
    write lock; then, under the write lock (a concurrent sweep may have created it in
    between), it is inspected again, ``create(conn)`` makes or upgrades this caller's
    tables, and the mark and schema version are set, all in one transaction. Setting
    the version is a write, which proves the file writable before any measurement.

    Parameters
    ----------
    path : str or Path
        The SQLite file; it and its folder are created if missing.
    create : callable
        ``create(conn)`` runs ``CREATE TABLE IF NOT EXISTS`` and ``ALTER TABLE ... ADD COLUMN``
        for the caller's tables, inside the transaction.

    Returns
    -------
    sqlite3.Connection
        In WAL mode, no transaction open.

    Raises
    ------
    DatabaseFileError
        As :func:`connect_read`, plus a read-only file or folder, or any SQLite failure to write.
    """
    path = Path(path)
    check_file(path)
    if path.is_file() and path.stat().st_size:
        with contextlib.suppress(sqlite3.DatabaseError):  # e.g. locked: the check under the write lock decides
            _inspect(path)
    _check_writable(path)
    conn = None
    try:
        conn = sqlite3.connect(path, timeout=TIMEOUT_S)
        conn.execute("BEGIN IMMEDIATE")
        classify(conn, path)
        create(conn)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.commit()
        _use_wal(conn)  # not allowed inside a transaction; the file is ours now
        return conn
    except DatabaseFileError:
        conn.rollback()
        conn.close()
        raise
    except sqlite3.Error as e:
        if conn is not None:
            conn.close()
        raise DatabaseFileError(f"{path}: cannot write the database: {e}") from e


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL mode, waiting up to :data:`TIMEOUT_S` for the other connections.

    The switch needs the file to itself for a moment, and SQLite answers "database is
    locked" at once, without its busy handler, while another connection is in a
    transaction: 8 threads creating one new file together left 27 failed opens in 150
    tries. WAL mode is stored in the file, so once any connection has switched, the
    others' switch is a no-op.
    """
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def check_output_dir(path: str | Path) -> None:
    """Refuse an output folder path that is a file, or whose nearest existing ancestor is not a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DatabaseFileError(f"{path}: exists and is not a folder; give a folder for the output")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DatabaseFileError(f"{path}: cannot be created: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DatabaseFileError(f"{path}: {existing} is not writable")
