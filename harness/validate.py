"""Check every configuration before any work starts: sizes, devices, datasets, memory, options.

A configuration that cannot run must be refused before a model is trained or a row is
written: a ``failed`` row means that a run failed, never that its input was wrong. Every
check here raises :class:`ConfigError`, a ``ValueError`` that also carries the
configuration field at fault, so that the command line can name its option in one line
and exit with status 2.

What is checked (:func:`check_run_config` per run, cheap, also on construction of a
:class:`~harness.measure.RunConfig`; :func:`check_runs` and :func:`check_train_configs`
for a whole sweep):

- sizes are ints ``>= 1`` (``warmup_steps >= 0``, seeds ``>= 0``), and
  ``d_k + p <= d_in``, the width of the input the projections see (``d_e``; ``d_e + 1``
  for a pretrained head with biases, such as MiniLM's, whose input carries a ones column);
- the dataset's registry name (inline options ``name:key=value`` allowed) and its option
  names; the pretrained datasets' fixed sizes by their classes' ``check_sizes``,
  without loading the model; every other dataset by building it once (memoised) at the
  run's ``d_s`` and at most :data:`PROBE_WIDTH`, so that its own checks (digits' patch
  sizes, text's longest window, options' values) run before any work;
- the device: ``cpu``, ``cuda`` or ``cuda:N``, and present (see ``strict_devices``);
- the memory a run needs, estimated from its sizes (:func:`estimate_bytes`), against a
  limit (:func:`memory_limit`), the estimate shown when it is refused;
- ``jobs >= 1``, ``threads >= 1``, each at most :data:`MAX_WORKERS`;
- every integer fits SQLite's (:data:`SQLITE_INT_MAX`), since every one is stored with
  its run, and each option that multiplies a run's cost (warm-up steps, repeats, batches)
  is at most its :data:`COST_LIMITS` entry; :func:`warmup_seconds` estimates the warm-ups
  a sweep asks for, which the command line shows above :data:`WARMUP_NOTE_STEPS`.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable
from typing import Any

import torch

#: Synthetic datasets are probed at most this wide: their constraints on ``d_e`` are lower bounds
#: (teacher, icl-regression: ``d_e >= 2``), and building teacher's covariance at ``d_e = 4096``
#: takes about 15 s of one core, longer than many runs.
PROBE_WIDTH = 64
DEVICE_TYPES = ("cpu", "cuda")
#: Copies of a batch's scores and inputs alive at once in a forward/backward with capture
#: (scores, softmax, their gradients, the captured ``X``, ``G``): a deliberate over-estimate.
ACTIVATION_COPIES = 4
#: Batch size of the cached warm-up (``datasets.trained_model``'s default, used by every sweep run).
WARMUP_BATCH = 64
#: Share of the device's memory a run (times ``jobs`` on CPU) may be estimated to need.
MEMORY_SHARE = {"cpu": 0.8, "cuda": 0.9}
GIB = 1024**3
#: SQLite's largest integer. Every integer of a configuration is stored with its run; a larger one
#: cannot be, and the run would be measured only for its row to fail.
SQLITE_INT_MAX = 2**63 - 1
#: Largest seed of a training run: it derives its baselines' seeds as ``seed · 100 003 + step``
#: (:mod:`harness.train`), which torch's generator takes only as a signed 64-bit integer.
MAX_TRAIN_SEED = 2**32 - 1
#: Most parallel workers, and most torch threads per process: more than any machine has cores, so a
#: typo, and torch would try to start that many threads.
MAX_WORKERS = 1024
#: Largest value of each option that multiplies a run's cost. A warm-up of 100 000 steps is about
#: 2 minutes at the smallest sizes and hours at d_e = 256 (:func:`warmup_seconds`), and stays below the
#: index where the statistics batches start (``harness.measure.STATS_INDEX_OFFSET``); the others are
#: far beyond any preset (repeats 5, batches 4, held-out batches 64).
COST_LIMITS = {"warmup_steps": 100_000, "repeats": 1_000, "n_batches": 10_000, "heldout_batches": 10_000}
#: Warm-up steps above which the command line shows :func:`warmup_seconds`' estimate before starting.
WARMUP_NOTE_STEPS = 10_000
#: Cost model of one warm-up step (Adam on a batch of :data:`WARMUP_BATCH`): a fixed overhead plus
#: ``WARMUP_BATCH · d_s · d_e · (d_s + d_e)`` multiply-adds at this rate. Fitted on one thread of the
#: development machine (teacher: 1.2 ms a step at d_s = d_e = 8, 11 ms at d_s = 32, d_e = 64, 0.41 s at
#: d_s = 128, d_e = 256); text's model takes about twice as long. More threads or a GPU are faster.
WARMUP_STEP_OVERHEAD_S, WARMUP_RATE = 1e-3, 1.5e9


class ConfigError(ValueError):
    """A configuration that cannot run.

    Parameters
    ----------
    field : str
        What is at fault: a configuration field (``"d_e"``, ``"dataset"``, ...), ``"d_k+p"``,
        ``"memory"``, ``"jobs"`` or ``"threads"``; the command line maps it to its option.
    message : str
        One line that says what is wrong and what is valid.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ------------------------------------------------------------------ scalars
def check_int(field: str, value: Any, minimum: int, maximum: int = SQLITE_INT_MAX) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (bools and floats refused); raise :class:`ConfigError` otherwise.

    The default ``maximum`` is :data:`SQLITE_INT_MAX`: any larger integer could not be stored with its run.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ConfigError(field, f"{field} must be an integer >= {minimum}, got {value!r}") from None
    if v < minimum:
        raise ConfigError(field, f"{field} must be an integer >= {minimum}, got {v}")
    if v > maximum:
        why = " (2**63 - 1, the largest integer SQLite stores)" if maximum == SQLITE_INT_MAX else ""
        raise ConfigError(field, f"{field} must be an integer from {minimum} to {maximum}{why}, got {v}")
    return v


def check_cost(field: str, value: Any, minimum: int) -> int:
    """``value`` as an int from ``minimum`` to the option's :data:`COST_LIMITS` entry.

    Raises
    ------
    ConfigError
        Not an integer, or out of range.
    """
    limit = COST_LIMITS[field]
    v = check_int(field, value, minimum)
    if v > limit:
        raise ConfigError(field, f"{field} must be an integer from {minimum} to {limit}, got {v}: each unit adds "
                                 f"to every run's time, and the limit is far beyond what any sweep needs")
    return v


def check_float(field: str, value: Any, minimum: float) -> float:
    """``value`` as a finite float ``>= minimum``; raise :class:`ConfigError` otherwise (NaN and inf too)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"{field} must be a finite number >= {minimum:g}, got {value!r}") from None
    if not math.isfinite(v) or v < minimum:
        raise ConfigError(field, f"{field} must be a finite number >= {minimum:g}, got {v}")
    return v


def check_jobs(jobs: Any) -> int:
    """Parallel workers, from 1 to :data:`MAX_WORKERS`."""
    return check_int("jobs", jobs, 1, MAX_WORKERS)


def check_threads(threads: Any) -> int:
    """torch threads per process doing the work, from 1 to :data:`MAX_WORKERS`."""
    return check_int("threads", threads, 1, MAX_WORKERS)


def check_dtype(dtype: Any) -> str:
    """``dtype`` if it names a torch floating dtype (``"float32"``, ``"float64"``, ...)."""
    value = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ConfigError("dtype", f"dtype must name a torch floating dtype (float32, float64), got {dtype!r}")
    return dtype


# ------------------------------------------------------------------ devices
def check_device(device: Any, *, present: bool = True) -> str:
    """``device`` if it is ``cpu``, ``cuda`` or ``cuda:N`` and, with ``present``, there on this machine.

    Raises
    ------
    ConfigError
        Field ``device``: an unknown device type, a malformed name, or (with ``present``)
        ``cuda`` when ``torch.cuda.is_available()`` is False or ``cuda:N`` beyond the
        devices present.
    """
    valid = "cpu, cuda, cuda:N"
    if not isinstance(device, str):
        raise ConfigError("device", f"device must be a string ({valid}), got {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError("device", f"unknown device {device!r}; valid: {valid}") from None
    if dev.type not in DEVICE_TYPES:
        raise ConfigError("device", f"unknown device {device!r}; valid: {valid}")
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise ConfigError("device", f"unknown device {device!r}; valid: {valid}")
    if present and dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", f"device {device!r} requested, but torch.cuda.is_available() is False "
                                        f"(torch {torch.__version__}); use cpu")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ConfigError("device", f"device {device!r} requested, but only {n} CUDA device(s) are present "
                                        f"(cuda:0..cuda:{n - 1})")
    return device


def device_present(device: str) -> bool:
    """Whether a device already known to be well formed is there on this machine."""
    try:
        check_device(device, present=True)
    except ConfigError:
        return False
    return True


# ------------------------------------------------------------------ datasets
def dataset_class(spec: Any) -> tuple[type, dict[str, str]]:
    """The dataset class of ``spec`` (``"name"`` or ``"name:key=value:..."``) and its inline options.

    Raises
    ------
    ConfigError
        Field ``dataset``: not a string, a malformed option, an unknown name (the message
        lists the valid ones) or an unknown option name.
    """
    from growbench.datasets.registry import DATASETS, parse_dataset

    if not isinstance(spec, str):
        raise ConfigError("dataset", f"dataset must be a string, got {spec!r}")
    try:
        name, options = parse_dataset(spec)
    except ValueError as e:
        raise ConfigError("dataset", str(e)) from None
    if name not in DATASETS:
        raise ConfigError("dataset", f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    cls = DATASETS[name]
    unknown = sorted(set(options) - set(cls.defaults))
    if unknown:
        raise ConfigError("dataset", f"{name}: unknown option(s) {', '.join(unknown)}; "
                                     f"valid options: {', '.join(sorted(cls.defaults)) or 'none'}")
    return cls, options


def is_pretrained(spec: str) -> bool:
    """Whether ``spec`` names a dataset of a real pretrained model (fixed sizes, costly to build)."""
    from growbench.datasets.registry import PRETRAINED_DATASETS, parse_dataset

    return parse_dataset(spec)[0] in PRETRAINED_DATASETS


def missing_extra(spec: str) -> str | None:
    """Why dataset ``spec`` cannot run here, in one line naming what to install, or None when it can.

    Only a real-model dataset can lack something: ``transformers``, or (unless
    ``source=random``) the packaged weights (:meth:`datasets.pretrained.PretrainedDataset.missing`).
    """
    if not is_pretrained(spec):
        return None
    from growbench.datasets.registry import DATASETS, parse_dataset

    name, options = parse_dataset(spec)
    return DATASETS[name].missing(options)


def runnable_here(configs: list) -> tuple[list, list[str]]:
    """The configurations (sweep or training runs) whose dataset can run here, and one line per dataset left out
    (:func:`missing_extra`)."""
    why = {spec: missing_extra(spec) for spec in dict.fromkeys(c.dataset for c in configs)}
    return [c for c in configs if why[c.dataset] is None], [w for w in dict.fromkeys(why.values()) if w]


def input_width(spec: str, d_e: int) -> int:
    """``d_in``, the width of the input ``W_Q`` and ``W_K`` act on: ``d_e``, plus the ones column of a
    pretrained head with biases (``models.block.GrowableAttention.d_in`` with ``bias``)."""
    return dataset_class(spec)[0].input_width(d_e) if is_pretrained(spec) else d_e


def check_dataset(spec: str, d_e: int, d_s: int, d_k: int | None = None, p: int = 0) -> None:
    """Check that dataset ``spec`` accepts these sizes, building it only when that is cheap.

    The pretrained datasets are checked by their classes' ``check_options`` and ``check_sizes``
    (:class:`datasets.pretrained.PretrainedDataset`) without loading the model; every other dataset is
    built once per ``(spec, d_s, min(d_e, PROBE_WIDTH))`` (:func:`_probe`), which runs its
    own checks of ``d_s``, ``d_e`` and of its options' values.

    Raises
    ------
    ConfigError
        Field ``dataset``.
    """
    cls, options = dataset_class(spec)
    if is_pretrained(spec):
        error = _pretrained_options_error(spec)
        if error:
            raise ConfigError("dataset", error)
        try:
            cls.check_sizes(d_e, d_s, d_k, p)
        except ValueError as e:
            raise ConfigError("dataset", str(e)) from None
        missing = cls.missing(options)
        if missing:
            raise ConfigError("dataset", missing)
        return
    error = _probe(spec, min(d_e, PROBE_WIDTH), d_s)
    if error:
        raise ConfigError("dataset", error)


@functools.cache
def _pretrained_options_error(spec: str) -> str:
    """The error message of a pretrained dataset's options (a corpus file is read once per sweep), or ``""``."""
    cls, options = dataset_class(spec)
    try:
        cls.check_options(options)
    except ValueError as e:
        return str(e)
    return ""


@functools.cache
def _probe(spec: str, d_e: int, d_s: int) -> str:
    """The error message of building ``spec`` at these sizes, or ``""`` when it builds."""
    from growbench.datasets.registry import make_dataset

    try:
        make_dataset(spec, d_e, d_s, 0)
    except ValueError as e:
        return str(e)
    return ""


# ------------------------------------------------------------------ memory
def estimate_bytes(*, b: int, d_s: int, d_in: int, n_batches: int = 1, n_heads: int = 1, warmup: bool = True,
                   dtype: str = "float32") -> int:
    """Bytes one run needs at most, estimated from its sizes (an over-estimate, not a measurement).

    Scores ``(b, d_s, d_s)`` and inputs ``(b, d_s, d_in)``, :data:`ACTIVATION_COPIES`
    copies per head, for the ``n_batches`` captured batches plus two (the held-out batch
    and the forward/backward in flight), plus the warm-up's batch of :data:`WARMUP_BATCH`;
    statistics of ``d_in²`` per sample (formula 1 keeps one per sample) and a few more
    ``d_in × d_in`` matrices (Gram sums, factors, a teacher's covariance).
    """
    per_sample = d_s * d_s + d_s * d_in
    batches = (n_batches + 2) * b + (WARMUP_BATCH if warmup else 0)
    elements = ACTIVATION_COPIES * n_heads * batches * per_sample + 2 * b * d_in**2 + 16 * d_in**2
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return elements * max(itemsize, 4)


def memory_limit(device: str) -> int:
    """Bytes a run on ``device`` may be estimated to need: a share (:data:`MEMORY_SHARE`) of the
    machine's physical memory on CPU, of the GPU's total memory on CUDA."""
    dev = torch.device(device)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev.index or 0).total_memory
    else:
        import psutil

        total = psutil.virtual_memory().total
    return int(MEMORY_SHARE[dev.type] * total)


def check_memory(need: int, device: str, what: str, *, jobs: int = 1, max_memory: float | None = None) -> None:
    """Refuse a run whose estimated memory (times ``jobs`` on CPU, where workers share it) exceeds the limit.

    Parameters
    ----------
    need : int
        Estimated bytes of one run (:func:`estimate_bytes`).
    device : str
        A present device.
    what : str
        The run's sizes, for the message.
    jobs : int
        Parallel workers.
    max_memory : float, optional
        The limit in GiB; default :func:`memory_limit`.

    Raises
    ------
    ConfigError
        Field ``memory``, with the estimate and the limit.
    """
    workers = jobs if torch.device(device).type == "cpu" else 1
    total = need * workers
    if max_memory is None:
        limit = memory_limit(device)
        kind = torch.device(device).type
        whose = "the GPU's memory" if kind == "cuda" else "this machine's memory"
        source = f"{100 * MEMORY_SHARE[kind]:.0f}% of {whose}"
    else:
        limit = int(check_float("max_memory", max_memory, 0) * GIB)
        source = "--max-memory"
    if total > limit:
        times = f" × {workers} workers" if workers > 1 else ""
        raise ConfigError("memory", f"{what} needs an estimated {_gib(need)}{times}, more than the limit of "
                                    f"{_gib(limit)} ({source}); use smaller sizes or raise --max-memory")


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB" if n < 1024 * GIB else f"{n / 1024 / GIB:.3g} TiB"


# ------------------------------------------------------------------ sweep runs
def check_run_config(cfg) -> None:
    """The cheap checks of one :class:`~harness.measure.RunConfig` (no device presence, no dataset build).

    Raises
    ------
    ConfigError
        The first problem, with the field at fault.
    """
    from growbench import strategies
    from growbench.models.block import SCALE_POLICIES

    if not isinstance(cfg.strategy, str):
        raise ConfigError("strategy", f"strategy must be a string, got {cfg.strategy!r}")
    try:
        strategies.canonical(cfg.strategy)
    except ValueError as e:
        raise ConfigError("strategy", str(e)) from None
    dataset_class(cfg.dataset)
    for name in ("d_s", "d_e", "b", "d_k", "p"):
        check_int(name, getattr(cfg, name), 1)
    for name in ("n_batches", "repeats"):
        check_cost(name, getattr(cfg, name), 1)
    check_cost("warmup_steps", cfg.warmup_steps, 0)
    check_int("seed", cfg.seed, 0)
    # Two at least: the held-out decrease's standard error is their spread.
    check_cost("heldout_batches", cfg.heldout_batches, 2)
    d_in = input_width(cfg.dataset, cfg.d_e)
    if cfg.d_k + cfg.p > d_in:
        width = f"d_e + 1 = {d_in} (the head's input has a ones column)" if d_in > cfg.d_e else f"d_e = {cfg.d_e}"
        raise ConfigError("d_k+p", f"d_k + p = {cfg.d_k} + {cfg.p} = {cfg.d_k + cfg.p} exceeds {width} "
                                   f"for {cfg.dataset}: Z = c W_Q W_Kᵀ has rank at most {d_in}")
    check_device(cfg.device, present=False)
    check_dtype(cfg.dtype)
    if cfg.scale_policy not in SCALE_POLICIES:
        raise ConfigError("scale_policy", f"unknown scale_policy {cfg.scale_policy!r}; "
                                          f"valid: {', '.join(SCALE_POLICIES)}")


def check_runs(configs: Iterable, *, jobs: int = 1, max_memory: float | None = None,
               strict_devices: bool = True) -> None:
    """Check a sweep's runs before any of them starts: each run, its device, its memory, its dataset.

    Parameters
    ----------
    configs : iterable of RunConfig
    jobs : int
        Parallel workers (they share the CPU's memory).
    max_memory : float, optional
        Memory limit in GiB; default :func:`memory_limit` of each device.
    strict_devices : bool
        Refuse a run on a device that is not present. With False, such runs are left to
        :func:`harness.runner.pool.pending`, which skips them with a message (a preset that
        mixes cpu and cuda runs on a machine without a GPU), unless no run at all can
        run here.

    Raises
    ------
    ConfigError
    """
    configs = list(configs)
    check_jobs(jobs)
    if max_memory is not None:
        check_float("max_memory", max_memory, 0)
    for c in configs:
        check_run_config(c)
    runnable = _runnable(configs, strict_devices)
    for c in runnable:
        need = estimate_bytes(b=c.b, d_s=c.d_s, d_in=input_width(c.dataset, c.d_e), n_batches=c.n_batches,
                              warmup=c.warmup_steps > 0, dtype=c.dtype)
        check_memory(need, c.device, f"{c.dataset} at b={c.b}, d_s={c.d_s}, d_e={c.d_e}, n_batches={c.n_batches}",
                     jobs=jobs, max_memory=max_memory)
    for spec, d_e, d_s, d_k, p in dict.fromkeys((c.dataset, c.d_e, c.d_s, c.d_k, c.p) for c in runnable):
        check_dataset(spec, d_e, d_s, d_k, p)


def warmup_seconds(configs: Iterable) -> float:
    """Seconds of one thread the warm-ups of a sweep's runs take, estimated, when none is cached.

    Runs that share a dataset, sizes, seed and precision share one warm-up (the model cache); each
    step costs :data:`WARMUP_STEP_OVERHEAD_S` plus its multiply-adds at :data:`WARMUP_RATE`. An
    estimate of the order of magnitude, shown before a long sweep starts, not a promise.
    """
    models = {(c.dataset, c.d_s, c.d_e, c.d_k, c.seed, c.warmup_steps, c.dtype, c.scale_policy, c.device)
              for c in configs}
    return sum(steps * (WARMUP_STEP_OVERHEAD_S + WARMUP_BATCH * d_s * d_e * (d_s + d_e) / WARMUP_RATE)
               for _, d_s, d_e, _, _, steps, *_ in models)


def _runnable(configs: list, strict_devices: bool) -> list:
    """The configurations whose device is present; refuse absent ones when ``strict_devices``, or when none is left."""
    present = {d: device_present(d) for d in {c.device for c in configs}}
    absent = sorted(d for d, ok in present.items() if not ok)
    if absent and (strict_devices or all(not present[c.device] for c in configs)):
        check_device(absent[0], present=True)  # raises, with the reason
    return [c for c in configs if present[c.device]]


# ------------------------------------------------------------------ training runs
def check_train_configs(configs: Iterable, *, jobs: int = 1, max_memory: float | None = None,
                        strict_devices: bool = True) -> None:
    """Check a training sweep's runs before any starts (the checks of :func:`check_runs`).

    :class:`~harness.train.TrainConfig` already checks its method, policies, ``d_k0``,
    ``d_k_max`` and step counts on construction; this adds the dataset, the sizes, the
    seed, the device and the memory.

    Raises
    ------
    ConfigError
    """
    configs = list(configs)
    check_jobs(jobs)
    if max_memory is not None:
        check_float("max_memory", max_memory, 0)
    for c in configs:
        dataset_class(c.dataset)
        for name in ("d_s", "d_e", "b", "d_k0", "d_k_max", "p", "n_heads", "stats_batches", "steps"):
            check_int(name, getattr(c, name), 1)
        check_int("seed", c.seed, 0, MAX_TRAIN_SEED)
        check_device(c.device, present=False)
        check_dtype(c.dtype)
        if is_pretrained(c.dataset):
            _check_real_training(c)
    runnable = _runnable(configs, strict_devices)
    for c in runnable:
        need = estimate_bytes(b=c.b, d_s=c.d_s, d_in=input_width(c.dataset, c.d_e), n_batches=c.stats_batches,
                              n_heads=_grown_heads(c), warmup=False, dtype=c.dtype)
        check_memory(need, c.device, f"{c.dataset} at b={c.b}, d_s={c.d_s}, d_e={c.d_e}, {c.n_heads} head(s)",
                     jobs=jobs, max_memory=max_memory)
    for spec, d_e, d_s, d_k in dict.fromkeys((c.dataset, c.d_e, c.d_s, c.d_k_max) for c in runnable):
        check_dataset(spec, d_e, d_s, d_k, 0)


def _check_real_training(c) -> None:
    """A training run on the real model: its options (layer, head, source, narrow), one head count, no scale policy.

    Raises
    ------
    ConfigError
    """
    from growbench.datasets.pretrained import NARROW

    cls, options = dataset_class(c.dataset)
    name = cls.name
    try:
        cls.check_options(options)
    except ValueError as e:
        raise ConfigError("dataset", str(e)) from None
    if c.n_heads != 1:
        raise ConfigError("n_heads", f"{name}: the dataset's option narrow ({', '.join(NARROW)}) chooses the "
                                     f"heads grown; n_heads must be 1, got {c.n_heads}")
    if c.scale_policy != "rescale":
        raise ConfigError("scale_policy", f"{name}: the real model keeps its pretrained score scale; "
                                          f"scale_policy must be rescale (the default), got {c.scale_policy!r}")


def _grown_heads(c) -> int:
    """Heads a training run grows: ``n_heads``, or on the real model the heads its option ``narrow`` picks."""
    if not is_pretrained(c.dataset):
        return c.n_heads
    cls, options = dataset_class(c.dataset)
    return cls.site_count(options)


# ------------------------------------------------------------------ growbench example
def check_example(*, b: int, d_s: int, d_e: int, d_k: int, p: int, cond: float, repeats: int, device: str,
                  max_memory: float | None = None) -> None:
    """Check the reference problem of ``growbench example`` before it is built.

    Raises
    ------
    ConfigError
        Sizes not ``>= 1`` (teacher needs ``d_e >= 2``), ``d_k + p > d_e``, ``cond`` not a
        finite number ``>= 1``, ``repeats < 1``, an unknown or absent device, too much memory.
    """
    for name, value in (("b", b), ("d_s", d_s), ("d_e", d_e), ("d_k", d_k), ("p", p), ("repeats", repeats)):
        check_int(name, value, 1)
    check_int("d_e", d_e, 2)
    if d_k + p > d_e:
        raise ConfigError("d_k+p", f"d_k + p = {d_k} + {p} = {d_k + p} exceeds d_e = {d_e}: "
                                   f"Z = c W_Q W_Kᵀ has rank at most d_e")
    check_float("cond", cond, 1)
    check_device(device)
    check_memory(estimate_bytes(b=b, d_s=d_s, d_in=d_e), device, f"the problem at b={b}, d_s={d_s}, d_e={d_e}",
                 max_memory=max_memory)
