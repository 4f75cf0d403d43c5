"""The time a sweep has left, calibrated by the runs that finish, and the progress bar that shows it.

A prior cost per run (:mod:`harness.runner.cost`) says how runs compare; how many seconds a
unit of cost takes is learned from the runs as they finish, per class of runs (a dataset),
because the prior's ratios between datasets are only right within a factor of a few and a
busy machine slows every run. :class:`Estimate` keeps, per class, the seconds and the prior
cost of its finished runs, and a class's seconds per unit are its own, drawn by the weight of
one run toward the class whose runs' prior cost is nearest (a class with no finished run takes
that one's). The
first run of a site trains the model its other runs read from the cache, and costs several of
them: first runs are calibrated apart (drawn toward their class's other runs). The time left
is the predicted seconds of the runs not started plus what the runs in flight have left,
shared by the workers, and never less than the longest of them.

A run's seconds are measured where it runs (its worker), else in this process: the workers
take the runs in the order given (first in, first out), so a run starts when the run before
it on its worker finishes, which is also how the runs in flight are known. The bar's share
is the time elapsed over the time elapsed plus the time left, not the runs done: a sweep
whose first runs are its costliest would otherwise show 80 % done with most of its time
ahead. The run count is shown beside it.

Everything takes the clock as an argument, so that tests run sweeps on a simulated one.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm


class Estimate:
    """Seconds left of a sweep of runs with prior ``costs`` in ``classes``, done by ``workers`` in the given order.

    Parameters
    ----------
    costs : sequence of float
        Each run's prior cost (any positive unit), in the order the runs are started.
    classes : sequence of str
        Each run's class: runs whose seconds per unit of cost are calibrated together.
    workers : int
        Runs done at once (the first ``workers`` start at once).
    clock : callable
        Seconds, monotonic (default :func:`time.monotonic`).
    groups : sequence, optional
        Each run's group: runs that share work, which the group's first run (in the order) does for
        the others (a sweep's site: its first run trains the model the others read from the cache).
        The first runs of a class are calibrated apart from its other runs, their prior being theirs
        only; default each run a group of its own (no first runs apart).
    """

    def __init__(self, costs: Sequence[float], classes: Sequence[str], workers: int = 1,
                 clock: Callable[[], float] = time.monotonic, groups: Sequence[object] | None = None) -> None:
        if len(costs) != len(classes) or (groups is not None and len(groups) != len(costs)):
            raise ValueError(f"{len(costs)} costs for {len(classes)} classes"
                             + (f" and {len(groups)} groups" if groups is not None else ""))
        self.costs = [c if math.isfinite(c) and c > 0 else 1.0 for c in map(float, costs)]
        self.classes = list(classes)
        # A run's kind: its class, and whether it is the first of its group.
        seen_groups: set = set()
        self.kinds: list[tuple[str, bool]] = []
        for k, g in zip(self.classes, [None] * len(self.costs) if groups is None else groups, strict=True):
            first = groups is not None and g not in seen_groups
            seen_groups.add(g)
            self.kinds.append((k, first))
        self.workers = max(1, min(int(workers), len(self.costs) or 1))
        self.clock = clock
        self.start = clock()
        # Runs started and not finished, with their start times; the next to start.
        self.running: dict[int, float] = {i: self.start for i in range(min(self.workers, len(self.costs)))}
        self.next = len(self.running)
        self.finished_runs = 0
        self._seen: set[int] = set()
        # Per kind: seconds and prior cost of the finished runs with a measured time; the prior cost not started.
        self.seconds: dict[tuple[str, bool], float] = defaultdict(float)
        self.measured: dict[tuple[str, bool], float] = defaultdict(float)
        self.waiting: dict[tuple[str, bool], float] = defaultdict(float)
        runs_of: dict[tuple[str, bool], int] = defaultdict(int)
        cost_of: dict[tuple[str, bool], float] = defaultdict(float)
        for i, (c, kind) in enumerate(zip(self.costs, self.kinds, strict=True)):
            runs_of[kind] += 1
            cost_of[kind] += c
            if i >= self.next:
                self.waiting[kind] += c
        # The weight of one run of a kind (its mean prior cost): how far its rate is drawn to the broader one.
        self.one_run = {kind: cost_of[kind] / n for kind, n in runs_of.items()}

    @property
    def total(self) -> int:
        """The number of runs."""
        return len(self.costs)

    def finish(self, i: int, seconds: float | None = None) -> None:
        """Run ``i`` (its position in the order) finished now; the next run in the order starts on its worker.

        ``seconds``: what the run took, measured where it ran; default the time since this model had it start,
        which also holds the workers' start and what passes between runs.
        """
        if i in self._seen or not 0 <= i < self.total:
            return
        now = self.clock()
        self._seen.add(i)
        self.finished_runs += 1
        started = self.running.pop(i, None)
        if started is None:
            # Finished before this model had it start (a pool that broke and ran its runs again): the run the model
            # has running in its place stays so until it finishes.
            if i >= self.next:
                self.waiting[self.kinds[i]] -= self.costs[i]
            if seconds is not None and math.isfinite(seconds) and seconds >= 0:
                self.seconds[self.kinds[i]] += seconds
                self.measured[self.kinds[i]] += self.costs[i]
            return
        took = seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else now - started
        self.seconds[self.kinds[i]] += took
        self.measured[self.kinds[i]] += self.costs[i]
        while self.next < self.total and self.next in self._seen:
            self.next += 1
        if self.next < self.total:
            self.running[self.next] = now
            self.waiting[self.kinds[self.next]] -= self.costs[self.next]
            self.next += 1

    def rate(self, k: str, first: bool = False) -> float | None:
        """Seconds per unit of cost of class ``k`` (of its groups' first runs, with ``first``); None before any run
        has a measured time.

        Each is drawn toward a broader rate by the weight of one of its runs, so that its own runs outweigh
        that from the second on: a class's other runs toward the nearest measured class's (the one whose runs'
        prior cost is nearest, on a log scale: the prior's errors are mostly between kinds of work, a real model
        against a synthetic one), its first runs toward its other runs.
        """
        if not sum(self.measured.values()) > 0:
            return None

        base = self._drawn((k, False), self._nearest(k))
        # A first run costs what its class's others do plus its group's shared work: drawn toward its class's rate.
        return self._drawn((k, True), base) if first else base

    def _drawn(self, kind: tuple[str, bool], toward: float) -> float:
        """The seconds per unit of ``kind``'s measured runs, drawn toward ``toward`` by the weight of one of them."""
        w = self.one_run.get(kind, 1.0)
        return (self.seconds.get(kind, 0.0) + toward * w) / (self.measured.get(kind, 0.0) + w)

    def _nearest(self, k: str) -> float:
        """The seconds per unit of the measured class nearest to ``k`` by its runs' prior cost (``k`` itself
        excluded); of every measured run while no other class has a measured run but its first runs."""
        mine = math.log(self.one_run.get((k, False), self.one_run.get((k, True), 1.0)))
        others = [kind for kind, cost in self.measured.items() if not kind[1] and kind[0] != k and cost > 0]
        if not others:
            return sum(self.seconds.values()) / sum(self.measured.values())
        near = min(others, key=lambda kind: (abs(math.log(self.one_run[kind]) - mine), kind[0]))
        return self.seconds[near] / self.measured[near]

    def left(self) -> float | None:
        """Seconds left, as of now; None before any run has finished (nothing to calibrate on)."""
        if self.finished_runs == self.total:
            return 0.0
        if not sum(self.measured.values()) > 0:
            return None
        now = self.clock()
        rates = {kind: self.rate(*kind) for kind in self.one_run}
        # What each run in flight has left: its prediction less the time it has run, at least a tenth of the
        # prediction (a run past its prediction is not done: it is taking longer than runs of its kind do).
        predicted = {i: self.costs[i] * rates[self.kinds[i]] for i in self.running}
        in_flight = [max(predicted[i] - (now - t), 0.1 * predicted[i]) for i, t in self.running.items()]
        queued = sum(rates[kind] * c for kind, c in self.waiting.items() if c > 0)
        return max(max(in_flight, default=0.0), (sum(in_flight) + queued) / (self.workers * self.busy(now)))

    def busy(self, now: float | None = None) -> float:
        """The share of the workers' time spent running runs so far (from 0.2 to 1).

        Runs' seconds leave out what is no run's work: the workers' start, a wait for another
        worker's site, the passing of rows. The time left is the work left over the workers
        times this share. Runs in flight count the time since they started.
        """
        now = self.clock() if now is None else now
        elapsed = now - self.start
        if elapsed <= 0:
            return 1.0
        running = sum(now - t for t in self.running.values())
        return min(1.0, max(0.2, (sum(self.seconds.values()) + running) / (self.workers * elapsed)))

    def elapsed(self) -> float:
        """Seconds since the sweep started."""
        return self.clock() - self.start

    def share(self) -> float:
        """The share of the sweep's expected time done: elapsed over elapsed plus left (0 before any estimate)."""
        left = self.left()
        if left is None:
            return 0.0
        elapsed = self.elapsed()
        return 1.0 if elapsed + left <= 0 else elapsed / (elapsed + left)


def clock_text(seconds: float | None) -> str:
    """``m:ss`` or ``h:mm:ss``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    return tqdm.format_interval(max(0.0, seconds))


class Bar:
    """The sweep's progress bar: the share of its expected time done, runs done and failed, time elapsed and left.

    Parameters
    ----------
    estimate : Estimate
    show : bool
        Draw the bar (on stderr); off, it only keeps counts.
    what : str
        What the runs are called ("runs", "training runs").
    """

    def __init__(self, estimate: Estimate, show: bool = True, what: str = "runs") -> None:
        self.estimate, self.what = estimate, what
        self.failed = 0
        self.bar = tqdm(total=1.0, disable=not show, dynamic_ncols=True,
                        bar_format="{percentage:3.0f}%|{bar}| {desc}")
        self._say("")

    def finish(self, i: int, ok: bool, name: str, seconds: float | None = None) -> None:
        """Run ``i`` of the order finished (``ok`` or not) in ``seconds`` if known; ``name`` says which."""
        self.estimate.finish(i, seconds)
        self.failed += not ok
        self._say(name)

    def text(self, name: str = "") -> str:
        """The bar's text: runs done and failed, time elapsed, time left (estimated), the last run's name."""
        e = self.estimate
        left = e.left()
        parts = [f"{e.finished_runs}/{e.total} {self.what}"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        parts.append(f"{clock_text(e.elapsed())} elapsed")
        parts.append(f"~{clock_text(left)} left" if left is not None else "time left: after the first run")
        return ", ".join(parts) + (f" | {name}" if name else "")

    def _say(self, name: str) -> None:
        self.bar.n = self.estimate.share()
        self.bar.set_description_str(self.text(name), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        """Leave the bar's last line on the screen."""
        self.bar.close()
