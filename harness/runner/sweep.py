"""The ablation sweep: strategies × datasets × sizes × seeds × devices, resumable.

Runs are measured in workers (in-process, joblib processes or a Dask cluster) and
written to SQLite by this process only, one committed row per finished run.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields

import pandas as pd
import torch
from tqdm.auto import tqdm

import strategies
from datasets import DATASETS, PRETRAINED_DATASETS
from harness.env import DEFAULT_THREADS, code_version
from harness.measure import RunConfig, run_one
from harness.store.results import ResultsDB
from harness.validate import ConfigError, check_jobs, check_runs, check_threads, dataset_class

DEFAULT_DB = "results/growbench.sqlite"
DEFAULT_CACHE = "results/cache"
SIZE_AXES = ("d_s", "d_e", "b", "d_k", "p")
LIST_AXES = ("strategies", "datasets", *SIZE_AXES, "seeds", "devices")
#: The synthetic datasets, which the size grids below fit; the pretrained ones have a fixed width
#: (d_e = 384) and would be refused at these sizes before any work.
DATASET_NAMES = tuple(name for name in DATASETS if name not in PRETRAINED_DATASETS)

#: The RunConfig field of each sweep axis (ConfigError names fields; the command line maps them to options).
_AXIS_FIELDS = {"strategies": "strategy", "datasets": "dataset", "seeds": "seed", "devices": "device"}

_PRESET_STRATEGIES = ["formula1", "formula2", "formula3", "formula4", "joint", "default", "random", "zero", "gradmax"]


def one_axis_variants(spec: str) -> list[str]:
    """``spec`` with each axis changed to each other value in turn (the ablation neighbourhood)."""
    c = strategies.parse(spec)
    out = []
    for axis in ("averaging", "inverse", "truncation", "line_search"):
        for name in strategies.REGISTRY[axis]:
            if name != c[axis]:
                out.append(strategies.canonical(_spec({**c, axis: name})))
    out.append(strategies.canonical(_spec({**c, "metric": not c["metric"]})))
    from strategies.line_search import METHODS

    out += [strategies.canonical(_spec({**c, "method": m})) for m in METHODS if m != c["method"]]
    return out


def _spec(c: dict) -> str:
    metric = "+metric" if c["metric"] else ""
    return f"{c['averaging']}/{c['inverse']}/{c['truncation']}{metric}/{c['line_search']}:{c['method']}"


# Sizes per dataset where its warm-up reaches a useful point (icl-regression needs
# N = d_s - 1 well above d_x = d_e - 1, and is rank-starved at d_k = 4 < d_x = 7).
QUICK_SIZES = {
    "teacher": dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
    "icl-regression": dict(d_s=[32], d_e=[8], b=[64], d_k=[4], p=[2]),
    "digits": dict(d_s=[16], d_e=[32], b=[64], d_k=[4], p=[4]),
    "text": dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
}


#: The scale set: d_e -> (b, d_s, d_k, p), the sizes where downstream code grows attention.
SCALE_SET = {64: (256, 128, 8, 8), 256: (64, 256, 16, 16), 768: (32, 512, 32, 32), 1024: (16, 1024, 32, 32),
             4096: (8, 2048, 64, 64)}
#: Largest width of the scale set measured on CPU (4096 needs a GPU to finish in minutes).
CPU_MAX_SCALE = 1024
SCALE_CANDIDATES = ["default", "gram/solve/full+metric/normal:newton", "gram/solve/full+metric/fast:quadratic",
                    "gram/solve/rsvd+metric/fast:quadratic", "gram/solve/rsvd+metric/fast:bracket",
                    "gram/solve/full+metric/fast:bracket", "gram/solve/rsvd+metric/normal:bracket"]


def scale_grids(devices: list[str], widths: list[int] | None = None, **kw) -> list[dict]:
    """One grid per width of the scale set (teacher, a barely trained student), for ``devices``."""
    widths = list(SCALE_SET) if widths is None else widths
    return [dict(strategies=SCALE_CANDIDATES, datasets=["teacher"], d_s=[SCALE_SET[d][1]], d_e=[d],
                 b=[SCALE_SET[d][0]], d_k=[SCALE_SET[d][2]], p=[SCALE_SET[d][3]], seeds=[0], devices=devices,
                 n_batches=1, warmup_steps=20, **kw) for d in widths]


#: Candidates on the real pretrained model: the scale set's, and the formulas and joint as references.
PRETRAINED_STRATEGIES = [*SCALE_CANDIDATES, "formula1", "formula2", "joint"]
#: A cheaper set for the quick sweep (joint's CG alone takes 10-15 s per run there).
QUICK_PRETRAINED_STRATEGIES = ["default", "gram/solve/full+metric/fast:quadratic",
                               "gram/solve/rsvd+metric/fast:quadratic", "gram/solve/rsvd+metric/normal:bracket",
                               "formula1", "formula2"]
#: Heads of all-MiniLM-L6-v2 (layer, head) in the quick sweep: an early and a late one. The contrastive
#: task uses the last: a late layer reruns fewer layers per loss call.
QUICK_HEADS = [(1, 3), (4, 7)]
#: Every layer, two heads each, for the full and gpu sweeps.
ALL_HEADS = [(layer, head) for layer in range(6) for head in (layer % 12, (layer + 6) % 12)]


def pretrained_grids(heads: list[tuple[int, int]], devices: list[str], strategy_list: list[str],
                     seeds: list[int], **kw) -> list[dict]:
    """Head recovery at every ``(layer, head)`` and the contrastive objective at the last one.

    Both at d_e = 384 (the model's width), 8 windows of 32 tokens per batch, rank 8 grown by 8.
    Recovery starts from the best rank-8 factors (no warm-up); the contrastive task trains
    the narrowed head for 20 steps first.
    """
    sizes = dict(d_s=[32], d_e=[384], b=[8], d_k=[8], p=[8], seeds=seeds, devices=devices, n_batches=2, **kw)
    recovery = [f"minilm-recovery:layer={layer}:head={head}" for layer, head in heads]
    similarity = [f"minilm-similarity:layer={heads[-1][0]}:head={heads[-1][1]}"]
    return [dict(strategies=strategy_list, datasets=recovery, warmup_steps=0, **sizes),
            dict(strategies=strategy_list, datasets=similarity, warmup_steps=20, **sizes)]


def statistics_tokens_grid(devices: list[str], n_batches: list[int], **kw) -> list[dict]:
    """Held-out decrease against the number of statistics tokens (n_batches · 8 · 32) at d_e = 384,
    where ``d_e² = 147 456`` entries of ``P`` are fitted: one late head, the default and formula 1."""
    return [dict(strategies=["default", "formula1", "gram/solve/rsvd+metric/normal:bracket"],
                 datasets=["minilm-recovery:layer=4:head=7"], d_s=[32], d_e=[384], b=[8], d_k=[8], p=[8],
                 seeds=[0], devices=devices, n_batches=n, warmup_steps=0, **kw) for n in n_batches]


def sweep_presets() -> dict[str, list[dict]]:
    """Named sweeps: each a list of grids (dicts of lists) whose products are unioned."""
    default = strategies.default_spec()
    ablation = _PRESET_STRATEGIES + one_axis_variants(default)
    scaling = ["formula1", "formula2", "joint", "default"]

    def scaling_grids(base: dict, axes: dict, **kw) -> list[dict]:
        return [dict(strategies=scaling, datasets=["teacher"], **{**base, axis: values}, **kw)
                for axis, values in axes.items()]

    quick = [dict(strategies=ablation, datasets=[name], **sizes, seeds=[0, 1], devices=["cpu"], n_batches=4,
                  repeats=3, warmup_steps=300) for name, sizes in QUICK_SIZES.items()]
    return {
        "smoke": [dict(strategies=_PRESET_STRATEGIES, datasets=list(DATASET_NAMES), d_s=[16], d_e=[16], b=[16],
                       d_k=[2], p=[2], seeds=[0], devices=["cpu"], n_batches=2, repeats=1, warmup_steps=30)],
        # The quick ablation on one GPU, plus the scale set up to d_e = 4096.
        "gpu": [*({**g, "devices": ["cuda"]} for g in quick), *scale_grids(["cuda"], repeats=5),
                *pretrained_grids(ALL_HEADS, ["cuda"], PRETRAINED_STRATEGIES, [0], repeats=5),
                *statistics_tokens_grid(["cuda"], [1, 4, 16, 64], repeats=5)],
        "quick": [
            *quick,
            *scaling_grids(dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
                           {"d_e": [16, 64, 128], "d_s": [8, 64, 128], "b": [16, 128, 256]},
                           seeds=[0], devices=["cpu"], n_batches=2, repeats=3, warmup_steps=300),
            *pretrained_grids(QUICK_HEADS, ["cpu"], QUICK_PRETRAINED_STRATEGIES, [0], repeats=3),
        ],
        "full": [
            dict(strategies=strategies.specs(), datasets=list(DATASET_NAMES), d_s=[64], d_e=[64], b=[256], d_k=[8],
                 p=[8], seeds=[0, 1, 2], devices=["cpu", "cuda"], n_batches=4, repeats=5, warmup_steps=1000),
            *scaling_grids(dict(d_s=[128], d_e=[64], b=[256], d_k=[8], p=[8]),
                           {"d_e": [32, 128, 256, 512], "d_s": [32, 256, 512], "b": [64, 512, 1024]},
                           seeds=[0, 1, 2], devices=["cpu", "cuda"], n_batches=4, repeats=5, warmup_steps=1000),
            *pretrained_grids(ALL_HEADS, ["cpu", "cuda"], ablation, [0, 1, 2], repeats=5),
            *statistics_tokens_grid(["cpu", "cuda"], [1, 4, 16, 64], repeats=5),
        ],
    }


def expand(grids: Iterable[dict]) -> list[RunConfig]:
    """Configurations of the union of the grids' products, without duplicates, in a stable order.

    Strategy names are canonicalised (presets become their specs) and validated;
    unknown datasets are rejected with the valid list, and every configuration is
    checked on construction (:func:`harness.validate.check_run_config`).

    Raises
    ------
    harness.validate.ConfigError
        An unknown key, a missing or empty axis, an unknown strategy or dataset, or a
        configuration that cannot run; the field at fault is its ``field``.
    """
    scalar_fields = {f.name for f in fields(RunConfig)} - {"strategy", "dataset", *SIZE_AXES, "seed", "device"}
    out: dict[RunConfig, None] = {}
    for grid in grids:
        unknown = set(grid) - set(LIST_AXES) - scalar_fields
        if unknown:
            raise ValueError(f"unknown sweep keys {sorted(unknown)}; valid: {sorted(set(LIST_AXES) | scalar_fields)}")
        for axis in LIST_AXES:
            if not grid.get(axis):  # an empty axis would make an empty product: a sweep of nothing
                raise ConfigError(_AXIS_FIELDS.get(axis, axis), f"the sweep's {axis} list is empty or missing")
        for d in grid["datasets"]:
            dataset_class(d)
        specs = []
        for s in grid["strategies"]:
            try:
                specs.append(strategies.canonical(s))
            except ValueError as e:
                raise ConfigError("strategy", str(e)) from None
        scalars = {k: grid[k] for k in scalar_fields if k in grid}
        for dataset, d_s, d_e, b, d_k, p, seed, device, spec in itertools.product(
            grid["datasets"], grid["d_s"], grid["d_e"], grid["b"], grid["d_k"], grid["p"], grid["seeds"],
            grid["devices"], specs,
        ):
            out[RunConfig(strategy=spec, dataset=dataset, d_s=d_s, d_e=d_e, b=b, d_k=d_k, p=p, seed=seed,
                          device=device, **scalars)] = None
    return list(out)


def _results(configs: list[RunConfig], jobs: int, backend: str, scheduler: str | None,
             cache_dir: str | None, threads: int) -> Iterator[dict]:
    """Rows as runs finish, in completion order."""
    todo = [c.as_dict() for c in configs]
    if backend == "dask":
        from distributed import Client, as_completed

        client = Client(scheduler) if scheduler else Client(processes=False)
        try:
            futures = client.map(run_one, todo, cache_dir=cache_dir, threads=threads, pure=False)
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.close()
        return
    if backend != "joblib":
        raise ValueError(f"unknown backend {backend!r}; valid: joblib, dask")
    yield from in_workers(run_one, todo, jobs, cache_dir, threads=threads)


def in_workers(fn: Callable, todo: list[dict], jobs: int, *args, threads: int = DEFAULT_THREADS) -> Iterator[dict]:
    """``fn(config, *args, threads)`` for each config, here (``jobs == 1``) or in joblib processes; rows as they
    finish.

    ``threads`` is the torch thread count of each run, in this process or in each
    worker: one by default, since at these sizes a worker's extra threads only fight
    the other workers (and other users of the machine) for the same cores.
    """
    if jobs == 1:
        for c in todo:
            yield fn(c, *args, threads)
        return
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=jobs, return_as="generator_unordered")(
        delayed(in_orphan_safe_worker)(fn, c, *args, threads) for c in todo)


#: Seconds between a worker's checks that its parent is alive.
ORPHAN_POLL_S = 0.5


def in_orphan_safe_worker(fn: Callable, *args):
    """``fn(*args)`` in a joblib worker that exits as soon as its parent process is gone.

    joblib's workers wait for their next task long after a SIGKILLed parent (88 s and
    more were seen), holding memory and cores. A daemon thread, started once per worker
    process, polls the parent's pid and ends the worker when it changes (the orphan is
    re-parented). A polling thread rather than ``prctl(PR_SET_PDEATHSIG)``: that signal
    follows the *thread* that spawned the worker, which in joblib is not the main one.
    """
    global _watched_parent
    if _watched_parent is None:
        _watched_parent = os.getppid()
        threading.Thread(target=_exit_when_orphaned, args=(_watched_parent,), daemon=True,
                         name="growbench-orphan-watch").start()
    return fn(*args)


_watched_parent: int | None = None


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(1)  # no cleanup: the parent that would read our results is gone


def pending(configs: list, db, resume: bool, retry_failed: bool, what: str = "runs") -> tuple[list, list, str]:
    """``(configs, todo, code_version)``: cuda configurations dropped (with a message) when no GPU is
    available, and, with ``resume``, those whose key is already in ``db`` (failures too, unless
    ``retry_failed``) left out of ``todo``."""
    cuda_ok = torch.cuda.is_available()
    skipped = [c for c in configs if torch.device(c.device).type == "cuda" and not cuda_ok]
    if skipped:
        print(f"skipping {len(skipped)} cuda runs: torch.cuda.is_available() is False", file=sys.stderr)
    configs = [c for c in configs if c not in skipped]
    version = code_version()
    done = (db.keys("ok") if retry_failed else db.keys()) if resume else set()
    todo = [c for c in configs if c.key(version) not in done]
    if len(todo) < len(configs):
        print(f"resuming: {len(configs) - len(todo)} of {len(configs)} {what} already stored", file=sys.stderr)
    return configs, todo, version


def run_sweep(
    configs: list[RunConfig],
    db_path: str = DEFAULT_DB,
    *,
    jobs: int = 1,
    backend: str = "joblib",
    scheduler: str | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    cache_dir: str | None = DEFAULT_CACHE,
    progress: bool = True,
    threads: int = DEFAULT_THREADS,
    max_memory: float | None = None,
) -> pd.DataFrame:
    """Run every configuration not already stored; return the rows of this sweep's configurations.

    Every configuration is checked first (:func:`harness.validate.check_runs`): nothing
    runs and nothing is written when one cannot run. Runs on a device that is not
    present are skipped with a message (:func:`pending`), unless no run is left.

    Parameters
    ----------
    configs : list of RunConfig
    db_path : str
        SQLite file (created if missing).
    jobs : int
        Parallel workers for the joblib backend.
    backend : {"joblib", "dask"}
    scheduler : str, optional
        Address of an existing Dask scheduler (``tcp://host:8786``); default a local in-process cluster.
    resume : bool
        Skip configurations whose key (configuration + code version) is already stored.
    retry_failed : bool
        With ``resume``, run stored failures again.
    threads : int
        torch threads per run (in this process with ``jobs == 1``, in each worker otherwise).
    max_memory : float, optional
        Memory limit in GiB for one run (times ``jobs`` on CPU); default a share of the device's memory.

    Raises
    ------
    harness.validate.ConfigError
        A configuration that cannot run, ``jobs < 1`` or ``threads < 1``.
    """
    check_jobs(jobs)
    check_threads(threads)
    check_runs(configs, jobs=jobs, max_memory=max_memory, strict_devices=False)
    with ResultsDB(db_path) as db:
        configs, todo, version = pending(configs, db, resume, retry_failed)
        store_as_finished(db, _results(todo, jobs, backend, scheduler, cache_dir, threads), len(todo), progress)
        keys = {c.key(version) for c in configs}
        frame = db.frame()
    return frame[frame.key.isin(keys)].reset_index(drop=True)


def store_as_finished(db, rows: Iterable[dict], total: int, progress: bool = True) -> int:
    """Write each row to ``db`` as it arrives (one commit per run), with a progress bar; return the failures."""
    bar = tqdm(total=total, disable=not progress, unit="run", dynamic_ncols=True)
    failed = 0
    try:
        for row in rows:
            db.write(row)
            failed += row["status"] != "ok"
            bar.set_postfix(failed=failed, refresh=False)
            bar.update()
    finally:
        bar.close()
    return failed


def preset_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """The one-screen table: the presets only, per dataset and device, with the preset's name."""
    table = summary(frame)
    if table.empty:
        return table
    names = {spec: name for name, spec in strategies.presets().items()}
    table = table[table.strategy.isin(names)].copy()
    table.insert(2, "preset", table.strategy.map(names))
    return table.drop(columns=["strategy"])


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per dataset × device × strategy: median time per phase (ms), quality, failures."""
    if frame.empty:
        return frame
    keys = ["dataset", "device", "strategy"]
    ok = frame[frame.status == "ok"].copy()
    ok["x_floor"] = ok.t_total / ok.t_floor
    cols = ["t_statistics", "t_direction", "t_truncation", "t_line_search", "t_total", "t_floor"]
    g = ok.groupby(keys, sort=True)
    out = (g[cols].median() * 1e3).rename(columns=lambda c: c[2:] + "_ms")
    for col in ("x_floor", "optimality", "heldout_decrease", "n_loss_evals"):
        out[col] = g[col].median()
    out["runs"] = g.size()
    # Strategies whose runs all failed still get a line.
    every = frame.groupby(keys, sort=True).size().index
    out = out.reindex(every)
    out["runs"] = out["runs"].fillna(0).astype(int)
    out["failed"] = frame[frame.status != "ok"].groupby(keys).size().reindex(every).fillna(0).astype(int)
    return out.reset_index()
