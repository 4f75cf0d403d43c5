"""The report's files: staged in memory while the report is built, then written together into ``--out``.

The report writes only real files inside its folder and removes only what it wrote:

- before anything is written, ``--out``, ``--out/figures`` and every file about to be written are
  checked: a symlink among them is refused (:func:`check_report_folder`), so that nothing outside
  the folder is written through one;
- each file is written atomically (:func:`harness.files.replace_file`);
- the folder keeps a manifest, :data:`MANIFEST`, of the files the last report wrote with the SHA-256
  of each; the next report removes a file of that list it no longer writes, and only while its
  content is still what the report wrote. Any other file in the folder (a user's ``holiday.png`` in
  ``figures/``) is never touched.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import stat
from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from growbench.harness.files import OutputFileError, csv_text, replace_file
from growbench.harness.report.figures.base import FigureResult
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.default_file import database_label

MANIFEST = ".growbench-report.json"
FIGURES = "figures"
#: Salt of the ids in a figure's SVG (matplotlib draws a random one otherwise).
SVG_HASH_SALT = "growbench"
# The files of every report besides its figures (whose names are known once drawn): checked before any work.
FIXED_FILES = ("report.html", "report.md", "summary.csv", "recommendation.json", "training_summary.csv")
# The names a report writes: a page, table or figure directly in --out or in --out/figures (nothing hidden,
# nothing in another folder). A manifest entry of any other shape is not the report's and is ignored.
_OWN_NAME = re.compile(r"(?:figures/)?[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_report_folder(out: Path, names: Iterable[str] = ()) -> None:
    """Refuse a report folder whose writing would go through a symlink or onto something not a file.

    Parameters
    ----------
    out : Path
        The report's folder (``--out``); it and ``figures/`` may be missing (they are created).
    names : iterable of str
        The files about to be written, relative to ``out`` (``report.html``, ``figures/pareto.png``).

    Raises
    ------
    OutputFileError
        ``out``, ``out/figures``, the manifest or one of ``names`` is a symlink; ``out`` or
        ``out/figures`` is not a folder; one of the files is not a regular file.
    """
    where = f"--out {out}"
    for folder in (out, out / FIGURES):
        if folder.is_symlink():
            raise OutputFileError(f"{where}: {folder} is a symlink; the report writes only real files inside its "
                                  "folder: give the folder itself")
        if folder.exists() and not folder.is_dir():
            raise OutputFileError(f"{where}: {folder} exists and is not a folder")
    for name in (MANIFEST, *names):
        path = out / name
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise OutputFileError(f"{where}: {path} is a symlink; the report would replace it (never writing "
                                  "through it): remove the link or give another folder")
        if not stat.S_ISREG(mode):
            raise OutputFileError(f"{where}: {path} is not a regular file; the report writes a file there")


def read_manifest(out: Path) -> dict[str, set[str]]:
    """The files the last report in ``out`` wrote, each with the digests its content may have.

    A missing, damaged or hand-made manifest gives nothing (nothing is then removed); an entry that
    is not a name the report writes is ignored.
    """
    path = out / MANIFEST
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {name: {d for d in digests if isinstance(d, str)} for name, digests in files.items()
            if isinstance(name, str) and _OWN_NAME.fullmatch(name) and isinstance(digests, list)}


def _write_manifest(out: Path, files: dict[str, set[str]]) -> None:
    data = {"written_by": "growbench report: the files it wrote here, removed by the next report that does not "
                          "write them again (and only while their content is the SHA-256 listed)",
            "files": {name: sorted(digests) for name, digests in sorted(files.items())}}
    replace_file(out / MANIFEST, json.dumps(data, indent=2) + "\n")


def _unchanged(path: Path, digests: set[str]) -> bool:
    """Whether ``path`` is a regular file (not a symlink) whose content is one that the report wrote."""
    try:
        return stat.S_ISREG(path.lstat().st_mode) and _digest(path.read_bytes()) in digests
    except OSError:
        return False


class ReportFiles:
    """The files of one report under ``out``, kept in memory until :meth:`write` writes them all.

    Parameters
    ----------
    out : Path
        The report's folder (``--out``).
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.staged: dict[str, bytes] = {}

    def add(self, name: str, data: str | bytes) -> Path:
        """Stage ``data`` (text as UTF-8) as the file ``name`` relative to the folder; return its path."""
        self.staged[name] = data.encode("utf-8") if isinstance(data, str) else data
        return self.out / name

    def add_table(self, name: str, frame: pd.DataFrame) -> Path:
        """Stage ``frame`` as the CSV file ``name``, formula-like text cells written as text."""
        return self.add(name, csv_text(frame))

    def add_figure(self, result: FigureResult, svg: bool) -> None:
        """Stage a drawn figure as PNG (also kept in ``result.png`` for the HTML page) and SVG, then close it."""
        if result.fig is None:
            return
        buffer = io.BytesIO()
        result.fig.savefig(buffer, format="png", dpi=100)
        result.png = buffer.getvalue()
        self.add(f"{FIGURES}/{result.name}.png", result.png)
        if svg:
            buffer = io.BytesIO()
            # No date and ids from a fixed salt, not a random one: the same figure is the same file.
            with plt.rc_context({"svg.hashsalt": SVG_HASH_SALT}):
                result.fig.savefig(buffer, format="svg", metadata={"Date": None})
            self.add(f"{FIGURES}/{result.name}.svg", buffer.getvalue())
            result.svg = True  # both pages link it beside the PNG
        plt.close(result.fig)

    def write(self) -> tuple[list[Path], list[str]]:
        """Write every staged file, then remove the files the last report wrote and this one does not.

        The manifest lists the old and the new files while they are written, so that a report killed
        midway leaves nothing the next one would not know as its own.

        Returns
        -------
        (list of Path, list of str)
            The files written, and the names (relative to the folder) of the files removed.

        Raises
        ------
        OutputFileError
            As :func:`check_report_folder`, before anything is written; or a file cannot be written.
        """
        check_report_folder(self.out, self.staged)
        (self.out / FIGURES).mkdir(parents=True, exist_ok=True)
        previous = read_manifest(self.out)
        new = {name: {_digest(data)} for name, data in self.staged.items()}
        _write_manifest(self.out, {name: previous.get(name, set()) | new.get(name, set())
                                   for name in {*previous, *new}})
        written = [replace_file(self.out / name, data) for name, data in self.staged.items()]
        removed = []
        for name in sorted(set(previous) - set(new)):
            path = self.out / name
            if _unchanged(path, previous[name]):
                path.unlink()
                removed.append(name)
        _write_manifest(self.out, new)
        return written, removed


def recommendation_json(recs: dict[str, Recommendation], error: str | None, db: str) -> str:
    """``recommendation.json``: per regime, the recommendation with its table and reference configurations
    (the shape of ``strategies/default.json``, plus the tables), or the error. The database is named as in
    ``default.json``, by its file name (:func:`harness.rule.default_file.database_label`): the same on every machine."""
    if not recs:
        data = {"regimes": {}, "error": error}
    else:
        db = database_label(db)
        data = {"rule": next(iter(recs.values())).rule, "regimes": {}, "db": db}
        for key, rec in recs.items():
            entry = rec.as_json(db)
            entry["table"] = json.loads(rec.table.to_json(orient="records"))
            entry["reference_configurations"] = rec.cells
            data["regimes"][key] = entry
    return json.dumps(data, indent=2) + "\n"
