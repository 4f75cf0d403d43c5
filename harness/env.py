"""What a run records about where it ran: versions, device, threads, code version, time."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import platform
import socket
import subprocess
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
#: torch threads per process doing the work (each worker when ``--jobs > 1``). One: at these
#: sizes a second thread buys little on a quiet machine and, on a busy one, makes runs several
#: times slower (``growbench run --preset smoke`` on 2 shared cores: see the README).
DEFAULT_THREADS = 1
_SOURCE_PACKAGES = ("strategies", "harness", "datasets")


@functools.cache
def code_version() -> str:
    """Hash of every ``.py``/``.json`` file of the measured packages.

    Used in resume keys: unlike a git commit it changes with uncommitted edits, so a
    resumed sweep never mixes results of two versions of the code.
    """
    h = hashlib.sha256()
    for pkg in _SOURCE_PACKAGES:
        base = ROOT / pkg
        for path in sorted(p for ext in ("*.py", "*.json") for p in base.rglob(ext)):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


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


def environment(device: str) -> dict:
    """The columns every result row carries about its environment."""
    return {
        "torch_version": torch.__version__,
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "git_commit": git_commit(),
        "code_version": code_version(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
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
    """Resume key of a run: sha256 of its configuration and the code version (24 hex digits)."""
    blob = json.dumps({**config, "code_version": code_version}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


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
            row.update(work())
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - any failure of one configuration is recorded, the sweep goes on
            row["status"] = "failed"
            row["error"] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=-4))
    row["finished_at"] = now()
    return row

