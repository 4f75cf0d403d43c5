"""Hostile results files (issue 12, item 2): growbench's mark, foreign files left untouched, filesystem errors.

Every refusal must be one line on stderr that names the path, exit status 2, and must
leave the file's bytes as they were; a writing command must refuse before it measures
anything (no model cache appears). The run key is the PRIMARY KEY: a rerun replaces
rows, never duplicates them. Read-only files and folders are made with ``chmod``, or
with ``chattr +i`` when the tests run as root (root ignores permission bits).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from growbench import strategies
from growbench.harness.cli import main as cli_main
from growbench.harness.measure import RunConfig
from growbench.harness.recommend import first_error, recommend
from growbench.harness.store.dbfile import APPLICATION_ID, SCHEMA_VERSION, DatabaseFileError
from growbench.harness.store.results import ResultsDB
from growbench.harness.store.schema import COLUMNS, CONFIG_COLUMNS, TABLES, TRAIN_CONFIG_COLUMNS
from growbench.harness.store.training import TrainDB, load
from growbench.harness.train import TrainConfig

# The smallest run the CLI accepts that still measures a real growth (about 3 s on 2 cores).
TINY = ["--strategies", "formula2", "--datasets", "teacher", "--d-s", "8", "--d-e", "8", "--b", "4", "--d-k", "2",
        "--p", "2", "--warmup-steps", "2", "--repeats", "1", "--n-batches", "1", "--no-progress"]


def digest(path: Path) -> str:
    """The bytes of a file, or the names and bytes under a folder, as one hash."""
    h = hashlib.sha256()
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            h.update(str(p.relative_to(path)).encode())
            if p.is_file():
                h.update(p.read_bytes())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def one_line_naming(capsys: pytest.CaptureFixture, path: Path | str) -> str:
    """stderr of the last command: exactly one line, which names ``path``; returned for further checks."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(path) in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make a file or folder read-only for the duration (``chattr +i`` as root, else ``chmod``)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root without chattr +i: cannot make a path read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def sql(path: Path, *statements: str) -> Path:
    """Run ``statements`` on ``path`` with plain sqlite3 (the way another program would write it)."""
    conn = sqlite3.connect(path)
    try:
        for s in statements:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()
    return path


def growbench_db(path: Path) -> Path:
    """A genuine growbench database with one stored (failed) run."""
    with ResultsDB(path) as db:
        db.write(dict(key="k0", status="failed", error="ValueError: stored", strategy="default", dataset="teacher"))
    return path


# ------------------------------------------------------------------ foreign and newer files
def _foreign_runs(p: Path) -> Path:  # an unrelated table that happens to be named runs
    return sql(p, "CREATE TABLE runs (id INTEGER, name TEXT)", "INSERT INTO runs VALUES (1, 'a')")


def _compatible_runs(p: Path) -> Path:  # growbench's column names, but no PRIMARY KEY: not growbench's
    return sql(p, "CREATE TABLE runs (key TEXT, status TEXT, error TEXT, strategy TEXT, dataset TEXT)",
               "INSERT INTO runs VALUES ('k', 'failed', NULL, 'default', 'teacher')")


def _extra_column_runs(p: Path) -> Path:  # keyed like growbench's, but with a column growbench never wrote
    return sql(p, "CREATE TABLE runs (key TEXT PRIMARY KEY, status TEXT NOT NULL, salary REAL)",
               "INSERT INTO runs VALUES ('k', 'ok', 1.5)")


def _unrelated(p: Path) -> Path:
    return sql(p, "CREATE TABLE people (name TEXT)", "INSERT INTO people VALUES ('ada')")


def _other_application(p: Path) -> Path:  # growbench-shaped, but another program's mark
    return sql(p, "PRAGMA application_id = 42", "CREATE TABLE runs (key TEXT PRIMARY KEY, status TEXT NOT NULL)")


def _unmarked_with_user_version(p: Path) -> Path:
    return sql(p, "PRAGMA user_version = 3", "CREATE TABLE runs (key TEXT PRIMARY KEY, status TEXT NOT NULL)")


def _newer(p: Path) -> Path:  # growbench's own mark, from a schema this code does not know
    return sql(growbench_db(p), f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


def _text(p: Path) -> Path:
    p.write_text("key,status\nk,ok\n")
    return p


def _garbage(p: Path) -> Path:
    p.write_bytes(bytes(range(256)) * 16)
    return p


def _directory(p: Path) -> Path:
    p.mkdir()
    (p / "inside.txt").write_text("keep me")
    return p


HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "foreign-runs-table": (_foreign_runs, "not a growbench database"),
    "compatible-looking-runs-table": (_compatible_runs, "not a growbench database"),
    "runs-with-unknown-columns": (_extra_column_runs, "salary"),
    "unrelated-sqlite": (_unrelated, "not a growbench database"),
    "other-application-id": (_other_application, "application_id"),
    "unmarked-user-version": (_unmarked_with_user_version, "user_version"),
    "newer-schema": (_newer, "newer growbench"),
    "text-file": (_text, "not an SQLite database"),
    "garbage-file": (_garbage, "not an SQLite database"),
    "directory": (_directory, "is a directory"),
}
COMMANDS = {
    "run": lambda db, tmp: ["run", *TINY, "--db", str(db), "--cache-dir", str(tmp / "cache")],
    "train": lambda db, tmp: ["train", "--preset", "smoke", "--no-progress", "--db", str(db)],
    "export": lambda db, tmp: ["export", "--db", str(db), "--out", str(tmp / "out.csv")],
    "report": lambda db, tmp: ["report", "--db", str(db), "--out", str(tmp / "report")],
    "recommend": lambda db, tmp: ["recommend", "--db", str(db)],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_file_is_refused_in_one_line_and_left_untouched(tmp_path, capsys, kind, command):
    make, problem = HOSTILE[kind]
    db = make(tmp_path / "results.sqlite")
    before = digest(db)
    assert cli_main(COMMANDS[command](db, tmp_path)) == 2
    line = one_line_naming(capsys, db)
    assert problem in line, line
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]  # no cache, output or side file


def test_refusal_comes_before_any_output_even_from_the_library(tmp_path):
    db = _compatible_runs(tmp_path / "c.sqlite")
    before = digest(db)
    for open_db in (ResultsDB, TrainDB):
        with pytest.raises(DatabaseFileError, match="not a growbench database"):
            open_db(db)
    assert digest(db) == before


# ------------------------------------------------------------------ the mark, the key, older files
def test_new_database_is_marked_and_keyed_and_a_rerun_does_not_duplicate(tmp_path, capsys):
    db, cache = tmp_path / "r.sqlite", tmp_path / "cache"
    for _ in range(2):  # the same sweep twice, without --resume: the second replaces the first's row
        assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        pk = [r[1] for r in conn.execute("PRAGMA table_info(runs)") if r[5]]
        n, n_keys = conn.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM runs").fetchone()
        assert pk == ["key"] and n == n_keys == 1
        with pytest.raises(sqlite3.IntegrityError):  # the database itself refuses a duplicate key
            conn.execute("INSERT INTO runs (key, status) SELECT key, status FROM runs")


def test_training_tables_are_marked_and_keyed(tmp_path):
    db = tmp_path / "t.sqlite"
    TrainDB(db).close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert [r[1] for r in conn.execute("PRAGMA table_info(train_runs)") if r[5]] == ["key"]
    with ResultsDB(db) as r:  # both kinds of table share one file
        r.write(dict(key="a", status="ok"))
        r.write(dict(key="a", status="failed", error="E"))
        assert r.frame()[["key", "status"]].values.tolist() == [["a", "failed"]]


def test_new_files_get_the_statements_growbench_always_wrote(tmp_path):
    db = tmp_path / "t.sqlite"
    TrainDB(db).close()
    ResultsDB(db).close()
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
    assert stored["train_curves"] == ("CREATE TABLE train_curves (key TEXT NOT NULL, step INTEGER NOT NULL, "
                                      "wall_s REAL, flops REAL, train_loss REAL, heldout_loss REAL, d_k TEXT, "
                                      "PRIMARY KEY (key, step))")
    assert stored["train_runs"].startswith('CREATE TABLE train_runs ("key" TEXT PRIMARY KEY, "status" TEXT NOT NULL, '
                                           '"error" TEXT, "method", "dataset", "d_s",')
    assert stored["runs"].startswith('CREATE TABLE runs ("key" TEXT PRIMARY KEY, "status" TEXT NOT NULL, '
                                     '"error" TEXT, "strategy" TEXT, "dataset" TEXT, "d_s" INTEGER,')


def test_schema_holds_every_configuration_field_in_order():
    # The schema is written out (readable without torch); it must follow the configurations it stores.
    assert list(CONFIG_COLUMNS) == [f.name for f in dataclasses.fields(RunConfig)]
    assert list(TRAIN_CONFIG_COLUMNS) == [f.name for f in dataclasses.fields(TrainConfig)]


def test_training_loader_reads_empty_frames_where_there_is_no_training(tmp_path):
    assert [f.empty for f in load(tmp_path / "missing.sqlite")] == [True, True]
    db = growbench_db(tmp_path / "growth_only.sqlite")
    runs, curves = load(db)
    assert runs.empty and curves.empty and runs.columns.empty


def test_older_unmarked_growbench_database_is_read_as_is_then_marked_on_write(tmp_path, capsys):
    # What growbench wrote before the mark: key PRIMARY KEY, a subset of today's columns, no application id.
    old_cols = ["key", "status", "error", "strategy", "dataset", "optimality", "t_total"]
    db = sql(tmp_path / "old.sqlite",
             f"CREATE TABLE runs ({', '.join(f'{c} {COLUMNS[c]}' for c in old_cols)})",
             "INSERT INTO runs (key, status, strategy, dataset) VALUES ('old', 'ok', 'default', 'teacher')",
             "CREATE TABLE train_runs (key TEXT PRIMARY KEY, status TEXT NOT NULL, error TEXT, method, dataset)",
             "CREATE TABLE train_curves (key TEXT NOT NULL, step INTEGER NOT NULL, wall_s REAL, flops REAL, "
             "train_loss REAL, heldout_loss REAL, d_k TEXT, PRIMARY KEY (key, step))")
    before = digest(db)
    assert cli_main(["export", "--db", str(db), "--out", str(tmp_path / "x.csv")]) == 0  # reading never marks
    assert digest(db) == before and pd.read_csv(tmp_path / "x.csv").key.tolist() == ["old"]
    capsys.readouterr()

    with ResultsDB(db) as r:
        r.write(dict(key="new", status="ok"))
        frame = r.frame()
    TrainDB(db).close()
    assert sorted(frame.key) == ["new", "old"] and set(COLUMNS) <= set(frame.columns)
    assert set(TABLES["train_runs"].columns) <= set(load(db)[0].columns)  # the training tables are upgraded too
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_empty_sqlite_file_is_adopted(tmp_path):
    db = tmp_path / "e.sqlite"
    db.touch()  # SQLite's own view: an empty file is an empty database
    with ResultsDB(db) as r:
        r.write(dict(key="a", status="ok"))
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


@pytest.mark.parametrize("attempt", range(20))
def test_concurrent_first_opens_of_one_new_file_all_succeed(tmp_path, attempt):
    """8 writers create one file at once. Without waiting out the switch to WAL mode
    (``dbfile._use_wal``), about one attempt in six lost a writer to "database is locked"."""
    db, errors = tmp_path / "new.sqlite", []

    def open_and_write(i: int) -> None:
        try:
            with ResultsDB(db) as r:
                r.write(dict(key=f"k{i}", status="ok"))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with ResultsDB(db) as r:
        assert sorted(r.frame().key) == [f"k{i}" for i in range(8)]


# ------------------------------------------------------------------ filesystem errors
def test_read_only_database_is_refused_before_any_measurement(tmp_path, capsys):
    db, cache = growbench_db(tmp_path / "r.sqlite"), tmp_path / "cache"
    before = digest(db)
    with read_only(db):
        assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(cache)]) == 2
        assert "read-only" in one_line_naming(capsys, db)
        assert cli_main(["train", "--preset", "smoke", "--no-progress", "--db", str(db)]) == 2
        assert "read-only" in one_line_naming(capsys, db)
        assert cli_main(["export", "--db", str(db), "--out", str(tmp_path / "x.csv")]) == 0  # reading still works
    assert not cache.exists() and digest(db) == before


def test_database_in_a_read_only_folder_is_refused(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    db = growbench_db(folder / "r.sqlite")
    before = digest(folder)
    with read_only(folder):
        for target in (db, folder / "new.sqlite"):  # an existing database, and one to create there
            assert cli_main(["run", *TINY, "--db", str(target), "--cache-dir", str(tmp_path / "cache")]) == 2
            assert "not writable" in one_line_naming(capsys, target)
        assert cli_main(["recommend", "--db", str(db)]) == 2  # readable: refused for its content only
        assert "all 1 runs failed (first error: ValueError: stored)" in one_line_naming(capsys, db)
        assert cli_main(["export", "--db", str(db), "--out", str(folder / "x.csv")]) == 2
        one_line_naming(capsys, folder / "x.csv")
        assert cli_main(["report", "--db", str(db), "--out", str(folder / "rep")]) == 2
        one_line_naming(capsys, folder / "rep")
    assert digest(folder) == before and not (tmp_path / "cache").exists()


def test_database_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    db = tmp_path / "afile" / "r.sqlite"
    assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(tmp_path / "cache")]) == 2
    one_line_naming(capsys, db)


def test_export_and_report_output_paths(tmp_path, capsys):
    db = growbench_db(tmp_path / "r.sqlite")
    missing = tmp_path / "missing" / "dir" / "x.csv"
    assert cli_main(["export", "--db", str(db), "--out", str(missing)]) == 2
    assert "does not exist" in one_line_naming(capsys, missing)
    assert cli_main(["export", "--db", str(db), "--out", str(tmp_path)]) == 2  # a folder, not a file
    assert "is a directory" in one_line_naming(capsys, tmp_path)

    existing = tmp_path / "report.txt"
    existing.write_text("keep")
    assert cli_main(["report", "--db", str(db), "--out", str(existing)]) == 2
    assert "not a folder" in one_line_naming(capsys, existing)
    assert cli_main(["report", "--db", str(db), "--out", str(existing / "sub")]) == 2
    one_line_naming(capsys, existing / "sub")
    assert existing.read_text() == "keep" and not missing.parent.exists()


# ------------------------------------------------------------------ the first error of failed runs
def test_all_failed_message_shows_the_stored_error(tmp_path, capsys):
    db = tmp_path / "f.sqlite"
    with ResultsDB(db) as r:  # an empty error and a traceback starting with a blank line come first
        r.write(dict(key="a", status="failed", error="", strategy="default", dataset="teacher"))
        r.write(dict(key="b", status="failed", error="\nValueError: the real cause\n  more", strategy="default",
                     dataset="teacher"))
    for command in (["recommend"], ["report", "--out", str(tmp_path / "rep")]):
        assert cli_main([*command, "--db", str(db)]) == 2
        line = one_line_naming(capsys, db)
        assert "all 2 runs failed (first error: ValueError: the real cause)" in line, line
        assert "no error" not in line


def test_first_error_skips_empty_entries():
    assert first_error(pd.Series([None, "", "  \n", "\nKeyError: x\nline 2"])) == "KeyError: x"
    assert first_error(pd.Series([None, float("nan")])) == "no error message stored with the failed runs"


def test_runner_up_reason_shows_the_stored_error():
    good, flaky = strategies.presets()["default"], strategies.presets()["formula1"]
    cell = dict(dataset="teacher", device="cpu", d_s=8, d_e=8, b=4, d_k=2, p=2, n_batches=1, repeats=1,
                warmup_steps=2, dtype="float32", scale_policy="rescale")
    rows = [dict(cell, key=f"{s}{i}", strategy=s, seed=i, status="ok", error=None, t_total=1e-3, t_floor=1e-4,
                 optimality=0.9, heldout_decrease=0.1) for s in (good, flaky) for i in range(2)]
    rows += [dict(cell, key="x", strategy=flaky, seed=5, status="failed", error=""),
             dict(cell, key="y", strategy=flaky, seed=6, status="failed", error="RuntimeError: boom")]
    rec = recommend(pd.DataFrame(rows).reindex(columns=list(COLUMNS)))
    (reason,) = rec.table.loc[rec.table.strategy == flaky, "reason"]
    assert "failed 2 of 4 runs (first: RuntimeError: boom)" in reason
