"""What a run records about where it ran: versions, device, threads, code version, time."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import platform
import socket
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
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
