"""Hostile input, round two (issue 29): files the user owns, and output escaping.

Nothing the user owns is lost or overwritten: ``export`` never writes onto its database, a FIFO or a
device, and writes atomically; ``report`` never writes through a symlink in its folder and removes
only the files an earlier report wrote (its manifest), saying so; Markdown and CSV output escape what
growbench did not write (no raw HTML, no code span or fence closed early, no spreadsheet formula);
``strategies/default.json`` that is a FIFO or nested too deeply is refused in one line, promptly.
Every test asserts the property (the file is unchanged, the target untouched, exit 2 and one line),
not the wording. The report is built three times in all (about 8 s each on 2 cores).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import stat
import threading
import warnings
from pathlib import Path

import pandas as pd
import pytest
from test_report import row, write_db

import growbench.strategies.spec as reg
from growbench import strategies
from growbench.harness.cli import main as cli_main
from growbench.harness.files import csv_text, replace_file, replace_with
from growbench.harness.report.build import build_report
from growbench.harness.report.output import MANIFEST
from growbench.harness.report.render import ENVIRONMENT, render_html, render_markdown
from growbench.harness.report.sections import Paragraph, Report, Section, Span

DEFAULT = strategies.default_spec()
SCRIPT = "<script>alert(1)</script>"
# A plugin component's name as a hostile plugin could register it: backtick fences, blank lines, markup.
EVIL_NAME = f"evil```\n\n{SCRIPT}\r\n\r\n`x`"
FORMULA_DATASET = '=HYPERLINK("http://evil.example","click")'
# A folder name a user could give: a backtick fence, a blank line and an HTML tag (no "/": it is one folder).
EVIL_FOLDER = "db```\n\n<img src=x onerror=alert(1)>"
ALLOWED_HTML = ("<details>", "<summary>", "</summary>", "</details>")  # the report's own folding


def text_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line(capsys) -> str:
    """The command's stderr: exactly one line, no traceback."""
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def within(seconds: float, call, *args):
    """``call(*args)`` in a daemon thread; fail (instead of hanging the suite) if it has not returned in time."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = call(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked for {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def hostile_rows() -> list[dict]:
    """Two datasets (one named as a spreadsheet formula) × two seeds, a baseline, and a failed run whose
    strategy and error hold fences, blank lines and markup."""
    rows = []
    for ds in ("teacher", FORMULA_DATASET):
        for seed in (0, 1):
            rows += [row(DEFAULT, ds, seed=seed, t=0.002), row("zero", ds, seed=seed, opt=0.05, heldout=-0.0001)]
    rows.append(row(EVIL_NAME, "teacher", status="failed", error=f"@SUM(1+1) ```\n\n{SCRIPT}\n-1"))
    return rows


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile") / EVIL_FOLDER
    folder.mkdir()
    return write_db(folder / "r.sqlite", hostile_rows())


@pytest.fixture(scope="module")
def reported(db, tmp_path_factory) -> Path:
    """A report of ``db`` into a folder where the user keeps pictures of their own in ``figures/``."""
    out = tmp_path_factory.mktemp("report") / "out"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "holiday.png").write_bytes(b"\x89PNG my holiday")
    (out / "figures" / "diagram.svg").write_text("<svg>mine</svg>")
    build_report(db, out)
    return out


def copy_of(out: Path, where: Path) -> Path:
    return Path(shutil.copytree(out, where / "out", symlinks=True))


# ------------------------------------------------------------------ export: never onto what it reads
@pytest.mark.parametrize("how", ["same_path", "db_named_like_the_default_out", "hard_link", "symlink"])
def test_export_onto_its_own_database_is_refused_and_the_database_is_unchanged(tmp_path, capsys, db, how):
    ours = tmp_path / ("results.csv" if how == "db_named_like_the_default_out" else "runs.sqlite")
    shutil.copyfile(db, ours)
    before = digest(ours)
    out = {"same_path": ["--out", str(ours)], "db_named_like_the_default_out": [],  # default --out: results.csv
           "hard_link": ["--out", str(tmp_path / "hard.csv")], "symlink": ["--out", str(tmp_path / "link.csv")]}[how]
    if how == "hard_link":
        os.link(ours, tmp_path / "hard.csv")
    if how == "symlink":
        (tmp_path / "link.csv").symlink_to(ours)
    assert cli_main(["export", "--db", str(ours), *out]) == 2
    one_line(capsys)
    assert digest(ours) == before
    with contextlib.closing(sqlite3.connect(ours)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == len(hostile_rows())


def test_export_onto_a_fifo_returns_at_once_with_exit_2(tmp_path, capsys, db):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    assert within(30, cli_main, ["export", "--db", str(db), "--out", str(fifo)]) == 2
    one_line(capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_export_onto_a_device_is_refused_and_the_device_is_left_alone(capsys, db):
    assert within(30, cli_main, ["export", "--db", str(db), "--out", os.devnull]) == 2
    one_line(capsys)
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


# ------------------------------------------------------------------ atomic writes
def test_a_write_failing_midway_leaves_the_old_file_whole_and_no_temporary_file(tmp_path):
    target = tmp_path / "default.json"
    target.write_text('{"old": true}\n')
    target.chmod(0o640)

    def half_then(error: BaseException):
        def write(tmp: Path) -> None:
            tmp.write_text('{"new": ')  # what a kill or a full disk leaves: half a file
            raise error
        return write

    # torch.save raises RuntimeError on a full disk, pandas and pyarrow their own errors; an interrupt too.
    for error in (RuntimeError("unexpected pos 960 vs 854"), KeyboardInterrupt(), OSError(errno.ENOSPC, "full")):
        with pytest.raises((RuntimeError, KeyboardInterrupt, ValueError)):
            replace_with(target, half_then(error))
        assert target.read_text() == '{"old": true}\n'
        assert [p.name for p in tmp_path.iterdir()] == ["default.json"]
    replace_file(target, '{"new": true}\n')
    assert target.read_text() == '{"new": true}\n' and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_export_on_a_full_disk_keeps_the_old_export_whole(tmp_path, capsys, db, monkeypatch):
    out = tmp_path / "runs.csv"
    out.write_text("the old export\n")

    def full_disk(self, path, *args, **kwargs):
        Path(path).write_text("dataset,strat")  # a 235 MB export cut short
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    assert cli_main(["export", "--db", str(db), "--out", str(out)]) == 2
    assert str(out) in one_line(capsys)
    assert out.read_text() == "the old export\n" and [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_export_replaces_a_symlink_and_never_writes_through_it(tmp_path, capsys, db):
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("not yours")
    (tmp_path / "out.csv").symlink_to(victim)
    assert cli_main(["export", "--db", str(db), "--out", str(tmp_path / "out.csv")]) == 0
    assert victim.read_text() == "not yours"
    assert not (tmp_path / "out.csv").is_symlink() and len(pd.read_csv(tmp_path / "out.csv")) == len(hostile_rows())


def test_export_infers_compression_from_the_target_name_not_the_temporary_one(tmp_path, db):
    out = tmp_path / "runs.csv.gz"
    assert cli_main(["export", "--db", str(db), "--out", str(out)]) == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b" and len(pd.read_csv(out)) == len(hostile_rows())


# ------------------------------------------------------------------ export: CSV formulas, parquet of mixed types
def test_export_csv_writes_formula_like_text_as_text_and_numbers_as_numbers(tmp_path, db):
    out = tmp_path / "runs.csv"
    assert cli_main(["export", "--db", str(db), "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    for column in text_columns(frame):
        cells = frame[column].dropna().astype(str)
        assert not cells.str.match(r"[=+\-@\t\r]").any(), (column, cells[cells.str.match(r"[=+\-@]")].tolist())
    assert f"'{FORMULA_DATASET}" in set(frame.dataset)
    assert frame.error.dropna().str.startswith("'@SUM").any()
    assert pd.api.types.is_float_dtype(frame.heldout_decrease) and (frame.heldout_decrease < 0).any()


def test_csv_text_quotes_formulas_in_text_columns_only():
    frame = pd.DataFrame({"variant": ["=1+1", "+cmd", "-x", "@A1", "\tx", "\rx", "plain", None],
                          "loss": [-1.5, 2.0, -3.0, 0.0, 1.0, 1.0, 1.0, -2.0]})
    back = pd.read_csv(io.StringIO(csv_text(frame)))
    assert back.variant.dropna().str.startswith("'").sum() == 6 and "plain" in set(back.variant)
    assert back.loss.tolist() == frame.loss.tolist()


def test_parquet_export_of_text_in_a_numeric_column(tmp_path, capsys, db):
    mixed = shutil.copyfile(db, tmp_path / "mixed.sqlite")
    with sqlite3.connect(mixed) as conn:  # SQLite lets a REAL column hold text; parquet columns have one type
        conn.execute("UPDATE runs SET optimality = 'n/a' WHERE rowid = (SELECT MIN(rowid) FROM runs)")
    out = tmp_path / "runs.parquet"
    code = cli_main(["export", "--format", "parquet", "--db", str(mixed), "--out", str(out)])
    if code == 2:  # refused is acceptable, in one line and without a file
        one_line(capsys)
        assert not out.exists()
    else:
        assert code == 0
        back = pd.read_parquet(out)
        assert len(back) == len(hostile_rows()) and "n/a" in set(back.optimality)


# ------------------------------------------------------------------ report: symlinks in --out
@pytest.mark.parametrize("link", ["out", "figures", "report.html"])
def test_report_refuses_a_symlink_in_its_folder_before_writing_anything(tmp_path, capsys, db, link):
    outside = tmp_path / "outside"
    (outside / "figures").mkdir(parents=True)
    (outside / "report.html").write_text("not yours")
    (outside / "figures" / "holiday.png").write_bytes(b"mine")
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    if link == "out":
        out.symlink_to(outside)
    else:
        out.mkdir()
        (out / link).symlink_to(outside / link)
    assert cli_main(["report", "--db", str(db), "--out", str(out)]) == 2
    one_line(capsys)
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    if link != "out":
        assert [p.name for p in out.iterdir()] == [link]  # nothing else was written


def test_report_refuses_a_symlinked_figure_and_writes_nothing(tmp_path, capsys, db, reported):
    out = copy_of(reported, tmp_path)
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"outside --out")
    (out / "figures" / "pareto.png").unlink()
    (out / "figures" / "pareto.png").symlink_to(victim)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.is_symlink()}
    assert cli_main(["report", "--db", str(db), "--out", str(out)]) == 2
    one_line(capsys)
    assert victim.read_bytes() == b"outside --out" and (out / "figures" / "pareto.png").is_symlink()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.is_symlink()} == before


# ------------------------------------------------------------------ report: removes only what it wrote
def test_report_removes_only_the_stale_files_its_previous_report_wrote(tmp_path, capsys, db, reported):
    out = copy_of(reported, tmp_path)
    manifest = json.loads((out / MANIFEST).read_text())
    svgs = {name for name in manifest["files"] if name.endswith(".svg")}
    assert svgs and "figures/diagram.svg" not in svgs  # the user's picture was never the report's
    # The user edits one of the report's figures: no longer what the report wrote, so it is kept.
    (out / "figures" / "breakdown.svg").write_text("<svg>edited by hand</svg>")
    # A tampered manifest naming a file outside --out (with its true digest) and the user's picture.
    victim = tmp_path / "victim.txt"
    victim.write_text("outside")
    manifest["files"]["../victim.txt"] = [digest(victim)]
    manifest["files"][str(victim)] = [digest(victim)]
    manifest["files"]["figures/../../victim.txt"] = [digest(victim)]
    (out / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()

    done = build_report(db, out, svg=False)  # this report draws no SVG: the earlier ones are stale

    left = {p.name for p in (out / "figures").iterdir()}
    assert {"holiday.png", "diagram.svg", "breakdown.svg"} <= left  # the user's two reports later, and the edit
    assert (out / "figures" / "holiday.png").read_bytes() == b"\x89PNG my holiday"
    assert (out / "figures" / "diagram.svg").read_text() == "<svg>mine</svg>"
    assert victim.read_text() == "outside"
    removed = {str(Path(p).relative_to(out)) for p in done["removed"]}
    assert removed == svgs - {"figures/breakdown.svg"} and not removed & {f"figures/{n}" for n in left}
    err = capsys.readouterr().err  # said, in one line naming them
    lines = [line for line in err.splitlines() if "removed" in line]
    assert len(lines) == 1 and all(name in lines[0] for name in removed)
    assert set(json.loads((out / MANIFEST).read_text())["files"]) == {
        str(Path(p).relative_to(out)) for p in done["files"]}


# ------------------------------------------------------------------ report: Markdown, HTML and CSV escaping
def markdown_tokens(text: str):
    markdown_it = pytest.importorskip("markdown_it")
    parser = markdown_it.MarkdownIt("commonmark").enable("table")
    tokens = []
    for t in parser.parse(text):
        tokens += [t, *(t.children or [])]
    return tokens


def raw_html(tokens) -> list[str]:
    """The HTML tags a Markdown viewer would render as HTML, besides the report's own folding."""
    html = [t.content for t in tokens if t.type in ("html_block", "html_inline")]
    return [tag for content in html for tag in re.findall(r"<[^>]*>?", content) if tag not in ALLOWED_HTML]


def test_report_md_has_no_raw_html_from_a_path_names_or_errors(reported, db):
    text = (reported / "report.md").read_text()
    tokens = markdown_tokens(text)
    assert not raw_html(tokens)
    # The command block holds the whole command, the path's fence and blank line included: not closed early.
    fences = [t.content for t in tokens if t.type == "fence"]
    assert any(str(db) in content for content in fences)
    html = pytest.importorskip("markdown_it").MarkdownIt("commonmark").enable("table").render(text)
    assert "<script" not in html
    assert all(tag.startswith('<img src="figures/') for tag in re.findall(r"<img\b[^>]*>", html))


def test_code_spans_and_sources_with_fences_and_blank_lines_stay_text():
    spans = [EVIL_NAME, "`", "a `` b", f"``` {SCRIPT}"]
    report = Report("t", f"growbench report --db 'x```\n\n{SCRIPT}'", "now",
                    [Section("S", [Paragraph.of("Use ", *[p for s in spans for p in (Span(s, "code"), " ")],
                                                Span(EVIL_NAME, "file"),
                                                f" and {EVIL_NAME}")])],
                    source=f"/data/```\n\n{SCRIPT}.sqlite")
    md = render_markdown(report)
    tokens = markdown_tokens(md)
    assert not raw_html(tokens)
    code = [t.content for t in tokens if t.type == "code_inline"]
    for s in spans:  # each span is whole, on one line, backticks kept
        assert " ".join(s.replace("\r\n", "\n").split("\n")) in code, (s, code)
    html = render_html(report)
    assert SCRIPT not in html and "&lt;script&gt;" in html
    for name in ("report.html.j2", "blocks.html.j2"):
        assert ENVIRONMENT.autoescape(name)  # Jinja2 escapes every string in the HTML page


def test_report_summary_csv_writes_formula_like_names_as_text(reported):
    frame = pd.read_csv(reported / "summary.csv")
    assert f"'{FORMULA_DATASET}" in set(frame.dataset)
    for column in text_columns(frame):
        assert not frame[column].dropna().astype(str).str.match(r"[=+\-@\t\r]").any(), column
    assert pd.api.types.is_numeric_dtype(frame.total_ms)


# ------------------------------------------------------------------ strategies/default.json
@pytest.fixture
def default_file(tmp_path, monkeypatch):
    monkeypatch.setattr(reg, "_WARNED", set())
    path = tmp_path / "default.json"
    monkeypatch.setattr(reg, "DEFAULT_FILE", str(path))  # an absolute path: joinpath yields it
    return path


def refused_default(path: Path) -> str:
    """``default.json`` at ``path`` is refused: a one-line ValueError, promptly; ``default`` falls back with one
    warning naming the file."""
    with pytest.raises(ValueError) as info:
        within(30, reg._read_default, path)
    assert "\n" not in str(info.value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert within(30, strategies.default_spec) == reg.BUILTIN_DEFAULT
    ours = [str(w.message) for w in caught if issubclass(w.category, reg.DefaultFileWarning)]
    assert len(ours) == 1 and str(path) in ours[0] and "\n" not in ours[0]
    return str(info.value)


def test_default_json_that_is_a_fifo_does_not_block(default_file):
    os.mkfifo(default_file)
    refused_default(default_file)
    assert stat.S_ISFIFO(os.lstat(default_file).st_mode)


def test_a_fifo_default_json_warning_is_shown_without_opening_the_fifo(default_file):
    """Issue 38: the warning named the FIFO as its source, and the formatter (linecache) opened it for the source
    line, which blocked every command. Shown as a terminal shows it, promptly; linecache reads nothing for it."""
    import linecache

    os.mkfifo(default_file)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert within(30, strategies.default_spec) == reg.BUILTIN_DEFAULT
    (w,) = [w for w in caught if issubclass(w.category, reg.DefaultFileWarning)]
    assert w.filename != str(default_file) and str(default_file) in str(w.message)
    # What the default printer writes (warnings.showwarning: formatwarning, which asks linecache for the line).
    shown = within(30, warnings.formatwarning, w.message, w.category, w.filename, w.lineno)
    assert shown.count("\n") == 1 and str(default_file) in shown
    assert within(30, linecache.getline, w.filename, w.lineno) == ""
    assert stat.S_ISFIFO(os.lstat(default_file).st_mode)


def test_default_json_nested_too_deeply_is_refused_in_one_line(default_file):
    depth = 200_000
    default_file.write_text('{"regimes": {"cpu/small": {"spec": ' + "[" * depth + "]" * depth + "}}}")
    refused_default(default_file)
