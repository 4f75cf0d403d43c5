"""A lock that saves work, never one that waits for ever: a waiter says what it waits for, and passes a stuck holder.

Runs of one site (:func:`harness.measure.site_key`) in several worker processes share the
site's trained model and reference projection through the cache: the first run builds them
under the site's lock file, and the others wait for it, then read them. That lock saves
time and decides nothing (cache files are written whole, :mod:`datasets.cache`), so a run
that cannot get it in reasonable time may go on without it and only repeat the work.

:func:`work_lock`:

- holds an exclusive ``flock`` on the file; a holder that dies releases it (the kernel does),
  so a dead holder never blocks anyone;
- while held, writes the holder's pid and host into the file and touches it every
  :data:`HEARTBEAT_S` seconds (a thread), its sign of life;
- a waiter that has waited :data:`NOTICE_S` seconds (a site's first run takes seconds, and two
  workers meet at one in every sweep) prints one line naming the file and its holder's pid
  (from ``/proc/locks`` where there is one, else the pid the holder wrote), and polls on;
- it goes on without the lock, saying so in one line, once the holder has shown no sign of
  life for :data:`STALE_S` seconds (a process that is stopped, or not growbench's), or after
  :data:`MAX_WAIT_S` seconds in all (a growbench holder that hangs with its heartbeat alive).

The clock and the sleep are arguments, so that tests run the waits on a simulated clock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: Seconds between a holder's signs of life (touching the lock file).
HEARTBEAT_S = 5.0
#: Seconds without a sign of life after which the holder is taken for stuck.
STALE_S = 60.0
#: Seconds a waiter waits in all, whatever the holder shows: a first run of a site takes seconds to two
#: minutes (the real model's contrastive task on a busy 2-core machine); past this, repeating it is cheaper.
MAX_WAIT_S = 600.0
#: Seconds between a waiter's tries.
POLL_S = 0.5
#: Seconds a waiter gives a holder that has just taken the lock to write its pid and touch the file.
GRACE_S = 2.0
#: Seconds a waiter waits before it says so: waiting for a site's first run is the lock's ordinary work (a few
#: seconds, in every sweep with two workers), a wait this long is worth a line.
NOTICE_S = 15.0

#: Seconds this process has waited for locks in all (a one-element list: a module-level counter). A run's own time
#: leaves them out (:func:`waited`): the progress bar learns how long runs take, not how long they queued.
_WAITED = [0.0]

#: Lock files found held by a stuck holder in this process: ``{path: (inode, mtime)}``. A later wait on the
#: same file, unchanged since, goes on at once instead of waiting again (a site has tens of runs).
_PASSED: dict[str, tuple[int, float]] = {}


def waited() -> float:
    """Seconds this process has waited for locks so far (wall clock)."""
    return _WAITED[0]


def _say(line: str) -> None:
    # On a terminal the progress bar's line has no end yet: erase it (the bar draws itself again on its next run).
    start = "\r\x1b[K" if sys.stderr.isatty() else ""
    print(start + line, file=sys.stderr, flush=True)


def holder_pid(path: Path) -> int | None:
    """The pid of the process of this machine holding an ``flock`` on ``path``, or None when unknown.

    Read from ``/proc/locks`` (Linux; it lists the holder of every lock by device and inode),
    else from the pid and host a growbench holder writes in the file (another machine's pid,
    over a network file system, is not one this machine can look at: None).
    """
    with contextlib.suppress(OSError, ValueError):
        st = os.stat(path)
        where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a blocked waiter's line has "->" after the number.
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where:
                return int(fields[4])
    with contextlib.suppress(OSError, ValueError):
        pid, host = Path(path).read_text().split()[:2]
        if host == socket.gethostname():
            return int(pid)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _try_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _heartbeat(path: Path, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        with contextlib.suppress(OSError):
            os.utime(path)


def wait_for(handle, path: Path, what: str, *, clock: Callable[[], float] = time.time,
             sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = _say,
             stale_s: float = STALE_S, max_wait_s: float = MAX_WAIT_S) -> bool:
    """Take the lock of ``handle`` (open on ``path``), waiting as the module docstring says; False: going on without.

    Parameters
    ----------
    handle : file
        Open on ``path``.
    path : Path
        The lock file (named in the lines printed).
    what : str
        What the holder is doing, for the lines printed ("building the model of teacher seed 0").
    clock, sleep : callable
        Wall-clock seconds (compared with the file's modification time) and how to wait.
    say : callable
        Prints one line.
    stale_s, max_wait_s : float
        See :data:`STALE_S` and :data:`MAX_WAIT_S`.

    Returns
    -------
    bool
        True when the lock is held, False when the waiter goes on without it.
    """
    if _try_lock(handle):
        return True
    began = time.monotonic()
    try:
        return _wait(handle, path, what, clock, sleep, say, stale_s, max_wait_s)
    finally:
        _WAITED[0] += time.monotonic() - began


def _wait(handle, path: Path, what: str, clock: Callable[[], float], sleep: Callable[[float], None],
          say: Callable[[str], None], stale_s: float, max_wait_s: float) -> bool:
    key, start = str(path), clock()
    pid = holder_pid(path)
    with contextlib.suppress(OSError):
        st = os.stat(path)
        if _PASSED.get(key) in ((st.st_ino, st.st_mtime), (st.st_ino, pid)):
            return False  # passed already, the same holder still stuck: not another wait
    said = False

    def notice() -> None:
        held_by = f"pid {pid}" if pid is not None else "another process"
        say(f"growbench: waiting for {path}, held by {held_by}: {what}")

    while True:
        sleep(POLL_S)
        if _try_lock(handle):
            return True
        now = clock()
        try:
            st = os.stat(path)
        except OSError:
            continue
        pid = holder_pid(path) or pid
        quiet = now - st.st_mtime
        if pid is not None and not _alive(pid):
            why, passed = f"its holder, pid {pid}, is gone (a child of it still holds the file)", st.st_mtime
        elif quiet > stale_s and now - start >= GRACE_S:
            why, passed = f"{holder_name(pid)} has shown no sign of life for {quiet:.0f} s", st.st_mtime
        elif now - start > max_wait_s:
            # Alive by its heartbeat, yet hung: the next run of the site passes this holder without waiting again.
            why, passed = f"{holder_name(pid)} has held it for more than {max_wait_s:.0f} s", pid
        else:
            if not said and now - start >= NOTICE_S:
                notice()
                said = True
            continue
        if not said:
            notice()
        _PASSED[key] = (st.st_ino, passed)
        say(f"growbench: going on without {path}: {why}; the lock only saves repeating its work")
        return False


def holder_name(pid: int | None) -> str:
    """``"its holder, pid N"``, or ``"its holder"`` when the pid is unknown."""
    return "its holder" + (f", pid {pid}" if pid is not None else "")


@contextlib.contextmanager
def work_lock(path: str | Path, what: str, **waiting) -> Iterator[bool]:
    """Hold the lock file ``path`` for the block, as the module docstring says; yields whether it is held.

    A folder or file that cannot hold the lock (read-only, missing) yields False at once:
    the work goes on unlocked.

    Parameters
    ----------
    path : str or Path
        The lock file, created if missing (it holds nothing but the holder's pid and host).
    what : str
        What the holder does, for a waiter's line.
    **waiting
        Passed to :func:`wait_for` (``clock``, ``sleep``, ``say``, ``stale_s``, ``max_wait_s``).
    """
    path = Path(path)
    try:
        handle = open(path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
    except OSError:
        yield False
        return
    with handle:
        if not wait_for(handle, path, what, **waiting):
            yield False
            return
        stop = threading.Event()
        try:
            with contextlib.suppress(OSError):
                handle.truncate(0)
                handle.write(f"{os.getpid()} {socket.gethostname()}\n")
                handle.flush()  # the write marks the file's time too: the first sign of life
            threading.Thread(target=_heartbeat, args=(path, stop, HEARTBEAT_S), daemon=True,
                             name="growbench-lock-heartbeat").start()
            yield True
        finally:
            stop.set()
            with contextlib.suppress(OSError):
                handle.truncate(0)  # no pid of a former holder for the next waiter to name
            fcntl.flock(handle, fcntl.LOCK_UN)
