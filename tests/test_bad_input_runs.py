"""Hostile input, round two (issue 29): databases, option ranges, plugins and caches.

Each case of the issue becomes a test of the property it broke: a hostile or damaged
results file is refused by every command in one line (exit 2), its bytes untouched and
nothing created beside it; an integer the database cannot store is refused before the
database exists; a plugin cannot end growbench with status 0; a cache file is used only
when its key, checksum and content hold, its writes never leave a temporary file or
follow a symlink, a failed write costs time and not the run, and its files are the user's.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import anisotropic_X, causal, random_G
from helpers import GROWBENCH, ROOT
from test_cache_integrity import patch_bytes, tensor_offset
from test_db_schema import COMMANDS, TINY, digest, growbench_db, one_line_naming, sql

import growbench.datasets.registry as datasets
import growbench.harness.measure as measure
from growbench.datasets.cache import CacheWarning
from growbench.datasets.cache import digest as record_digest
from growbench.harness.cli import main as cli_main
from growbench.harness.reference import load_reference, reference_key, reference_path
from growbench.harness.store.dbfile import APPLICATION_ID, SCHEMA_VERSION, DatabaseFileError
from growbench.harness.store.results import ResultsDB, read_runs
from growbench.harness.store.training import TrainDB, load
from growbench.harness.validate import (
    COST_LIMITS,
    MAX_TRAIN_SEED,
    SQLITE_INT_MAX,
    WARMUP_NOTE_STEPS,
    ConfigError,
    check_int,
    warmup_seconds,
)
from growbench.strategies import metrics


def refused_untouched(capsys, tmp_path: Path, db: Path, argv: list[str], ours: bool = False) -> str:
    """Run the CLI in-process: exit 2, one stderr line naming ``db`` and no traceback, ``db``'s bytes unchanged,
    nothing else created in ``tmp_path`` (no cache, output or side file); the line is returned.

    ``ours``: ``db`` is a sound growbench file refused for its content, which is read by SQLite's ordinary
    read-only connection (its ``-wal`` and ``-shm`` files may appear beside it).
    """
    before = digest(db)
    assert cli_main(argv) == 2
    line = one_line_naming(capsys, db)
    assert "Traceback" not in line
    assert digest(db) == before
    allowed = {db.name, f"{db.name}-wal", f"{db.name}-shm"} if ours else {db.name}
    assert {p.name for p in tmp_path.iterdir()} <= allowed and db.exists()
    return line


def exits_2_in_one_line(capsys, argv: list[str], option: str) -> str:
    """Run the CLI in-process (argparse's refusals exit, ours return): exit 2, one stderr line naming ``option``."""
    with pytest.raises(SystemExit) as info:
        raise SystemExit(cli_main(argv))
    assert info.value.code == 2, argv
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert option in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ a marked file that is not growbench's schema
def _trigger_rewrites(p: Path) -> Path:  # stored optimality 0.999 for whatever was measured
    return sql(growbench_db(p), "CREATE TRIGGER boost AFTER INSERT ON runs BEGIN "
                                "UPDATE runs SET optimality = 0.999 WHERE key = NEW.key; END")


def _trigger_deletes(p: Path) -> Path:  # 36 runs -> 1: every insert deletes the others
    return sql(growbench_db(p), "CREATE TRIGGER keep_one AFTER INSERT ON runs BEGIN "
                                "DELETE FROM runs WHERE key <> NEW.key; END")


def _view(p: Path) -> Path:
    return sql(growbench_db(p), "CREATE VIEW best AS SELECT * FROM runs WHERE optimality > 0.9")


def _index_on_expression(p: Path) -> Path:  # an expression that fails makes every insert fail
    return sql(growbench_db(p), "CREATE INDEX fragile ON runs (json_extract(extra, '$.x'))")


def _extra_table(p: Path) -> Path:
    return sql(growbench_db(p), "CREATE TABLE notes (text TEXT)")


def _fts(p: Path) -> Path:
    try:
        return sql(growbench_db(p), "CREATE VIRTUAL TABLE search USING fts5(strategy, error)")
    except sqlite3.OperationalError as e:  # an SQLite built without fts5
        pytest.skip(f"no fts5 in this SQLite: {e}")


def _fts_named_runs(p: Path) -> Path:  # a virtual table in the place of growbench's own table, with the mark
    try:
        sql(p, "CREATE VIRTUAL TABLE runs USING fts5(key, status)")
    except sqlite3.OperationalError as e:
        pytest.skip(f"no fts5 in this SQLite: {e}")
    return sql(p, f"PRAGMA application_id = {APPLICATION_ID}", f"PRAGMA user_version = {SCHEMA_VERSION}")


NOT_OURS = {"trigger-rewrites": _trigger_rewrites, "trigger-deletes": _trigger_deletes, "view": _view,
            "index-on-expression": _index_on_expression, "extra-table": _extra_table, "fts-table": _fts,
            "fts-named-runs": _fts_named_runs}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(NOT_OURS))
def test_marked_file_holding_more_than_growbench_schema_is_refused_untouched(tmp_path, capsys, kind, command):
    db = NOT_OURS[kind](tmp_path / "results.sqlite")
    with contextlib.closing(sqlite3.connect(db)) as conn:  # the mark is there: the refusal is for what it holds
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    refused_untouched(capsys, tmp_path, db, COMMANDS[command](db, tmp_path))


@pytest.mark.parametrize("kind", ["trigger-rewrites", "trigger-deletes"])
def test_triggers_are_refused_by_the_library_before_a_row_is_written(tmp_path, kind):
    db = NOT_OURS[kind](tmp_path / "results.sqlite")
    before = digest(db)
    for open_db in (ResultsDB, TrainDB):
        with pytest.raises(DatabaseFileError):
            open_db(db)
    with pytest.raises(DatabaseFileError):
        read_runs(db)
    assert digest(db) == before


# ------------------------------------------------------------------ damaged pages
def _damaged(path: Path) -> Path:
    """A genuine growbench file of 200 runs with one page in the middle of the runs table zeroed."""
    with ResultsDB(path) as db, db.conn:
        for i in range(200):
            db._write(dict(key=f"k{i}", status="ok", strategy="default", dataset="teacher", seed=i, optimality=0.75,
                           extra="x" * 500))
    sql(path, "PRAGMA journal_mode=DELETE")  # the whole database in the main file, as after a clean close
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 10 * page
    data[3 * page:4 * page] = bytes(page)
    path.write_bytes(bytes(data))
    return path


def test_damaged_page_is_refused_alike_by_every_command_untouched(tmp_path, capsys):
    lines = set()
    for command, argv in COMMANDS.items():
        db = _damaged(tmp_path / "results.sqlite")
        lines.add(refused_untouched(capsys, tmp_path, db, argv(db, tmp_path)))
        db.unlink()
    assert len(lines) == 1, lines  # one check, one refusal, whichever command met the file


# ------------------------------------------------------------------ text in numeric columns
def _text_in_runs(p: Path) -> Path:
    with ResultsDB(p) as db:
        for i in range(3):
            db.write(dict(key=f"k{i}", status="ok", strategy="default", dataset="teacher", seed=i, t_total=0.01,
                          optimality=0.75, heldout_decrease=0.1))
    return sql(p, "UPDATE runs SET heldout_decrease = 'lots' WHERE key = 'k1'")


@pytest.mark.parametrize("command", ["report", "recommend"])
def test_text_in_a_numeric_column_is_refused_naming_the_column(tmp_path, capsys, command):
    db = _text_in_runs(tmp_path / "results.sqlite")
    line = refused_untouched(capsys, tmp_path, db, COMMANDS[command](db, tmp_path), ours=True)
    assert "heldout_decrease" in line


def test_bytes_in_a_numeric_training_column_are_refused_by_the_training_loader(tmp_path):
    db = tmp_path / "results.sqlite"
    with TrainDB(db) as store:
        store.write(dict(key="t0", status="ok", method="default", dataset="teacher", seed=0, final_heldout=0.5,
                         curve=[dict(step=1, wall_s=0.1, flops=1.0, train_loss=1.0, heldout_loss=1.0, d_k=[2])]))
    sql(db, "UPDATE train_runs SET final_heldout = X'00ff' WHERE key = 't0'")
    before = digest(db)
    with pytest.raises(DatabaseFileError, match="final_heldout"):
        load(db)
    assert digest(db) == before


def test_an_export_still_dumps_what_is_stored(tmp_path):
    """An export computes nothing: it reads the rows as stored (text and all), for the user to mend them."""
    db = _text_in_runs(tmp_path / "results.sqlite")
    assert read_runs(db).set_index("key").heldout_decrease["k1"] == "lots"
    with pytest.raises(DatabaseFileError, match="heldout_decrease"):
        read_runs(db, numbers=True)


# ------------------------------------------------------------------ integers the database cannot store
@pytest.mark.parametrize(("argv", "option"), [
    (["run", *TINY, "--seeds", "0,99999999999999999999999"], "--seeds"),
    (["run", *TINY, "--seeds", str(SQLITE_INT_MAX + 1)], "--seeds"),
    (["run", *TINY, "--threads", "2147483648"], "--threads"),
    (["run", *TINY, "--jobs", "2147483648"], "--jobs"),
    (["run", *TINY, "--d-e", str(2**64)], "--d-e"),
    (["run", *TINY, "--n-batches", str(2**63)], "--n-batches"),
    (["train", "--preset", "smoke", "--no-progress", "--seeds", str(MAX_TRAIN_SEED + 1)], "--seeds"),
    (["train", "--preset", "smoke", "--no-progress", "--threads", "2147483648"], "--threads"),
], ids=lambda v: " ".join(v[-2:]) if isinstance(v, list) else v)
def test_out_of_range_integer_is_refused_before_the_database_exists(tmp_path, capsys, argv, option):
    db = tmp_path / "r.sqlite"
    exits_2_in_one_line(capsys, [*argv, "--db", str(db)], option)
    assert list(tmp_path.iterdir()) == []  # no database, no cache


def test_every_integer_the_validation_accepts_fits_sqlite(tmp_path):
    assert check_int("seed", SQLITE_INT_MAX, 0) == SQLITE_INT_MAX
    with pytest.raises(ConfigError):
        check_int("seed", SQLITE_INT_MAX + 1, 0)
    with ResultsDB(tmp_path / "r.sqlite") as db:  # the largest accepted value is stored exactly
        db.write(dict(key="k", status="failed", seed=SQLITE_INT_MAX))
        assert int(db.frame().seed.iloc[0]) == SQLITE_INT_MAX
        with pytest.raises(OverflowError):  # what the bound prevents: the insert itself fails
            db.write(dict(key="k2", status="failed", seed=SQLITE_INT_MAX + 1))


# ------------------------------------------------------------------ options that multiply a run's cost
@pytest.mark.parametrize("option", ["--warmup-steps", "--repeats", "--n-batches", "--heldout-batches"])
def test_absurd_cost_is_refused_in_one_line(tmp_path, capsys, option):
    field = option[2:].replace("-", "_")
    exits_2_in_one_line(capsys, ["run", *TINY, option, str(COST_LIMITS[field] + 1), "--db", str(tmp_path / "r"),
                                 "--cache-dir", str(tmp_path / "c")], option)
    assert list(tmp_path.iterdir()) == []


def test_long_warm_up_shows_its_estimated_cost_before_starting(tmp_path, capsys, monkeypatch):
    import growbench.harness.runner.sweep as sweep

    started = []
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: started.append(capsys.readouterr().err) or pd.DataFrame())
    steps = WARMUP_NOTE_STEPS + 1
    assert cli_main(["run", *TINY, "--warmup-steps", str(steps), "--db", str(tmp_path / "r.sqlite")]) == 0
    (before,) = started  # what stderr held when the sweep was about to start
    notes = [line for line in before.splitlines() if "--warmup-steps" in line]
    assert len(notes) == 1 and str(steps) in notes[0] and re.search(r"about [\d.]+ (s|min|h) ", notes[0]), before


def test_warm_up_estimate_grows_with_steps_and_sizes_and_counts_shared_warm_ups_once():
    from growbench.harness.measure import RunConfig

    def cfg(**kw):
        return RunConfig(**{**dict(strategy="default", dataset="teacher", d_s=16, d_e=32, b=8, d_k=2, p=2,
                                   warmup_steps=1000), **kw})

    one = warmup_seconds([cfg()])
    assert 0 < one < warmup_seconds([cfg(warmup_steps=2000)]) < warmup_seconds([cfg(warmup_steps=2000, d_e=64)])
    assert warmup_seconds([cfg(), cfg(strategy="formula1")]) == one  # one model, warmed up once
    assert warmup_seconds([cfg(), cfg(seed=1)]) == 2 * one
    assert COST_LIMITS["warmup_steps"] < measure.STATS_INDEX_OFFSET  # warm-up batches never reach the statistics'


# ------------------------------------------------------------------ plugins that end the process
def test_plugin_calling_sys_exit_0_makes_run_fail_with_status_2(tmp_path):
    (tmp_path / "quitter_plugin.py").write_text("import sys\nsys.exit(0)\n")
    env = {**os.environ, "GROWBENCH_PLUGINS": "quitter_plugin", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    db = tmp_path / "r.sqlite"
    out = subprocess.run([*GROWBENCH, "run", *TINY, "--db", str(db)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "quitter_plugin" in out.stderr and "Traceback" not in out.stderr
    assert not db.exists()


@pytest.mark.parametrize("body", ["raise SystemExit", "raise SystemExit('bye')", "raise GeneratorExit",
                                  "class Odd(BaseException): pass\nraise Odd"])
def test_plugin_raising_any_base_exception_is_one_line_naming_it(tmp_path, capsys, monkeypatch, body):
    name = "odd_plugin"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GROWBENCH_PLUGINS", name)
    monkeypatch.delitem(sys.modules, name, raising=False)
    exits_2_in_one_line(capsys, ["run", *TINY, "--db", str(tmp_path / "r.sqlite")], name)
    assert not (tmp_path / "r.sqlite").exists()


# ------------------------------------------------------------------ the reference-projection cache
@pytest.fixture
def data():
    """Captured-like data: float32 inputs and gradients, a causal mask (the projection's cached input)."""
    X = anisotropic_X(4, 6, 5, cond=10.0, seed=3).float()
    G = random_G(4, 6, seed=4).float()
    return G, X, causal(6)


def reference(data, cache_dir: Path):
    """:func:`harness.measure.reference_projection` with the in-process memo cleared (a new process)."""
    measure._REFERENCES.clear()
    return measure.reference_projection(*data, str(cache_dir))


def same(a, b) -> bool:
    """The same projection, and the same solve report (compared as text: its energy_error may be NaN)."""
    return torch.equal(a[0], b[0]) and repr(a[1]) == repr(b[1])


@pytest.fixture
def entry(data, tmp_path):
    """A freshly written reference cache file, its record and the solve it stands for."""
    truth = metrics.projection(*data)
    got = reference(data, tmp_path)
    (path,) = tmp_path.iterdir()
    assert same(got, truth)
    return path, torch.load(path, weights_only=True), truth


def test_reference_file_carries_its_key_and_checksum_and_loads_silently(data, entry, tmp_path):
    path, blob, truth = entry
    key = reference_key(*data)
    assert blob["key_json"] == key and path == reference_path(tmp_path, key)
    assert '"reference_version"' in key and isinstance(blob["checksum"], str)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert same(reference(data, tmp_path), truth)


def _flip_bit(path: Path, PiG: torch.Tensor) -> None:
    """Flip the lowest bit of ΠG's first nonzero entry in the file (a change torch itself does not notice)."""
    at = tensor_offset(path, PiG) + 8 * int(PiG.reshape(-1).nonzero()[0])
    patch_bytes(path, at, bytes([path.read_bytes()[at] ^ 1]))


def _rewrite(path: Path, blob: dict, PiG: torch.Tensor, *, checksum: bool) -> None:
    """Put ``PiG`` in the record, with a recomputed checksum (a forgery) or the old one (a plain edit)."""
    from growbench.harness.reference import _info_note

    new = {**blob, "tensors": {"PiG": PiG}}
    if checksum:
        new["checksum"] = record_digest(blob["key_json"], _info_note(blob), new["tensors"])
    torch.save(new, path)


DAMAGE = {
    # The case: a valid-looking file holding 10 ΠG (every optimality 10 times too small).
    "scaled-by-10-old-checksum": (lambda p, b: _rewrite(p, b, 10 * b["tensors"]["PiG"], checksum=False), "checksum"),
    "scaled-by-10-forged-checksum": (lambda p, b: _rewrite(p, b, 10 * b["tensors"]["PiG"], checksum=True),
                                     "implausible"),
    "scaled-by-1.01-forged-checksum": (lambda p, b: _rewrite(p, b, 1.01 * b["tensors"]["PiG"], checksum=True),
                                       "implausible"),
    "no-key-old-format": (lambda p, b: torch.save({"PiG": 10 * b["tensors"]["PiG"], "info": b["info"]}, p),
                          "not a cache record"),
    "stale-key": (lambda p, b: torch.save({**b, "key_json": b["key_json"].replace('"reference_version":',
                                                                                  '"reference_version":9')}, p),
                  "key"),
    "flipped-bit-in-the-projection": (lambda p, b: _flip_bit(p, b["tensors"]["PiG"]), "checksum"),
    "garbage": (lambda p, b: p.write_bytes(b"not a torch file"), "unreadable"),
    "wrong-shape": (lambda p, b: _rewrite(p, b, b["tensors"]["PiG"][:2], checksum=True), "shape"),
    "nan": (lambda p, b: _rewrite(p, b, b["tensors"]["PiG"] * float("nan"), checksum=True), "not finite"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_reference_file_failing_a_check_is_solved_again_and_overwritten(data, entry, tmp_path, kind):
    path, blob, truth = entry
    damage, reason = DAMAGE[kind]
    damage(path, blob)
    with pytest.warns(CacheWarning, match=reason) as caught:
        got = reference(data, tmp_path)
    assert any(str(path) in str(w.message) for w in caught)
    assert same(got, truth)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # overwritten in place, no temporary file
    with warnings.catch_warnings():  # and trusted again
        warnings.simplefilter("error", CacheWarning)
        assert same(reference(data, tmp_path), truth)


def test_reference_of_another_definition_is_a_different_entry(data, entry, tmp_path, monkeypatch):
    path, _, truth = entry
    monkeypatch.setattr(metrics, "REFERENCE_VERSION", getattr(metrics, "REFERENCE_VERSION", 1) + 1, raising=False)
    assert reference_path(tmp_path, reference_key(*data)) != path
    assert same(reference(data, tmp_path), truth)
    assert len(list(tmp_path.iterdir())) == 2


def test_every_solve_passes_the_orthogonality_check(tmp_path):
    """The check must not refuse honest files: dense and CG solves, masked or not, of float32 data."""
    for d_e, d_s, cond, mask in ((8, 16, 10.0, None), (48, 16, 1e3, None), (40, 32, 1e6, causal(32)),
                                 (33, 64, 1e2, causal(64))):
        X = anisotropic_X(3, d_s, d_e, cond=cond, seed=1).float()
        G = random_G(3, d_s, seed=2).float()
        ref = metrics.projection(G, X, mask)
        key = reference_key(G, X, mask)
        path = reference_path(tmp_path, key)
        from growbench.harness.reference import save_reference

        save_reference(path, key, ref)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            assert same(load_reference(path, key, G, mask), ref)


# ------------------------------------------------------------------ cache writes: full disk, symlinks, permissions
def _full_disk(monkeypatch) -> None:
    """``torch.save`` as on a full disk: some bytes written, then the RuntimeError torch raises (not an OSError)."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        partial = io.BytesIO()
        real(obj, partial, *args, **kwargs)
        with contextlib.nullcontext(f) if hasattr(f, "write") else open(f, "wb") as out:
            out.write(partial.getvalue()[:100])
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 960 vs 854")

    monkeypatch.setattr(torch, "save", save)


def test_reference_cache_write_on_a_full_disk_leaves_nothing_and_the_result_stands(data, tmp_path, monkeypatch):
    _full_disk(monkeypatch)
    with pytest.warns(CacheWarning, match="could not write"):
        got = reference(data, tmp_path / "cache")
    assert same(got, metrics.projection(*data))
    assert list((tmp_path / "cache").iterdir()) == []


def test_warm_up_cache_write_on_a_full_disk_leaves_nothing_and_the_model_stands(tmp_path, monkeypatch):
    ds = datasets.make_dataset("teacher", 6, 5, 0)
    truth = datasets.trained_model(ds, 2, warmup_steps=3, batch_size=4, cache_dir=None).state_dict()
    _full_disk(monkeypatch)
    with pytest.warns(CacheWarning, match="could not write"):
        got = datasets.trained_model(ds, 2, warmup_steps=3, batch_size=4, cache_dir=tmp_path).state_dict()
    assert all(torch.equal(got[k], truth[k]) for k in truth)
    assert list(tmp_path.iterdir()) == []


def forget_in_process() -> None:
    """Empty the in-process memos of trained models and projections, as a new process starts: caches are used."""
    measure._REFERENCES.clear()
    measure._TRAINED.clear()


def test_run_with_a_full_disk_for_its_caches_is_stored_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    forget_in_process()
    _full_disk(monkeypatch)
    db, cache = tmp_path / "r.sqlite", tmp_path / "cache"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    monkeypatch.undo()
    frame = read_runs(db)
    assert list(frame.status) == ["ok"] and frame.optimality.notna().all()
    # Neither a cache file nor a .tmp left (a site's lock file holds nothing: measure._site_lock).
    assert not [p for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock"]


def test_cache_files_are_the_users_own_and_symlinks_are_replaced_not_followed(tmp_path, capsys):
    cache, victim = tmp_path / "cache", tmp_path / "victim.pt"
    db = tmp_path / "r.sqlite"
    forget_in_process()
    assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(cache)]) == 0
    files = sorted(p for p in cache.iterdir() if p.suffix != ".lock")
    assert {p.name.split("-")[0] for p in files} == {"reference", "teacher"}
    for p in sorted(cache.iterdir()):  # the site's lock file too
        info = p.stat()
        assert info.st_uid == os.getuid() and not info.st_mode & 0o022, oct(info.st_mode)  # nobody else may write
    # Plant symlinks at both cache files' names: the rewrite replaces each link, its target untouched.
    victim.write_bytes(b"the user's own file")
    for p in files:
        p.unlink()
        p.symlink_to(victim)
    db.unlink()
    forget_in_process()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert cli_main(["run", *TINY, "--db", str(db), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    assert victim.read_bytes() == b"the user's own file"
    assert all(p.is_file() and not p.is_symlink() for p in files)


def test_a_successful_run_without_its_configuration_is_refused_naming_the_column(tmp_path):
    """A NULL where growbench stores a run's width: one line naming the column, exit 2, the file untouched."""
    import shutil
    import sqlite3
    import subprocess

    db = tmp_path / "r.sqlite"
    assert subprocess.run([*GROWBENCH, "run", "--strategies", "zero", "--datasets", "digits",
                           "--d-s", "4", "--d-e", "8", "--b", "8", "--d-k", "2", "--p", "2", "--repeats", "1",
                           "--n-batches", "1", "--warmup-steps", "3", "--db", str(db), "--cache-dir",
                           str(tmp_path / "c"), "--no-progress"], capture_output=True).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET d_e = NULL")
    conn.close()
    kept = tmp_path / "kept.sqlite"
    shutil.copy(db, kept)
    for command in ("recommend", "report"):
        done = subprocess.run([*GROWBENCH, command, "--db", str(db),
                               *(["--out", str(tmp_path / "rep")] if command == "report" else [])],
                              capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "d_e" in done.stderr and "Traceback" not in done.stderr
        assert db.read_bytes() == kept.read_bytes()
