"""Seeded problems and helpers shared by the asv suites.

The project is imported inside a benchmark's ``setup`` through ``require``, which turns
an ``ImportError``/``AttributeError`` into ``NotImplementedError``: asv records it as
"skipped". So ``asv run`` over commits that predate a module skips the benchmarks that
need it instead of failing. (The module-level imports below only preload torch and
``strategies`` for asv's forkserver, and tolerate their absence.)

A failed import is a hard error instead when ``GROWBENCH_BENCH_STRICT=1`` (CI sets it:
there the commit under test is the one just installed, so nothing may be missing) or
when growbench is not installed at all (``asv run --python=same`` outside its venv).

torch runs on ``THREADS`` intra-op threads (1 unless ``GROWBENCH_BENCH_THREADS`` says otherwise).

Every problem is ``datasets.teacher.reference_problem`` (the README's reference measurement):
warmed up and cached by :func:`reference_cache` at the reference size b=256, d_s=128,
d_e=64, d_k=8, p=8, cond(Σ)=100, or untrained at any size by :func:`untrained_problem`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

try:  # Preloaded: with asv's forkserver (asv.conf.json) every benchmark process starts with them imported.
    import torch  # noqa: F401

    from growbench import strategies  # noqa: F401
except Exception:  # noqa: BLE001 - a commit without them: ``require`` skips in setup
    pass

# torch's intra-op threads, fixed so that results are comparable between machines and
# commits. One by default: with two, on a 2-core machine that is also running anything
# else, OpenMP's spin-waiting made kernels 10-40x slower and the timings meaningless
# (measured here during concurrent sweeps). ``GROWBENCH_BENCH_THREADS=2`` for two; keep one
# value for every run whose results are compared.
THREADS = int(os.environ.get("GROWBENCH_BENCH_THREADS", "1"))

# The reference problem (README "Reference measurement").
B, D_S, D_E, D_K, P = 256, 128, 64, 8, 8
COND = 100.0
SEED = 0

# Names as of this suite, spelled out instead of read from ``strategies.REGISTRY``,
# ``strategies.line_search.METHODS`` and ``strategies.presets()``: asv fixes ``params`` at
# discovery, then every benchmark process re-imports this module under the commit it
# measures and picks its parameters by index, so a list read from that commit's registry
# would shift the indices (and mislabel results) at any commit with other names. ``setup``
# skips a name that a commit does not know. Append here when the registry gains a name.
PRESETS = ["formula1", "formula2", "formula3", "formula4", "joint", "random", "zero", "gradmax", "default"]
# Component names of the spec grid ("averaging/inverse/truncation[+metric]/line_search:method").
AVERAGINGS = ["per-sample", "gram", "mean-input", "joint"]
INVERSES = ["pinv", "solve"]
TRUNCATIONS = ["full", "rsvd"]
LINE_SEARCHES = ["normal", "fast"]
METHODS = ["grid", "bounded", "newton", "quadratic"]  # quadratic: since 75fb517; bracket not yet benchmarked

# Statistics kinds: per-sample's update depends on the inverse, the others' do not.
STAT_KINDS = [f"per-sample/{inv}" for inv in INVERSES] + [avg for avg in AVERAGINGS if avg != "per-sample"]


def strict() -> bool:
    """Whether a failed project import is an error rather than a skip.

    ``GROWBENCH_BENCH_STRICT=1`` (CI, on the commit it just installed) or ``=0`` decides;
    otherwise it is strict only when no ``growbench`` distribution is installed at all:
    then nothing could be benchmarked, and skipping everything would hide that.
    """
    flag = os.environ.get("GROWBENCH_BENCH_STRICT")
    if flag is not None:
        return flag.strip().lower() not in ("", "0", "false", "no")
    from importlib import metadata

    try:
        metadata.distribution("growbench")
    except metadata.PackageNotFoundError:
        return True
    return False


def _import(module: str):
    """``growbench.<module>``, or at the commits before the package name (top-level ``strategies``, ...)
    the bare ``module``."""
    try:
        renamed = importlib.util.find_spec(f"growbench.{module.partition('.')[0]}") is not None
    except ImportError:  # no growbench package at all
        renamed = False
    return importlib.import_module(f"growbench.{module}" if renamed else module)


def require(module: str, *attrs: str):
    """Import ``module`` (and check ``attrs`` exist on it), else skip the benchmark.

    Returns the module. Raises ``NotImplementedError`` (asv: skipped) when the commit
    under test lacks it, unless :func:`strict`.
    """
    try:
        mod = _import(module)
        for a in attrs:
            getattr(mod, a)
    except (ImportError, AttributeError) as e:
        if strict():
            raise
        raise NotImplementedError(f"{module}: {e}") from e
    return mod


def skip(reason: str):
    """Skip the current benchmark (asv records it as skipped, never as failed)."""
    raise NotImplementedError(reason)


def init_torch():
    """Import torch with a fixed thread count, and the allocator the ``growbench`` command sets (floors and
    growths timed alike, harness.allocator), and return it."""
    import torch

    from growbench.harness.allocator import keep_freed_memory

    torch.set_num_threads(THREADS)
    keep_freed_memory()
    return torch


def spec_of(kind: str, rest: str = "full/fast:grid") -> str:
    """A full spec from a statistics kind (``"gram"`` or ``"per-sample/pinv"``); the inverse defaults to solve."""
    avg, _, inv = kind.partition("/")
    return f"{avg}/{inv or 'solve'}/{rest}"


def make(spec: str):
    """``strategies.make(spec)``, skipping the benchmark if this commit does not know the spec."""
    strategies = require("strategies", "make")
    try:
        return strategies.make(spec)
    except (ValueError, KeyError) as e:
        skip(f"spec {spec!r} unknown at this commit: {e}")


def _problem_module():
    """The module that builds the teacher–student problem: ``datasets.teacher``, or
    ``harness.reference`` at the commits before it moved (skips when neither has it)."""
    try:
        return require("datasets.teacher", "reference_problem")
    except NotImplementedError:
        return require("harness.reference", "reference_problem")


def anisotropic_covariance(d: int, cond: float, gen):
    """``datasets.teacher.anisotropic_covariance``: SPD ``(d, d)`` float64, eigenvalues from 1 to ``1/cond``."""
    init_torch()
    return require("datasets.teacher", "anisotropic_covariance").anisotropic_covariance(d, cond, gen)


def untrained_problem(b: int = B, d_s: int = D_S, d_e: int = D_E, d_k: int = D_K, cond: float = COND,
                      seed: int = SEED):
    """The reference problem at any size without its warm-up (a captured batch at initialisation).

    Built in well under a second, so every ``setup`` builds its own. The teacher has rank
    ``2 d_k`` (16 for the reference ``d_k = 8``). Returns a ``GrowthProblem``: ``X``
    (b, d_s, d_e), ``G`` (b, d_s, d_s), ``W_Q``, ``W_K``, ``scale``, ``mask`` (None) and a
    ``loss_of_scores`` differentiable twice (for the Newton line search).
    """
    init_torch()
    return _problem_module().reference_problem(b=b, d_s=d_s, d_e=d_e, d_k=d_k, teacher_d_k=2 * d_k, cond=cond,
                                               warmup_steps=0, seed=seed)


# ----------------------------------------------------------------------------- reference problem
def _closure_value(fn, name: str):
    return dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))[name].cell_contents


def _picklable_rest(pr):
    """``pr.rest``; at the commits before ``GrowthProblem`` had it, the same MSE rebuilt from the
    teacher's target in ``pr.loss_of_scores``'s closure. None if neither is there."""
    if hasattr(pr, "rest"):
        return pr.rest
    try:
        target = _closure_value(_closure_value(pr.loss_of_scores, "rest"), "target")
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return functools.partial(init_torch().nn.functional.mse_loss, target=target)


def reference_cache():
    """asv ``setup_cache``: build ``datasets.teacher.reference_problem()`` once per run.

    It takes ~15 s (20 Adam warm-up steps), so it is built once for every suite that
    uses it: they all set ``setup_cache = staticmethod(common.reference_cache)``, and asv
    keys the cache by this function (module and line), so one build serves them all.
    The loss closure is not picklable; the block (which keeps its captured input) and
    ``rest`` (the MSE to the teacher's output) are, and :class:`ReferenceProblem` rebuilds
    the closure from them. Returns ``None`` when the commit lacks the reference problem
    (benchmarks then skip).
    """
    init_torch()
    try:
        pr = _problem_module().reference_problem(b=B, d_s=D_S, d_e=D_E, d_k=D_K, cond=COND, seed=SEED)
    except NotImplementedError:
        return None
    rest = _picklable_rest(pr)
    # Without ``rest`` (a closure layout this suite does not know), ReferenceProblem rebuilds the
    # whole problem in each setup: slow, but the same numbers.
    return {"X": pr.X, "G": pr.G, "mask": pr.mask, "scale": pr.scale, "W_Q": pr.W_Q, "W_K": pr.W_K,
            "block": pr.block if rest is not None else None, "rest": rest}


reference_cache.timeout = 600


class ReferenceProblem:
    """The cached reference problem with its loss closure rebuilt (fields as ``GrowthProblem``)."""

    def __init__(self, cache: dict | None) -> None:
        init_torch()
        if cache is None:
            skip("datasets.teacher.reference_problem is missing at this commit")
        for k in ("X", "G", "mask", "scale", "W_Q", "W_K"):
            setattr(self, k, cache[k])
        if cache["block"] is not None:
            self.loss_of_scores = cache["block"].loss_of_scores(cache["rest"], 0)
        else:
            self.loss_of_scores = _problem_module().reference_problem(b=B, d_s=D_S, d_e=D_E, d_k=D_K, cond=COND,
                                                                      seed=SEED).loss_of_scores

    def grow(self, strategy, p: int = P, stats=None):
        kw = {} if stats is None else {"stats": stats}
        return strategy.grow(self.W_Q, self.W_K, self.X, self.G, p=p, loss_of_scores=self.loss_of_scores,
                             scale=self.scale, mask=self.mask, **kw)


def search_problem(prob, strategy, rank: int = D_K + P):
    """The ``strategies.SearchProblem`` that ``strategy.grow`` builds on ``prob``'s batch at ``rank``.

    Statistics of that batch alone, factors and scale unchanged (``new_scale = scale``), by
    ``strategies.build_search_problem``, the builder ``grow`` itself uses. Skips when the
    commit lacks it or when the direction is zero on the batch (no search to time).
    """
    torch = init_torch()
    strategies = require("strategies", "build_search_problem", "StepContext")
    X, G, mask = prob.X, prob.G, prob.mask
    stats = strategy.new_statistics().update(X, G, mask)
    with torch.no_grad():
        Z = prob.scale * prob.W_Q @ prob.W_K.mT
        S0 = X @ Z @ X.mT
        ctx = strategies.StepContext(X=X, G=G, mask=mask, loss=prob.loss_of_scores, Z=Z, S0=S0,
                                     loss0=float(prob.loss_of_scores(S0)), scale=prob.scale, new_scale=prob.scale)
        out = strategies.build_search_problem(strategy, stats, ctx, rank)
    if out is None:
        skip(f"{strategy.spec}: no search problem ({'; '.join(ctx.log)})")
    return out


def fix_malloc_threshold(nbytes: int = 1 << 20) -> bool:
    """Make glibc serve every allocation of ``nbytes`` or more by ``mmap`` (returned to the OS on free).

    By default glibc raises its mmap threshold after each large free, up to 32 MiB, and
    then serves later batches from its heap, where freed memory stays resident: the peak
    RSS then grows with the number of batches even when the live memory does not. With a
    fixed threshold the peak RSS follows the live tensors. No-op (False) off glibc.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, nbytes))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def retained_bytes(obj) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj``'s attributes (lists, dicts, tuples too)."""
    import torch

    seen: set[int] = set()
    total = 0
    stack = [obj]
    visited: set[int] = set()
    while stack:
        o = stack.pop()
        if id(o) in visited:
            continue
        visited.add(id(o))
        if torch.is_tensor(o):
            st = o.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set):
            stack.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.extend(vars(o).values())
    return total
