"""Wall-clock timing of phases, synchronised on CUDA so that asynchronous kernels are counted.

Two levels:

- :func:`timed` adds a ``with`` body's time to one of a growth's coarse phases (``statistics``,
  ``direction``, ``line_search``, ``truncation``: :attr:`GrowthResult.timings`);
- :class:`Profile` splits one growth into finer, non-overlapping sections (the ridge's strength, the
  metric, each loss call, the refit, ...): a section nested in another counts to the inner one
  alone, so the sections partition the time they cover. Components mark their sections with
  :func:`section`, which does nothing unless a profile is active (``Profile.active``), so code
  outside a growth pays nothing. A growth stores its profile in ``info["profile"]``
  (:meth:`Profile.as_info`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued kernels on ``device`` (no-op on CPU)."""
    if device is None:
        return
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(timings: dict[str, float], phase: str, device: torch.device | str | None = None) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``timings[phase]`` (seconds)."""
    synchronize(device)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        synchronize(device)
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - t0


#: The profile that :func:`section` records into: the growth running in this thread (or task), if any.
_CURRENT: ContextVar[Profile | None] = ContextVar("growbench_profile", default=None)


class Profile:
    """Exclusive seconds and calls per named section of one growth.

    Parameters
    ----------
    device : torch.device or str, optional
        Where the growth computes: on CUDA every section boundary synchronises, as :func:`timed`
        does, so that a section is charged for its own kernels (those synchronisations are the
        profile's, not the algorithm's: ``info["host_syncs"]`` does not count them).

    Attributes
    ----------
    seconds : dict of str to float
        Exclusive wall time per section: time spent in a nested section is not counted again in
        the enclosing one.
    calls : dict of str to int
        How often each section was entered.
    durations : dict of str to list of float
        Every call's exclusive seconds, for the sections whose calls are worth telling apart (the
        loss calls: ``keep_calls``).
    """

    #: Sections whose every call is kept in :attr:`durations`.
    keep_calls = ("loss calls",)

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.durations: dict[str, list[float]] = {}
        self.prefix = ""
        # The open sections, innermost last: [name, when its current uninterrupted stretch began, its total so far].
        self._open: list[list] = []

    def _charge(self, entry: list, now: float) -> None:
        entry[2] += now - entry[1]
        self.seconds[entry[0]] = self.seconds.get(entry[0], 0.0) + now - entry[1]

    def section(self, name: str) -> _Section:
        """A context manager charging its body's time, less that of sections nested in it, to ``prefix + name``."""
        return _Section(self, name if name in self.keep_calls else self.prefix + name)

    def _enter(self, name: str) -> list:
        synchronize(self.device)
        now = time.perf_counter()
        if self._open:
            self._charge(self._open[-1], now)
        entry = [name, now, 0.0]
        self._open.append(entry)
        return entry

    def _exit(self, entry: list) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self._open.pop()
        self._charge(entry, now)
        name = entry[0]
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.keep_calls:
            self.durations.setdefault(name, []).append(entry[2])
        if self._open:
            self._open[-1][1] = now

    @contextmanager
    def prefixed(self, prefix: str) -> Iterator[None]:
        """Name the sections opened in the ``with`` body ``prefix + name`` (the refit's, say), but the loss calls."""
        before, self.prefix = self.prefix, prefix
        try:
            yield
        finally:
            self.prefix = before

    @contextmanager
    def active(self) -> Iterator[Profile]:
        """Make this the profile that :func:`section` records into, for the ``with`` body."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def add(self, name: str, seconds: float, calls: int = 1) -> None:
        """Charge time measured elsewhere (statistics the caller accumulated) to ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + calls

    def as_info(self, total: float) -> dict:
        """The profile as plain numbers for ``info["profile"]``: ``{"ms": {section: ms}, "calls": {section: n},
        "loss_call_ms": [...], "total_ms": ...}``, with ``other`` the time of ``total`` (seconds) no section
        covered (checks, bookkeeping, Python)."""
        ms = {name: 1e3 * s for name, s in self.seconds.items()}
        ms["other"] = max(1e3 * total - sum(ms.values()), 0.0)
        return {"ms": ms, "calls": dict(self.calls),
                "loss_call_ms": [1e3 * s for s in self.durations.get("loss calls", [])], "total_ms": 1e3 * total}


class _Section:
    """The context manager of one section (a class, not a generator: a growth opens some fifty of them, and at the
    small band's sizes a generator's overhead would be a visible share of the growth)."""

    __slots__ = ("_entry", "_name", "_profile")

    def __init__(self, profile: Profile | None, name: str) -> None:
        self._profile, self._name, self._entry = profile, name, None

    def __enter__(self) -> None:
        if self._profile is not None:
            self._entry = self._profile._enter(self._name)

    def __exit__(self, *exc: object) -> None:
        if self._entry is not None:
            self._profile._exit(self._entry)


def section(name: str) -> _Section:
    """Record the ``with`` body as section ``name`` of the active :class:`Profile`; nothing when none is active."""
    profile = _CURRENT.get()
    if profile is None:
        return _Section(None, name)
    return profile.section(name)
