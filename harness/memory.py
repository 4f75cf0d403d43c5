"""Peak memory of a block of code: CUDA's allocator statistics, or sampled RSS on CPU."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

from growbench.harness.allocator import release_freed_memory


@contextmanager
def peak_memory(device: str, interval: float = 0.001) -> Iterator[dict]:
    """Yield a dict whose ``"peak_bytes"`` is set on exit.

    On CUDA: ``torch.cuda.max_memory_allocated`` after a reset (exact, allocator level).
    On CPU: the increase of the process's resident set size over its value on entry,
    sampled every ``interval`` seconds by a thread (torch's CPU allocator keeps no peak
    statistics); allocations shorter than the interval can be missed. Free memory the allocator kept
    (:mod:`harness.allocator`) is handed back first: a block reused from it would not show.
    """
    out: dict = {"peak_bytes": None, "method": None}
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield out
        torch.cuda.synchronize(device)
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated(device) - base)
        out["method"] = "cuda_max_memory_allocated"
        return
    release_freed_memory()
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(interval)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        out["peak_bytes"] = int(peak[0] - base)
        out["method"] = "sampled_rss_increase"
