"""The runner core: a sweep's pending runs, the workers that run them, each stored as it finishes.

Runs are done in workers (in-process, joblib processes or a Dask cluster) and written
by this process only, one committed row (or run) per finished run, so that a killed
sweep keeps everything it finished and resumes from there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import pandas as pd
import torch
from joblib import Parallel, delayed
from tqdm.auto import tqdm

from harness.env import DEFAULT_THREADS, code_version
from harness.plugins import import_modules
from harness.store.base import RunStore
from strategies.registry import outside_modules

#: ``run(config, threads=n) -> row``: one run of a configuration (as a dict) in a worker; never raises.
RunFunction = Callable[..., dict]
BACKENDS = ("joblib", "dask")


def run_pending(db: RunStore, configs: list, run: RunFunction, *, jobs: int = 1, threads: int = DEFAULT_THREADS,
                resume: bool = False, retry_failed: bool = False, progress: bool = True, backend: str = "joblib",
                scheduler: str | None = None, what: str = "runs") -> pd.DataFrame:
    """Run what :func:`pending` leaves to do, store each run in ``db`` as it finishes; return this sweep's rows.

    Parameters
    ----------
    db : RunStore
        The open store the runs are written to.
    configs : list of KeyedConfig
    run : RunFunction
        Called as ``run(config.as_dict(), threads=threads)`` in a worker.
    jobs, threads : int
        Workers, and torch threads per run (see :func:`in_workers`).
    resume, retry_failed : bool
        See :func:`pending`.
    progress : bool
        Show a progress bar.
    backend : {"joblib", "dask"}
    scheduler : str, optional
        Address of an existing Dask scheduler; default a local in-process cluster.
    what : str
        What the runs are called in messages.

    Returns
    -------
    pandas.DataFrame
        The stored rows of this sweep's configurations (those run now and those resumed), those
        skipped for an absent device left out.
    """
    configs, todo, version = pending(configs, db, resume, retry_failed, what)
    rows = finished(run, [c.as_dict() for c in todo], jobs, threads, backend, scheduler)
    store_as_finished(db, rows, len(todo), progress)
    keys = {c.key(version) for c in configs}
    frame = db.frame()
    return frame[frame.key.isin(keys)].reset_index(drop=True)


def pending(configs: list, db: RunStore, resume: bool, retry_failed: bool,
            what: str = "runs") -> tuple[list, list, str]:
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


def finished(run: RunFunction, todo: list[dict], jobs: int, threads: int, backend: str = "joblib",
             scheduler: str | None = None) -> Iterator[dict]:
    """Rows of ``run`` over ``todo`` with ``backend``, in completion order.

    Raises
    ------
    ValueError
        An unknown ``backend`` (when the first row is asked for).
    """
    if backend == "dask":
        yield from in_dask(run, todo, threads, scheduler)
    elif backend == "joblib":
        yield from in_workers(run, todo, jobs, threads)
    else:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def in_dask(run: RunFunction, todo: list[dict], threads: int, scheduler: str | None = None) -> Iterator[dict]:
    """``run`` over ``todo`` on a Dask cluster (``scheduler``'s, or a local in-process one); rows as they finish."""
    # Dask is an optional extra (growbench[dask]): imported only when asked for.
    from distributed import Client, as_completed

    client = Client(scheduler) if scheduler else Client(processes=False)
    try:
        for fut in as_completed(client.map(with_plugins(run), todo, threads=threads, pure=False)):
            yield fut.result()
    finally:
        client.close()


def in_workers(run: RunFunction, todo: list[dict], jobs: int, threads: int = DEFAULT_THREADS) -> Iterator[dict]:
    """``run(config, threads=threads)`` for each config, here (``jobs == 1``) or in joblib processes; rows as they
    finish.

    ``threads`` is the torch thread count of each run, in this process or in each
    worker: one by default, since at these sizes a worker's extra threads only fight
    the other workers (and other users of the machine) for the same cores.
    """
    if jobs == 1:
        for c in todo:
            yield run(c, threads=threads)
        return
    worker_run = with_plugins(run)
    yield from Parallel(n_jobs=jobs, return_as="generator_unordered")(
        delayed(in_orphan_safe_worker)(worker_run, c, threads=threads) for c in todo)


def with_plugins(run: RunFunction) -> RunFunction:
    """``run``, first importing in its worker the modules that registered outside components here.

    A worker process starts with the built-in registry only: a component registered from
    outside the repository (:mod:`harness.plugins`) must be registered there too, or its
    spec would be unknown in the worker.
    """
    return partial(_run_with_plugins, run, tuple(outside_modules()))


def _run_with_plugins(run: RunFunction, modules: tuple[str, ...], config: dict, **kwargs) -> dict:
    # The parent's list already holds every plugin module that registered a component: importing it
    # (a dict lookup after the first run) is enough, without scanning entry points on every run.
    import_modules(modules)
    return run(config, **kwargs)


#: Seconds between a worker's checks that its parent is alive.
ORPHAN_POLL_S = 0.5


def in_orphan_safe_worker(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a joblib worker that exits as soon as its parent process is gone.

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
    return fn(*args, **kwargs)


_watched_parent: int | None = None


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(1)  # no cleanup: the parent that would read our results is gone


def store_as_finished(db: RunStore, rows: Iterable[dict], total: int, progress: bool = True) -> int:
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
