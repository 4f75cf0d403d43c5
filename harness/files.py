"""Writing the files growbench writes, the one place it is done: atomically, never through a symlink, never onto
an input.

Every file is written to a temporary file in its own folder, flushed to disk, and renamed over the
target (:func:`replace_with`): a kill or a full disk leaves the old file whole, and a symlink at the
target is replaced, its target never written. :func:`check_output_file` refuses, before any work, an
output path that cannot be written so (a FIFO would block, a device or folder is not a file) or that
is an input of the same command (exporting onto the database would destroy it).

Tables written as CSV are made safe for spreadsheets (:func:`formula_safe`) and quote every text cell
(a bare carriage return in an unquoted cell would split its row); as parquet, readable by it
(:func:`parquet_safe`).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

# A spreadsheet reads a cell starting with one of these as a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class OutputFileError(ValueError):
    """An output path growbench refuses to write; the message is one line naming the option and the file."""


def _mode_for(path: Path) -> int:
    """The permissions the new file gets: the old file's, else what ``open`` would give (0666 less the umask)."""
    with contextlib.suppress(OSError):
        old = os.lstat(path)
        if stat.S_ISREG(old.st_mode):
            return stat.S_IMODE(old.st_mode)
    # The umask can only be read by setting it; it is set back at once.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _sync_folder(folder: Path) -> None:
    """Make the rename durable; a file system that cannot sync a folder loses nothing the rename did not."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_with(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` by ``write(tmp)`` on a temporary file in its folder, then rename that over ``path``.

    The temporary file is synced before the rename, so that a crash leaves either the old file or the
    new one, whole. A symlink at ``path`` is replaced by the new file: its target is never written.
    The temporary file is removed on any failure, whatever ``write`` raises (torch, pandas and pyarrow
    raise more than ``OSError``), and on an interrupt.

    Parameters
    ----------
    path : str or Path
        The file to write; its folder must exist.
    write : callable
        ``write(tmp)`` writes the whole content to the path ``tmp`` (e.g. ``frame.to_csv``).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OutputFileError
        The folder cannot hold the temporary file, or writing it failed with an ``OSError`` (a full
        disk): one line naming ``path``. Anything else ``write`` raises is raised as it is.
    """
    path = Path(path)
    mode = _mode_for(path)
    try:
        # The target's name ends the temporary one: writers that infer a format from the extension (pandas'
        # compression of "runs.csv.gz", matplotlib's format) do as they would for the target. A name near the
        # file system's limit keeps its extensions only.
        suffix = f"-{path.name}" if len(path.name) <= 200 else "".join(path.suffixes)[-40:]
        fd, name = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=path.parent)
    except OSError as e:
        raise OutputFileError(f"{path}: cannot write in its folder: {e.strerror or e}") from e
    tmp = Path(name)
    try:
        os.fchmod(fd, mode)  # mkstemp's 0600 would make every report page private to its writer
        os.close(fd)
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputFileError(f"{path}: cannot write the file: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return path


def replace_file(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically, as :func:`replace_with` does."""
    content = data.encode("utf-8") if isinstance(data, str) else data
    return replace_with(path, lambda tmp: tmp.write_bytes(content))


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory; give a file name"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe): writing it would block until something reads it"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "not a regular file"


def check_output_file(path: str | Path, option: str = "--out", inputs: Iterable[tuple[str, str | Path]] = ()) -> Path:
    """Refuse, before any work, an output path that :func:`replace_with` cannot or must not write.

    Parameters
    ----------
    path : str or Path
        The output file; followed through a symlink for the checks (the symlink itself would be replaced).
    option : str
        The option that named it, for the message.
    inputs : iterable of (str, path)
        ``(option, path)`` of the files the same command reads: the output may not be one of them
        (the same file by device and inode, so a hard link or symlink to it counts too).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OutputFileError
        A directory, FIFO, device or socket; an input; a read-only file; a missing or read-only folder.
    """
    path = Path(path)
    where = f"{option} {path}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as e:
        raise OutputFileError(f"{where}: cannot inspect it: {e.strerror or e}") from e
    if info is not None:
        kind = _kind(info.st_mode)
        if kind:
            raise OutputFileError(f"{where}: is {kind}")
        for name, other in inputs:
            with contextlib.suppress(OSError):
                if os.path.samefile(path, other):
                    raise OutputFileError(f"{where}: is the same file as {name} {other}; writing it would "
                                          "destroy it: give another output file")
        if not os.access(path, os.W_OK):
            raise OutputFileError(f"{where}: the file is read-only")
    folder = path.parent
    if not folder.is_dir():
        raise OutputFileError(f"{where}: its folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):  # the temporary file is written beside the target
        raise OutputFileError(f"{where}: its folder {folder} is not writable")
    return path


def formula_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell that a spreadsheet would run as a formula made text.

    A string starting with ``= + - @``, a tab or a carriage return gets a leading single quote (the
    OWASP convention for CSV injection). Numbers are left as they are: a negative number is a number.
    """
    def quote(value: object) -> object:
        return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value

    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]) and not pd.api.types.is_datetime64_any_dtype(out[column]):
            out[column] = out[column].map(quote)
    return out


def parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each column of mixed Python types (text in a numeric column) as text, which parquet can hold.

    Parquet columns have one type; SQLite lets a column hold numbers and text together, which pyarrow
    refuses. Missing values stay missing.
    """
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype != object:
            continue
        if len({type(v) for v in out[column].dropna()}) > 1:
            out[column] = out[column].map(_text_or_missing)
    return out


def _text_or_missing(value: object) -> object:
    """``value`` as text, a missing value (None, NaN, NA) as it is."""
    missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
    return value if missing else str(value)


def _to_csv(frame: pd.DataFrame, target: Path | None = None) -> str | None:
    """``frame`` as CSV (no index), to ``target`` or returned: :func:`formula_safe` cells, every text cell quoted.

    Quoting only where the csv module must (its default) leaves a cell holding a bare carriage
    return unquoted, which every reader takes for the end of the row.
    """
    return formula_safe(frame).to_csv(target, index=False, quoting=csv.QUOTE_NONNUMERIC)


def csv_text(frame: pd.DataFrame) -> str:
    """``frame`` as CSV text, as :func:`write_frame` writes it."""
    return _to_csv(frame)


def write_frame(frame: pd.DataFrame, path: str | Path, fmt: str = "csv") -> Path:
    """Write ``frame`` to ``path`` atomically as CSV (:func:`formula_safe`) or parquet (:func:`parquet_safe`).

    Raises
    ------
    OutputFileError
        The file cannot be written, or parquet cannot hold the table (one line naming ``path``).
    """
    if fmt == "csv":
        return replace_with(path, lambda tmp: _to_csv(frame, tmp))
    if fmt != "parquet":
        raise ValueError(f"unknown table format {fmt!r}; valid: csv, parquet")
    safe = parquet_safe(frame)
    try:
        return replace_with(path, lambda tmp: safe.to_parquet(tmp, index=False))
    except ImportError as e:
        raise OutputFileError(f"{path}: parquet needs pyarrow (pip install pyarrow): {e}") from e
    except OutputFileError:
        raise
    except (ValueError, TypeError, NotImplementedError) as e:  # pyarrow's errors derive from these
        raise OutputFileError(f"{path}: parquet cannot hold this table: {type(e).__name__}: {e}") from e
