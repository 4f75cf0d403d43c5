"""The runner core: a sweep's pending runs, the workers that run them, each stored as it finishes.

Runs are done in workers (in-process, local worker processes or a Dask cluster) and written
by this process only, one committed row (or run) per finished run, so that a killed
sweep keeps everything it finished and resumes from there.

A run that kills its worker process (a segfault, the out-of-memory killer) or outlives
``run_timeout`` becomes a ``failed`` row naming it, written here like any other failure:
the other runs go on, and ``resume`` skips it unless asked to retry failures. A run done in
this process (``jobs == 1``) that calls ``sys.exit`` or ``os._exit`` is stopped there and
fails the same way (:func:`in_this_process`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import BrokenExecutor, TimeoutError, as_completed
from functools import partial
from typing import Any

import pandas as pd
import torch
from pebble import ProcessExpired, ProcessPool

from growbench.harness.allocator import keep_freed_memory
from growbench.harness.env import (
    DEFAULT_THREADS,
    code_version,
    config_key,
    environment,
    exit_message,
    exits_contained,
    now,
    pin_code_version,
)
from growbench.harness.locks import waited
from growbench.harness.plugins import import_modules
from growbench.harness.runner.cost import cost_class
from growbench.harness.runner.progress import Bar, Estimate
from growbench.harness.store.base import RunStore
from growbench.harness.validate import ConfigError, check_float
from growbench.strategies.registry import outside_modules

#: ``run(config, threads=n) -> row``: one run of a configuration (as a dict) in a worker; never raises.
RunFunction = Callable[..., dict]
#: ``cost(config) -> float``: a run's expected cost relative to the others' (any positive unit).
CostFunction = Callable[[dict], float]
#: "joblib" is the local worker processes' backend (the name is kept from when joblib ran them).
BACKENDS = ("joblib", "dask")
#: Fresh pools tried in a row that end without finishing any run before the sweep gives up (workers that
#: cannot even start would otherwise be restarted for ever).
POOL_ATTEMPTS = 3


def run_pending(db: RunStore, configs: list, run: RunFunction, *, jobs: int = 1, threads: int = DEFAULT_THREADS,
                resume: bool = False, retry_failed: bool = False, progress: bool = True, backend: str = "joblib",
                scheduler: str | None = None, what: str = "runs", run_timeout: float | None = None,
                cost: CostFunction | None = None, group: Callable[[dict], Hashable] | None = None) -> pd.DataFrame:
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
        Local worker processes, or a Dask cluster.
    scheduler : str, optional
        Address of an existing Dask scheduler; default a local in-process cluster.
    what : str
        What the runs are called in messages.
    run_timeout : float, optional
        Seconds a run may take, from when a worker starts it, before the worker is stopped and the run
        stored as failed; default no limit. Runs then go to worker processes even with ``jobs == 1``
        (a run in this process cannot be stopped).
    cost : CostFunction, optional
        Each run's prior cost, which the progress bar's estimate of the time left calibrates by the
        runs that finish, per dataset (:class:`harness.runner.progress.Estimate`; e.g.
        :func:`harness.runner.cost.sweep_cost`); default every run costs the same.
    group : callable, optional
        ``group(config)``: runs that share work their group's first run does for the others (a sweep's
        site, :func:`harness.runner.sweep.site_of`); the estimate calibrates first runs apart. Default none.

    Returns
    -------
    pandas.DataFrame
        The stored rows of this sweep's configurations (those run now and those resumed), those
        skipped for an absent device left out.

    Raises
    ------
    harness.validate.ConfigError
        ``run_timeout`` is not a positive finite number, or is given with the Dask backend.
    ChildProcessError
        The worker processes cannot start (:func:`in_processes`).
    """
    run_timeout = check_run_timeout(run_timeout, backend)
    configs, todo, version = pending(configs, db, resume, retry_failed, what)
    todo = [c.as_dict() for c in todo]
    cost = cost or _same_cost
    # Runs go to the workers in this order, first in, first out: the estimate's model of when each starts.
    workers = jobs if backend == "joblib" else (jobs if scheduler else os.cpu_count() or 1)
    estimate = Estimate([cost(c) for c in todo], [cost_class(c) for c in todo], workers,
                        groups=[group(c) for c in todo] if group else None)
    order = {config_key(c, version): i for i, c in enumerate(todo)}
    rows = finished(run, todo, jobs, threads, backend, scheduler, run_timeout)
    try:
        store_as_finished(db, rows, estimate, order, progress, what)
    finally:
        rows.close()  # an interrupted sweep stops its workers now, not when the generator is collected
    keys = {c.key(version) for c in configs}
    frame = db.frame()
    return frame[frame.key.isin(keys)].reset_index(drop=True)


def check_run_timeout(run_timeout: Any, backend: str = "joblib") -> float | None:
    """``run_timeout`` as a positive finite number of seconds, or None (no limit).

    Raises
    ------
    harness.validate.ConfigError
        Not a positive finite number, or given with the Dask backend, whose threads cannot be stopped.
    """
    if run_timeout is None:
        return None
    seconds = check_float("run_timeout", run_timeout, 0)
    if seconds == 0:
        raise ConfigError("run_timeout", f"run_timeout must be a finite number > 0, got {run_timeout!r}")
    if backend == "dask":
        raise ConfigError("run_timeout", "a run timeout needs the local worker processes (backend joblib): "
                                         "a Dask worker cannot stop a run")
    return seconds


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
             scheduler: str | None = None, run_timeout: float | None = None) -> Iterator[dict]:
    """Rows of ``run`` over ``todo`` with ``backend``, in completion order.

    Raises
    ------
    ValueError
        An unknown ``backend`` (when the first row is asked for).
    """
    if backend == "dask":
        yield from in_dask(run, todo, threads, scheduler)
    elif backend == "joblib":
        yield from in_workers(run, todo, jobs, threads, run_timeout)
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


def in_workers(run: RunFunction, todo: list[dict], jobs: int, threads: int = DEFAULT_THREADS,
               run_timeout: float | None = None) -> Iterator[dict]:
    """``run(config, threads=threads)`` for each config, here or in worker processes; rows as they finish.

    Here when ``jobs == 1`` and there is no ``run_timeout`` (:func:`in_this_process`: a run
    that calls ``sys.exit`` or ``os._exit`` fails, one that crashes this process ends the
    sweep); otherwise in ``jobs`` worker processes (:func:`in_processes`), where a run that
    kills its worker or outlives ``run_timeout`` becomes a failed row. In this process, a
    debugger, a profiler and a test's patches reach the runs, and no worker starts.
    ``threads`` is the torch thread count of each run, in this process or in each worker:
    one by default, since at these sizes a worker's extra threads only fight the other
    workers (and other users of the machine) for the same cores.
    """
    if jobs == 1 and run_timeout is None:
        for c in todo:
            yield in_this_process(run, c, threads)
        return
    yield from in_processes(run, todo, jobs, threads, run_timeout)


def in_this_process(run: RunFunction, config: dict, threads: int) -> dict:
    """``run(config, threads=threads)`` here; a run that tries to end this process is stopped and fails instead.

    ``sys.exit`` and ``os._exit`` in a run (:func:`harness.env.exits_contained`) would end the sweep
    without a word and with the run's exit status; they become the run's failed row, naming it, and
    the sweep goes on. A crash of the process itself (a segfault) cannot be caught here: worker
    processes (``--jobs 2``, or ``--run-timeout``) survive that too.
    """
    start = time.perf_counter(), waited()
    try:
        with exits_contained():
            row = run(config, threads=threads)
    except SystemExit as e:  # a run function that does not record its own failures (harness.env.recorded does)
        row = lost_row(config, f"{exit_message(e)} ({describe(config)})", threads)
    return timed(row, start)


#: The key of a row that holds the seconds its run took in its worker: for the progress bar, not stored (the store
#: writes its table's columns only).
SECONDS = "_seconds"


def timed(row: dict, start: tuple[float, float]) -> dict:
    """``row`` with the seconds its run took under :data:`SECONDS`.

    ``start`` is ``(time.perf_counter(), harness.locks.waited())`` when the run started: the seconds
    it waited for a site's lock are left out, since another run was doing that work (the bar counts
    the time workers spend waiting apart, :class:`harness.runner.progress.Estimate`).
    """
    if isinstance(row, dict):
        row[SECONDS] = max(0.0, time.perf_counter() - start[0] - (waited() - start[1]))
    return row


def in_processes(run: RunFunction, todo: list[dict], jobs: int, threads: int = DEFAULT_THREADS,
                 run_timeout: float | None = None) -> Iterator[dict]:
    """``run`` over ``todo`` in ``jobs`` worker processes (pebble); rows as they finish, one for every config.

    A worker that dies (a signal, an exit) or is stopped after ``run_timeout`` seconds gives
    its run a failed row (:func:`lost_row`) and is replaced; the other runs go on. A pool that
    breaks (a worker dying while no run is under way, which pebble cannot attribute) is
    replaced, and the runs it had not finished are run again in the new one.

    Workers are forked from a server process (:func:`worker_context`), not from this one: a
    fork of this process would copy its threads' locks (the pool's own threads, tqdm's,
    torch's) in whatever state they are in. They exit as soon as this process is gone
    (:func:`watch_parent`), and keep freed memory as the ``growbench`` command does (:func:`start_worker`).

    Raises
    ------
    ChildProcessError
        :data:`POOL_ATTEMPTS` fresh pools in a row broke before finishing a run: the workers cannot start.
    """
    worker_run = with_plugins(run)
    left, attempts = list(todo), 0
    while left:
        pool = ProcessPool(max_workers=min(jobs, len(left)), initializer=start_worker, context=worker_context())
        lost, broken = [], None
        try:
            futures = {pool.schedule(worker_run, args=(c,), kwargs={"threads": threads}, timeout=run_timeout): c
                       for c in left}
            for future in as_completed(futures):
                config, error = futures[future], future.exception()
                if isinstance(error, BrokenExecutor):
                    lost.append(config)
                    broken = error
                    continue
                attempts = 0
                yield future.result() if error is None else lost_row(config, _why(error, config, run_timeout),
                                                                     threads)
        finally:
            pool.stop()
            pool.join()
        attempts += bool(lost)
        if attempts >= POOL_ATTEMPTS:
            raise ChildProcessError(f"worker processes broke {attempts} times without finishing a run "
                                    f"({len(lost)} runs not run): {broken}")
        left = lost


def _why(error: BaseException, config: dict, run_timeout: float | None) -> str:
    """The error text of a run whose worker did not return its row."""
    if isinstance(error, TimeoutError):
        return f"timed out after {run_timeout:g} s: its worker was stopped ({describe(config)})"
    if isinstance(error, ProcessExpired):
        code = error.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:  # a real-time signal has a number only
                name = f"signal {-code}"
            # SIGKILL is what the out-of-memory killer sends: say so, it is the likely cause.
            hint = " (the out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            how = f"killed by {name}{hint}"
        else:
            how = f"exited with code {code}"
        return f"worker process died running {describe(config)}: {how}"
    return f"{type(error).__name__}: {error}"


def lost_row(config: dict, error: str, threads: int) -> dict:
    """The failed row of a run whose worker did not return one: its configuration, key, environment and ``error``.

    The key is the one the worker's own row would have had, so that ``resume`` skips the run
    (and ``retry_failed`` reruns it) like any other failure.
    """
    version = code_version()
    return {**config, **environment(config.get("device", "cpu")), "threads": threads,
            "key": config_key(config, version), "started_at": None, "finished_at": now(), "status": "failed",
            "error": error}


def describe(config: dict, width: int = 32) -> str:
    """A short name of a run: its dataset, strategy (or training method) and seed, each cut to ``width``."""
    def cut(text: Any) -> str:
        text = str(text)
        return text if len(text) <= width else text[: width - 1] + "…"

    parts = [cut(config[k]) for k in ("dataset", "strategy", "method") if config.get(k) is not None]
    if config.get("seed") is not None:
        parts.append(f"seed {config['seed']}")
    return " ".join(parts)


def with_plugins(run: RunFunction) -> RunFunction:
    """``run``, first importing in its worker the modules that registered outside components here, and taking
    this sweep's code version there.

    A worker process starts with the built-in registry only: a component registered from
    outside the repository (:mod:`harness.plugins`) must be registered there too, or its
    spec would be unknown in the worker. It would also read the source files again for its
    rows' code version, later than the sweep did (:func:`harness.env.pin_code_version`).
    """
    return partial(_run_with_plugins, run, tuple(outside_modules()), code_version())


def _run_with_plugins(run: RunFunction, modules: tuple[str, ...], version: str, config: dict, **kwargs) -> dict:
    # The parent's list already holds every plugin module that registered a component: importing it
    # (a dict lookup after the first run) is enough, without scanning entry points on every run.
    import_modules(modules)
    # The sweep's code version, not one read from the files now: its rows' keys must be the ones it resumes by.
    pin_code_version(version)
    # The run's own seconds, measured here: what the sweep sees between two rows also holds the workers' start.
    start = time.perf_counter(), waited()
    return timed(run(config, **kwargs), start)


#: Modules the server of worker processes imports once, so that a worker (a fork of it) starts without
#: importing torch and the project again: seconds per worker, and again for each one replaced.
PRELOAD = ("growbench.harness.runner.pool", "growbench.harness.measure", "growbench.harness.train")


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the worker processes: ``forkserver`` (with :data:`PRELOAD`), else ``spawn``.

    The server is a fresh single-threaded process, started once by the first pool of this
    process; it exits when this process does, and so do its workers (:func:`watch_parent`).
    Run functions are sent to workers by reference: they must be importable (module-level).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # no effect once the server runs: it has them already
    return context


#: Seconds between a worker's checks that its parent is alive.
ORPHAN_POLL_S = 0.5


def start_worker() -> None:
    """A worker process's first act: the allocator setting of the ``growbench`` command
    (:func:`harness.allocator.keep_freed_memory`: the worker's growths and floors are timed like those of a
    ``--jobs 1`` sweep), then :func:`watch_parent`."""
    keep_freed_memory()
    watch_parent()


def watch_parent() -> None:
    """Start, in a worker process, a daemon thread that ends the worker as soon as its parent is gone.

    A worker busy with a long run would otherwise finish it (minutes, holding memory and
    cores) after a SIGKILLed sweep, which can no longer store it. The parent is the sweep's
    process, or the server it forks workers from, which exits with it. The thread polls
    the parent's pid and exits when it changes (the orphan is re-parented). A polling
    thread rather than ``prctl(PR_SET_PDEATHSIG)``: that signal follows the *thread* that
    started the worker, which is not the main one.
    """
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True,
                     name="growbench-orphan-watch").start()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(1)  # no cleanup: the parent that would read our results is gone


def _same_cost(config: dict) -> float:
    return 1.0


def store_as_finished(db: RunStore, rows: Iterable[dict], estimate: Estimate, order: dict[str, int],
                      progress: bool = True, what: str = "runs") -> int:
    """Write each row to ``db`` as it arrives (one commit per run), with a progress bar; return the failures.

    Parameters
    ----------
    db : RunStore
    rows : iterable of dict
        Rows in the order the runs finish.
    estimate : Estimate
        The runs' prior costs in the order they were given to the workers; told of each run as it finishes.
    order : dict
        ``{key: position in that order}``: which run a row is.
    progress : bool
        Show the bar (:class:`harness.runner.progress.Bar`): the share of the expected time done, the
        runs done and failed, the time elapsed and left, and the run that just finished.
    what : str
        What the runs are called on the bar.
    """
    bar = Bar(estimate, progress, what)
    try:
        for row in rows:
            db.write(row)
            # A row of an unknown key (a run function's own) is taken for the oldest run in flight.
            i = order.get(row.get("key"), min(estimate.running, default=-1))
            bar.finish(i, row.get("status") == "ok", describe(row), row.get(SECONDS))
    finally:
        bar.close()
    return bar.failed
