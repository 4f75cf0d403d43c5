"""What a run records about where it ran: versions, device, threads, code version, time."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import torch

from growbench.harness.allocator import allocator

ROOT = Path(__file__).resolve().parent.parent
#: torch threads per process doing the work (each worker when ``--jobs > 1``). One: at these
#: sizes a second thread buys little on a quiet machine and, on a busy one, makes runs several
#: times slower (``growbench run --preset smoke`` on 2 shared cores: see the README).
DEFAULT_THREADS = 1
#: The folders whose source makes a run's result (:func:`code_version`): models too, whose blocks every run
#: trains and grows.
_SOURCE_PACKAGES = ("strategies", "harness", "datasets", "models")
#: Files of those folders left out of the code version (as paths from the root, with ``/``). ``default.json``
#: holds the default's choices with their evidence and provenance (the database's path, the time it was
#: written), rewritten by ``growbench recommend --write`` after every reference sweep: hashed, it made the
#: committed runs' keys differ from those of a fresh clone of the very commit that ships them. What a run takes
#: from it enters that run's key instead (:func:`config_key`).
_NOT_CODE = frozenset({"strategies/default.json"})


def source_files(root: Path) -> list[tuple[str, Path]]:
    """``(path from root with "/", path)`` of every file :func:`code_version` hashes under ``root``, in a fixed order.

    The ``.py`` and ``.json`` files of :data:`_SOURCE_PACKAGES`, but :data:`_NOT_CODE` and what
    is no one's source: anything in a hidden folder or a ``__pycache__`` (an editor's lock file
    ``.#x.py``, ``.ipynb_checkpoints``, a tool's cache), which one machine has and another not.
    Ordered by the ``/``-separated path, the same on every file system (``sorted`` of
    ``Path`` objects is case-insensitive on Windows).
    """
    out = []
    for pkg in _SOURCE_PACKAGES:
        for path in (root / pkg).rglob("*"):
            rel = path.relative_to(root)
            if path.suffix not in (".py", ".json") or not path.is_file() or rel.as_posix() in _NOT_CODE:
                continue
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            out.append((rel.as_posix(), path))
    return sorted(out, key=lambda item: item[0])


def tree_version(root: Path) -> str:
    """The code version of the source tree at ``root`` (see :func:`code_version`): 16 hex digits.

    Each file's relative path and bytes are hashed, with Windows line ends read as ``\\n``
    (a checkout with ``core.autocrlf`` holds the same code in other bytes).
    """
    h = hashlib.sha256()
    for rel, path in source_files(root):
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return h.hexdigest()[:16]


def code_version() -> str:
    """Hash of the source files of the measured packages (:func:`source_files`), the same on every machine.

    Used in resume keys: unlike a git commit it changes with uncommitted edits, so a
    resumed sweep never mixes results of two versions of the code. It depends on the
    files' paths below the repository root and their content only: not on where the
    checkout is, the file system's order, line ends, caches or hidden files. Read once
    per process; a sweep's worker takes its sweep's (:func:`pin_code_version`).
    """
    return _PINNED[0] if _PINNED else _tree_code_version()


@functools.cache
def _tree_code_version() -> str:
    return tree_version(ROOT)


#: The code version this process reports instead of reading the files: a worker's, set by its sweep.
_PINNED: list[str] = []


def pin_code_version(version: str) -> None:
    """Make :func:`code_version` return ``version`` in this process from now on.

    A sweep's worker process reads the source files later than the sweep did: an edit in
    between (a pull, another terminal) would give its rows keys the sweep does not know,
    and resume would run them again. The sweep's version is what it started to measure.
    """
    _PINNED[:] = [version]


@functools.cache
def git_commit() -> str:
    """``HEAD``'s hash, with ``+dirty`` when the tree has changes; ``unknown`` outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def require_device(device: str) -> None:
    """Refuse a CUDA device on a machine without one (a worker's guard: validation refuses it earlier)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch.cuda.is_available() is False")


def device_name(device: str) -> str:
    """A readable name of ``device``: the GPU model, or the CPU model."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str:
    """The set of vector instructions torch's CPU kernels run with here (``AVX512``, ``AVX2``, ``DEFAULT``...).

    Kernels of two sets sum float32 products in different orders: the same seed reproduces a run bit for bit only
    on a CPU of the same set (and thread count). The CPU's model name does not tell them apart: "AMD EPYC" hosts of
    both sets have made runs of this suite.
    """
    return torch.backends.cpu.get_cpu_capability()


def environment(device: str) -> dict:
    """The columns every result row carries about its environment."""
    return {
        "torch_version": torch.__version__,
        "device_name": device_name(device),
        "cpu_capability": cpu_capability(),
        "threads": torch.get_num_threads(),
        "git_commit": git_commit(),
        "code_version": code_version(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "allocator": allocator(),
    }


def now() -> str:
    """UTC time, ISO 8601."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class KeyedConfig:
    """Base of a run's frozen-dataclass configuration: ``as_dict`` and its resume ``key``."""

    def as_dict(self) -> dict:
        """The configuration as a plain dict."""
        return dataclasses.asdict(self)

    def key(self, code_version: str) -> str:
        """Resume key: the configuration and the code version."""
        return config_key(self.as_dict(), code_version)


def config_key(config: dict, code_version: str) -> str:
    """Resume key of a run: sha256 of its configuration and the code version (24 hex digits).

    A configuration that names the ``default`` strategy (as ``strategy`` or ``method``) runs the
    choices of ``strategies/default.json``, which the code version leaves out: those choices
    (:func:`default_choices`) enter its key. Any other key is a function of the configuration
    and the code version alone, so that a stored run's key can be recomputed from its row.
    """
    blob = {**config, "code_version": code_version}
    if any(_names_default(config.get(field)) for field in ("strategy", "method")):
        blob["default_choices"] = default_choices()
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def _names_default(name: object) -> bool:
    return isinstance(name, str) and name.strip().lower() == "default"


def default_choices() -> dict[str, list]:
    """What a growth by the ``default`` strategy takes from ``strategies/default.json``, per regime.

    ``{regime key: [spec, the regime whose evidence chose it, whether growth generalises there,
    the statement]}``: what a ``default`` growth runs and records. Not the file's evidence, nor where
    and when it was written, which differ between machines and change nothing a run does.
    """
    from growbench.strategies.spec import default_specs  # only a "default" run reads the file

    return {regime.key: [c.spec, c.source.key if c.source is not None else None, getattr(c, "generalises", None),
                         getattr(c, "statement", None)]
            for regime, c in default_specs().items()}


class RunExit(SystemExit):
    """A run's call of ``os._exit``, stopped where it was made (:func:`exits_contained`): ``code``, and ``how``."""

    def __init__(self, code: object, how: str) -> None:
        super().__init__(code)
        self.how = how


@contextlib.contextmanager
def exits_contained() -> Iterator[None]:
    """Within the block, ``os._exit`` called by this thread of this process raises :class:`RunExit` instead.

    A run executed in the sweep's own process (``--jobs 1``) that calls ``os._exit`` (a component's
    idea of giving up) would otherwise end the sweep at once, with the run's exit status and no
    word. Raised instead, it unwinds the run like ``sys.exit`` and is recorded as the run's failure
    (:func:`recorded`). Other threads (a worker's orphan watch) and forked children (whose
    ``os._exit`` is how they end) still exit for real.
    """
    real = os._exit
    pid, thread = os.getpid(), threading.get_ident()

    def contained(code: int) -> NoReturn:
        if os.getpid() == pid and threading.get_ident() == thread:
            raise RunExit(code, f"os._exit({code!r})")
        real(code)

    os._exit = contained
    try:
        yield
    finally:
        os._exit = real


def exit_message(e: SystemExit) -> str:
    """The failure of a run that tried to end its process (``sys.exit`` or ``os._exit``), in one line."""
    how = e.how if isinstance(e, RunExit) else f"sys.exit({e.code!r})"
    return (f"RunExit: the run called {how}, which would have ended the sweep; it was stopped there and recorded as "
            "failed")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)``, then restore the previous count.

    ``None`` leaves the count as it is. Restoring matters when runs execute in the
    caller's own process (``jobs=1``, tests, a notebook): its setting is not ours to keep.
    """
    if not threads:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def recorded(config, work: Callable[[], dict], threads: int | None = None) -> dict:
    """The result row of one run in a worker; never raises: a failure becomes a ``failed`` row.

    A run that calls ``sys.exit`` or ``os._exit`` fails the same way (:func:`exits_contained`):
    in the sweep's own process (``--jobs 1``) it would otherwise end the sweep without a word.

    Parameters
    ----------
    config : RunConfig or TrainConfig
        Has ``as_dict()``, ``key(code_version)`` and ``device``.
    work : callable
        Runs the configuration and returns its result columns.
    threads : int, optional
        torch threads for this run (restored afterwards); the row's ``threads`` column is
        the count the run had. ``None`` keeps the process's count.
    """
    with torch_threads(threads):
        env = environment(config.device)  # after the thread count is set: the row records what the run had
        row = {**config.as_dict(), **env, "key": config.key(env["code_version"]), "started_at": now()}
        try:
            with exits_contained():
                row.update(work())
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - any failure of one configuration is recorded, the sweep goes on
            row["status"] = "failed"
            row["error"] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=-4))
        except SystemExit as e:  # sys.exit, or os._exit contained: the run gave up, the sweep goes on
            row["status"] = "failed"
            row["error"] = exit_message(e) + "\n" + "".join(traceback.format_exc(limit=-4))
    row["finished_at"] = now()
    return row

