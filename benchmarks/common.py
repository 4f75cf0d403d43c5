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

Sizes default to the reference problem of ``harness.reference`` and the README:
b=256, d_s=128, d_e=64, d_k=8, p=8, cond(Σ)=100.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os

try:  # Preloaded: with asv's forkserver (asv.conf.json) every benchmark process starts with them imported.
    import torch  # noqa: F401

    import strategies  # noqa: F401
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

# Preset names as of this suite. asv fixes ``params`` at discovery, and every benchmark
# process must see the same list, so it is spelled out instead of read from
# ``strategies.presets()``; ``setup`` skips a preset that a commit does not know.
# Keep in sync with ``strategies.presets()`` when a preset is added.
PRESETS = ["formula1", "formula2", "formula3", "formula4", "joint", "random", "zero", "gradmax", "default"]

# Component names of the spec grid ("averaging/inverse/truncation[+metric]/line_search:method").
AVERAGINGS = ["per-sample", "gram", "mean-input", "joint"]
INVERSES = ["pinv", "solve"]
TRUNCATIONS = ["full", "rsvd"]
LINE_SEARCHES = ["normal", "fast"]
METHODS = ["grid", "bounded", "newton", "quadratic"]  # quadratic: since 75fb517

# Statistics kinds: per-sample's update depends on the inverse, the others' do not.
STAT_KINDS = ["per-sample/pinv", "per-sample/solve", "gram", "mean-input", "joint"]


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


def require(module: str, *attrs: str):
    """Import ``module`` (and check ``attrs`` exist on it), else skip the benchmark.

    Returns the module. Raises ``NotImplementedError`` (asv: skipped) when the commit
    under test lacks it, unless :func:`strict`.
    """
    try:
        mod = importlib.import_module(module)
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
    """Import torch with a fixed thread count and return it."""
    import torch

    torch.set_num_threads(THREADS)
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


def anisotropic_cholesky(d: int, cond: float, gen):
    """Cholesky factor of a random SPD ``(d, d)`` covariance with eigenvalues geometric from 1 to ``1/cond``."""
    torch = init_torch()
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    w = torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)
    return torch.linalg.cholesky((Q * w) @ Q.T)


def inputs(b: int = B, d_s: int = D_S, d_e: int = D_E, cond: float = COND, seed: int = SEED, gen=None):
    """Anisotropic inputs ``X (b, d_s, d_e) ~ N(0, Σ)``, float32."""
    torch = init_torch()
    gen = torch.Generator().manual_seed(seed) if gen is None else gen
    L = anisotropic_cholesky(d_e, cond, gen)
    return (torch.randn(b, d_s, d_e, generator=gen, dtype=torch.float64) @ L.T).float()


class SyntheticProblem:
    """A seeded teacher–student attention problem at any size, built in well under a second.

    Like ``harness.reference.reference_problem`` but without the warm-up and without the
    project's block (so it is independent of the commit under test): the student's scores
    ``S = X Z Xᵀ`` (``Z = c W_Q W_Kᵀ``, rank ``d_k``) feed ``softmax(S) X W_V`` and an MSE
    against a teacher of rank ``2 d_k``. ``G = ∂L/∂S`` comes from autograd; the loss closure
    is differentiable twice (for the Newton line search).
    """

    def __init__(self, b: int = B, d_s: int = D_S, d_e: int = D_E, d_k: int = D_K, cond: float = COND,
                 seed: int = SEED, sharpness: float = 4.0) -> None:
        torch = init_torch()
        gen = torch.Generator().manual_seed(seed)
        self.X = inputs(b, d_s, d_e, cond, gen=gen)
        scale = 1.0 / math.sqrt(d_k)

        def randn(*shape, std):
            return torch.randn(*shape, generator=gen) * std

        std = 1.0 / math.sqrt(d_e)
        T_Q, T_K = randn(d_e, 2 * d_k, std=sharpness * std), randn(d_e, 2 * d_k, std=sharpness * std)
        self.W_Q, self.W_K = randn(d_e, d_k, std=std), randn(d_e, d_k, std=std)
        W_V = randn(d_e, d_e, std=std)
        self.V = self.X @ W_V
        with torch.no_grad():
            S_t = self.X @ ((T_Q @ T_K.mT) / math.sqrt(2 * d_k)) @ self.X.mT
            self.target = torch.softmax(S_t, dim=-1) @ self.V
        self.scale = scale
        self.mask = None
        S = (self.X @ (scale * self.W_Q @ self.W_K.mT) @ self.X.mT).requires_grad_(True)
        with torch.enable_grad():
            (self.G,) = torch.autograd.grad(self.loss_of_scores(S), S)

    def loss_of_scores(self, S):
        import torch

        return torch.nn.functional.mse_loss(torch.softmax(S, dim=-1) @ self.V, self.target)


# ----------------------------------------------------------------------------- reference problem
def _closure_value(fn, name: str):
    return dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))[name].cell_contents


def reference_cache():
    """asv ``setup_cache``: build ``harness.reference.reference_problem()`` once per run.

    It takes ~15 s (20 Adam warm-up steps), so it is built once for every suite that
    uses it: they all set ``setup_cache = staticmethod(common.reference_cache)``, and asv
    keys the cache by this function (module and line), so one build serves them all.
    The loss closure is not picklable; the block (which keeps its captured input) and the
    teacher's target are, and :func:`reference_problem` rebuilds the closure from them.
    Returns ``None`` when the commit lacks the reference problem (benchmarks then skip).
    """
    init_torch()
    try:
        ref = require("harness.reference", "reference_problem")
    except NotImplementedError:
        return None
    pr = ref.reference_problem(b=B, d_s=D_S, d_e=D_E, d_k=D_K, cond=COND, seed=SEED)
    out = {"X": pr.X, "G": pr.G, "mask": pr.mask, "scale": pr.scale, "W_Q": pr.W_Q, "W_K": pr.W_K,
           "block": None, "target": None}
    try:
        rest = _closure_value(pr.loss_of_scores, "rest")
        out["target"] = _closure_value(rest, "target")
        out["block"] = pr.block
    except (AttributeError, KeyError, TypeError, ValueError):
        pass  # a different closure layout: reference_problem() rebuilds it in each setup (slow)
    return out


reference_cache.timeout = 600


class _MSE:
    """``rest(Y)`` of the reference problem: MSE against the teacher's output."""

    def __init__(self, target) -> None:
        self.target = target

    def __call__(self, Y):
        import torch

        return torch.nn.functional.mse_loss(Y, self.target)


class ReferenceProblem:
    """The cached reference problem with its loss closure rebuilt (fields as ``GrowthProblem``)."""

    def __init__(self, cache: dict | None) -> None:
        init_torch()
        if cache is None:
            skip("harness.reference.reference_problem is missing at this commit")
        for k in ("X", "G", "mask", "scale", "W_Q", "W_K"):
            setattr(self, k, cache[k])
        if cache["block"] is not None:
            self.loss_of_scores = cache["block"].loss_of_scores(_MSE(cache["target"]), 0)
        else:
            ref = require("harness.reference", "reference_problem")
            self.loss_of_scores = ref.reference_problem(b=B, d_s=D_S, d_e=D_E, d_k=D_K, cond=COND,
                                                        seed=SEED).loss_of_scores

    def grow(self, strategy, p: int = P, stats=None):
        kw = {} if stats is None else {"stats": stats}
        return strategy.grow(self.W_Q, self.W_K, self.X, self.G, p=p, loss_of_scores=self.loss_of_scores,
                             scale=self.scale, mask=self.mask, **kw)


def search_problem(prob, averaging: str = "gram/solve", rank: int = D_K + P, truncation=None):
    """The ``strategies.line_search.SearchProblem`` that ``GrowthStrategy.grow`` builds for ``prob``.

    Direction from ``averaging`` (formula 4 by default), normalised so ``‖X P̂ Xᵀ‖ = 1``,
    truncation ``truncation`` (default: full SVD, no metric) at ``rank``. The loss is
    wrapped to count calls (``.calls``). ``slope0`` is filled where the commit's
    ``SearchProblem`` has it; skips when its fields differ otherwise.
    """
    torch = init_torch()
    ls_mod = require("strategies.line_search", "SearchProblem")
    strategies = require("strategies", "REGISTRY")
    s = make(f"{averaging}/full/fast:grid")
    X, G, mask = prob.X, prob.G, prob.mask
    with torch.no_grad():
        P = s.direction(X, G, mask)
        Z = prob.scale * prob.W_Q @ prob.W_K.mT
        S0 = X @ Z @ X.mT
        D = X @ P @ X.mT
        if mask is not None:
            D = D * mask
        norm = float(torch.linalg.vector_norm(D))
    trunc = truncation or strategies.REGISTRY["truncation"]["full"](metric=False)
    counted = CountedLoss(prob.loss_of_scores)
    n_entries = D.numel() if mask is None else int(mask.expand(X.shape[0], -1, -1).sum())
    with torch.no_grad():
        loss0 = float(prob.loss_of_scores(S0))
    kw = {
        "loss": counted, "X": X, "Z": Z, "P_hat": P / norm, "S0": S0, "D_hat": D / norm, "loss0": loss0,
        "truncate": lambda Y: trunc(Y, rank, None), "lam_unit": math.sqrt(max(n_entries, 1)),
    }
    fields = {f.name for f in dataclasses.fields(ls_mod.SearchProblem)}
    if "slope0" in fields:  # φ'(0) = −⟨G, X P̂ Xᵀ⟩, free for the fast path (since 75fb517)
        kw["slope0"] = float(-(G * kw["D_hat"]).sum())
    missing = fields - set(kw) - {f.name for f in dataclasses.fields(ls_mod.SearchProblem)
                                  if f.default is not dataclasses.MISSING}
    if missing or set(kw) - fields:
        skip(f"SearchProblem has other fields at this commit: {sorted(fields)}")
    return ls_mod.SearchProblem(**kw)


class CountedLoss:
    """Counts calls of a loss closure."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, S):
        self.calls += 1
        return self.fn(S)


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
