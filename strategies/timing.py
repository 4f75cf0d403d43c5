"""Wall-clock timing of phases, synchronised on CUDA so that asynchronous kernels are counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued kernels on ``device`` (no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(timings: dict[str, float], phase: str, device: torch.device | str | None = None) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``timings[phase]`` (seconds)."""
    synchronize(device)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        synchronize(device)
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - t0
