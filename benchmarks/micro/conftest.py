"""Fixtures of the pytest-benchmark micro-benchmarks (outside the default test run: testpaths is ["tests"]).

Run with ``python -m pytest benchmarks/micro --benchmark-only`` (add ``--benchmark-autosave``
to store a run under ``.benchmarks/``, ``--benchmark-compare`` to compare with the last one).
No ``__init__.py`` here, so asv's discovery (``benchmarks/`` is its package) never imports these.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("growbench.strategies")

from micro_common import D_E, D_K, D_S, THREADS, B, anisotropic_inputs  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)
    # The allocator the growbench command sets (harness.allocator): without it, timings include page faults.
    pytest.importorskip("growbench.harness.allocator").keep_freed_memory()


@pytest.fixture(scope="session")
def batch():
    """``(X, G)`` of the reference size; ``G`` random, scaled like a mean loss's gradient."""
    torch.set_num_threads(THREADS)
    X = anisotropic_inputs(B, D_S, D_E)
    G = torch.randn(B, D_S, D_S, generator=torch.Generator().manual_seed(1)) / (B * D_S)
    return X, G


@pytest.fixture(scope="session")
def reference():
    """``datasets.teacher.reference_problem`` at the reference size, with one warm-up step (a
    loss evaluation costs the same at any point; the full 20-step warm-up takes ~15 s)."""
    ref = pytest.importorskip("growbench.datasets.teacher")
    torch.set_num_threads(THREADS)
    return ref.reference_problem(b=B, d_s=D_S, d_e=D_E, d_k=D_K, warmup_steps=1)
