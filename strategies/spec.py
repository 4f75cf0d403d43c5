"""A strategy's spec as a value, its preset names, and the ``default`` preset.

A spec names one registered component per axis::

    averaging/inverse/truncation[+metric]/line_search[+holdout][+shrink][+damp]:method
    e.g. "gram/solve/rsvd+metric/fast:newton", "gram/ridge/full+metric/normal+shrink:bracket"

The line search's flags say how λ is judged by data the direction was not fitted to
(docs/mathematics.md §5.4, §5.5): ``+holdout`` chooses λ on a batch the statistics did not
see, ``+shrink`` lowers the in-sample loss's slope to its split-half honest part, ``+damp``
takes a fixed share of the λ found (``line_search={"damping": 0.5}``, the default).

or a baseline (``random``, ``zero``, ``gradmax``), or a preset name. :class:`Spec` is the
one place a spec string is split or assembled.

The ``default`` preset is chosen per regime (device kind × band of widths,
:mod:`strategies.regimes`) and read from ``strategies/default.json``, validated on every
read (:func:`check_default_choice`): a JSON object whose ``regimes`` map regime keys
(``"cpu/small"``, ``"cuda/medium"``, ...) to objects whose string ``spec`` names a growth
strategy, never ``default`` itself nor a baseline (a file of one top-level ``spec`` applies
it to every regime). A regime missing from the file borrows its nearest neighbour's choice
and says so (:class:`DefaultChoice`). A missing or damaged file warns once
(:class:`DefaultFileWarning`, naming the file and the problem) and falls back to
:data:`BUILTIN_DEFAULT`, so that every other strategy keeps working.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import stat
import warnings
from dataclasses import dataclass
from importlib import resources

from .regimes import Regime, all_regimes, device_kind, nearest
from .registry import REGISTRY

PRESETS = {
    "formula1": "per-sample/pinv/full/normal:grid",
    "formula2": "gram/pinv/full/normal:grid",
    "formula3": "mean-input/pinv/full/normal:grid",
    "formula4": "gram/solve/full/normal:grid",
    "joint": "joint/solve/full/normal:grid",
    "random": "random",
    "zero": "zero",
    "gradmax": "gradmax",
}

DEFAULT_FILE = "default.json"
# Used in every regime when default.json is missing or invalid: the choice at 128 < d_e ≤ 1024 of the
# quick sweep, which reaches its own path's best at every width measured (a bracketing search).
BUILTIN_DEFAULT = "gram/solve/rsvd+metric/normal:bracket"

#: The regime ``default`` means when no width is given: the ``quick`` sweep's (cpu, d_e ≤ 128).
REFERENCE_REGIME = Regime("cpu", "small")

# (file, problem) pairs already warned about: default_spec() runs on every parse("default"),
# presets() and list, and one damaged file should produce one warning, not dozens.
_WARNED: set[tuple[str, str]] = set()


class DefaultFileWarning(UserWarning):
    """``strategies/default.json`` is missing or invalid; the built-in default is used instead."""


def _methods(line_search: str) -> tuple[str, ...]:
    return tuple(REGISTRY["line_search"][line_search].methods)


def _all_methods() -> list[str]:
    return list(dict.fromkeys(m for cls in REGISTRY["line_search"].values() for m in cls.methods))


@dataclass(frozen=True)
class Spec:
    """One strategy: a component per axis, or a baseline.

    Attributes
    ----------
    averaging, inverse, truncation, line_search : str or None
        Registered component names; None for a baseline.
    metric : bool
        Whether the truncation is in the metric of ``E[XᵀX]`` (``+metric``).
    holdout : bool
        λ chosen on a batch the statistics did not see (``+holdout`` on the line search).
    shrink : bool
        λ chosen on the loss with its in-sample optimism removed (``+shrink`` on the line search).
    damp : bool
        A fixed share of the λ found is taken (``+damp`` on the line search).
    method : str or None
        The line search's method (``grid``, ``newton``, ...).
    baseline : str or None
        A registered baseline's name; then every other field is None/False.
    """

    averaging: str | None = None
    inverse: str | None = None
    truncation: str | None = None
    metric: bool = False
    line_search: str | None = None
    method: str | None = None
    baseline: str | None = None
    holdout: bool = False
    shrink: bool = False
    damp: bool = False

    #: The fields of a growth spec, in the order of its string (figures and tables group by them).
    AXES = ("averaging", "inverse", "truncation", "metric", "line_search", "holdout", "shrink", "damp", "method")
    #: The line search's flags, in the order a spec string writes them.
    LINE_SEARCH_FLAGS = ("holdout", "shrink", "damp")

    @classmethod
    def parse(cls, text: object) -> Spec:
        """The spec of a spec string or preset name (``default`` is read from ``default.json``).

        Raises
        ------
        ValueError
            One message naming the unknown parts and listing every valid component.
        """
        if not isinstance(text, str):
            raise ValueError(f"a spec must be a string, got {type(text).__name__}; {_valid_message()}")
        s = text.strip().lower()
        s = default_spec() if s == "default" else PRESETS.get(s, s)
        if s in REGISTRY["baseline"]:
            return cls(baseline=s)
        parts = s.split("/")
        if len(parts) != 4 or parts[3].count(":") != 1:
            raise ValueError(f"unknown strategy spec {text!r}; {_valid_message()}")
        avg, inv, trunc, ls = parts
        trunc_name, plus, flag = trunc.partition("+")
        ls_part, _, method = ls.partition(":")
        ls_name, *ls_flags = ls_part.split("+")
        bad_flags = [f for f in ls_flags if f not in cls.LINE_SEARCH_FLAGS]
        if len(set(ls_flags)) != len(ls_flags):
            bad_flags.append("(a flag twice)")
        problems = [
            f"{axis} {value!r}"
            for axis, value, ok in (
                ("averaging", avg, avg in REGISTRY["averaging"]),
                ("inverse", inv, inv in REGISTRY["inverse"]),
                ("truncation", trunc_name, trunc_name in REGISTRY["truncation"]),
                ("truncation flag", flag, not plus or flag == "metric"),
                ("line search", ls_name, ls_name in REGISTRY["line_search"]),
                ("line search flag", "+".join(bad_flags), not bad_flags),
                ("search method", method, ls_name not in REGISTRY["line_search"] or method in _methods(ls_name)),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"unknown {', '.join(problems)} in spec {text!r}; {_valid_message()}")
        return cls(averaging=avg, inverse=inv, truncation=trunc_name, metric=bool(plus), line_search=ls_name,
                   method=method, **{flag: flag in ls_flags for flag in cls.LINE_SEARCH_FLAGS})

    @classmethod
    def grid(cls) -> list[Spec]:
        """Every registered combination of the axes, then every baseline."""
        n_flags = len(cls.LINE_SEARCH_FLAGS)
        out = [
            cls(averaging=a, inverse=i, truncation=t, metric=m, line_search=ls, method=meth,
                **dict(zip(cls.LINE_SEARCH_FLAGS, flags, strict=True)))
            for a, i, t, m, ls, *flags in itertools.product(
                REGISTRY["averaging"], REGISTRY["inverse"], REGISTRY["truncation"], (False, True),
                REGISTRY["line_search"], *[(False, True)] * n_flags,
            )
            for meth in _methods(ls)
        ]
        return out + [cls(baseline=b) for b in REGISTRY["baseline"]]

    @property
    def is_baseline(self) -> bool:
        return self.baseline is not None

    def replace(self, **fields: object) -> Spec:
        """This spec with some axes changed (validated: the result must parse back)."""
        return Spec.parse(str(dataclasses.replace(self, **fields)))

    def parts(self) -> dict[str, str | bool]:
        """``{"baseline": name}`` for a baseline, else ``{axis: value}`` over :attr:`AXES`."""
        if self.is_baseline:
            return {"baseline": self.baseline}
        return {axis: getattr(self, axis) for axis in self.AXES}

    def __str__(self) -> str:
        if self.is_baseline:
            return self.baseline
        metric = "+metric" if self.metric else ""
        flags = "".join(f"+{f}" for f in self.LINE_SEARCH_FLAGS if getattr(self, f))
        return f"{self.averaging}/{self.inverse}/{self.truncation}{metric}/{self.line_search}{flags}:{self.method}"


def _valid_message() -> str:
    def names(axis: str) -> str:
        return ", ".join(REGISTRY[axis])

    return (
        "valid specs are 'averaging/inverse/truncation[+metric]/line_search[+holdout][+shrink][+damp]:method' with "
        f"averaging in {{{names('averaging')}}}, inverse in {{{names('inverse')}}}, "
        f"truncation in {{{names('truncation')}}}, line_search in {{{names('line_search')}}}, "
        f"method in {{{', '.join(_all_methods())}}}; "
        f"baselines: {names('baseline')}; presets: {', '.join([*PRESETS, 'default'])}"
    )


def baseline_names() -> list[str]:
    """The registered baselines, the one list of them."""
    return list(REGISTRY["baseline"])


def check_default_choice(spec: object) -> str:
    """The canonical spec of ``spec`` if it may be the ``default`` preset; ``ValueError`` otherwise.

    Parameters
    ----------
    spec : object
        The candidate, e.g. the ``spec`` value of ``default.json``.

    Returns
    -------
    str
        Canonical growth spec (a preset name such as ``formula2`` is resolved).

    Raises
    ------
    ValueError
        One line: not a string, ``default`` itself (it would resolve to itself forever),
        a baseline (they take no step, and code that reads the default's components
        expects a growth spec) or not a valid spec.
    """
    if not isinstance(spec, str):
        raise ValueError(f'"spec" must be a string, got {type(spec).__name__}')
    s = spec.strip().lower()
    if s == "default":
        raise ValueError(f'"spec" {spec!r} refers to the default itself (recursive)')
    try:
        parsed = Spec.parse(s)  # s != "default", so this never reads default.json again
    except ValueError as e:
        # parse's message lists every valid component: too long for a one-line warning.
        raise ValueError(str(e).split("; valid specs are")[0]) from None
    if parsed.is_baseline:
        raise ValueError(f'"spec" {spec!r} is the baseline {parsed.baseline!r}, not a growth strategy')
    return str(parsed)


@dataclass(frozen=True)
class _Entry:
    """One regime's entry of ``default.json``: its spec, whether growth generalises there, and the least
    statistics with which its evidence shows the spec lowering the held-out loss (see :func:`_least_statistics`)."""

    spec: str
    generalises: bool = True
    statement: str = ""
    batches: int | None = None
    tokens_per_entry: float | None = None


def _least_statistics(entry: dict) -> tuple[int | None, float | None]:
    """The fewest statistics batches and tokens per entry of ``P`` (``tokens / d_e²``) among the datasets on which a
    regime's evidence shows its choice lowering the held-out loss beyond noise; ``(None, None)`` where the entry
    does not say (a hand-written file, an older one). Read leniently: this is advice, not the choice."""
    evidence, datasets = entry.get("evidence"), entry.get("datasets")
    if not isinstance(evidence, dict):
        return None, None
    batches, tokens = [], []
    for name, ev in evidence.items():
        if not isinstance(ev, dict) or ev.get("lowers") is not True:
            continue
        per_entry = ev.get("tokens_per_d_e2")
        if isinstance(per_entry, int | float) and not isinstance(per_entry, bool) and per_entry > 0:
            tokens.append(float(per_entry))
        setup = datasets.get(name) if isinstance(datasets, dict) else None
        found = re.search(r"\bn_batches=(\d+)\b", setup) if isinstance(setup, str) else None
        if found:
            batches.append(int(found.group(1)))
    return (min(batches) if batches else None), (min(tokens) if tokens else None)


class _NotRegular(OSError):
    """``default.json`` is there but is no regular file."""


def _read_regular(path: object) -> str:
    """The text of ``path`` if it is a regular file; ``OSError`` otherwise, without ever blocking on it.

    Opened non-blocking and checked on the open descriptor (no window between a check and the open in which the
    file could be swapped for a FIFO): opening a FIFO that way returns at once, and it is then refused unread. A
    Traversable without a file system path (inside a zip) is read as it is.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except TypeError:  # no file system path: a resource inside a zip, a regular member by construction
        return path.read_text(encoding="utf-8")
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular("not a regular file (a folder, FIFO or device); not read")
        return handle.read().decode("utf-8")


def _read_default(path: object) -> dict[Regime, _Entry] | str:
    """The validated choices of the file at ``path`` (a Traversable); ``ValueError`` naming the problem.

    Returns ``{regime: entry}`` for a file with ``"regimes"``, or one canonical spec
    for a file of one ``"spec"`` (every regime then uses it).

    Only a regular file is read: a FIFO would block every command that resolves ``default``, and a
    device could be endless. JSON nested too deeply for the parser is refused like invalid JSON.
    """
    try:
        text = _read_regular(path)
    except _NotRegular as e:
        raise ValueError(str(e)) from None
    except FileNotFoundError:
        raise ValueError("file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e})") from None
    except RecursionError:
        raise ValueError("invalid JSON (nested too deeply to read)") from None
    if not isinstance(data, dict):
        raise ValueError(f'expected a JSON object with a "regimes" or "spec" key, got a JSON {type(data).__name__}')
    if "regimes" not in data:
        if "spec" not in data:
            raise ValueError('no "regimes" and no "spec" key')
        return check_default_choice(data["spec"])
    regimes = data["regimes"]
    if not isinstance(regimes, dict) or not regimes:
        raise ValueError('"regimes" must be a non-empty JSON object of regime -> {"spec": ...}')
    out = {}
    for key, entry in regimes.items():
        regime = Regime.parse(key)
        if not isinstance(entry, dict) or "spec" not in entry:
            raise ValueError(f'regime {key!r}: expected a JSON object with a "spec" key')
        try:
            spec = check_default_choice(entry["spec"])
        except ValueError as e:
            raise ValueError(f"regime {key!r}: {e}") from None
        generalises = entry.get("generalises", True)
        statement = entry.get("statement", "")
        if not isinstance(generalises, bool) or not isinstance(statement, str):
            raise ValueError(f'regime {key!r}: "generalises" must be true or false and "statement" a string')
        out[regime] = _Entry(spec, generalises, statement, *_least_statistics(entry))
    return out


@dataclass(frozen=True)
class DefaultChoice:
    """The ``default`` preset's spec in one regime, and where that choice comes from.

    Attributes
    ----------
    spec : str
        Canonical growth spec.
    regime : Regime
        The regime asked for.
    source : Regime or None
        The regime whose evidence chose ``spec``: ``regime`` itself, its nearest neighbour
        with evidence, or None (``default.json`` names one spec for all, or the built-in default).
    note : str
        Empty when the regime has its own choice; otherwise one sentence saying why not.
    generalises : bool
        False where the evidence says no growth strategy lowers the held-out loss beyond noise;
        ``spec`` is then the one that harms least.
    statement : str
        The evidence's verdict in plain words.
    batches, tokens_per_entry : int, float or None
        The fewest statistics batches, and tokens per entry of ``P`` (``tokens / d_e²``), with which the evidence
        shows ``spec`` lowering the held-out loss beyond noise in ``source`` (None where it does not say): below
        them a growth runs on statistics its choice was never shown to generalise from.
    """

    spec: str
    regime: Regime
    source: Regime | None
    note: str = ""
    generalises: bool = True
    statement: str = ""
    batches: int | None = None
    tokens_per_entry: float | None = None

    def evidence(self) -> str:
        """One line: the regime's verdict (the statement's first sentence) and where its evidence is."""
        where = self.source or self.regime
        first = self.statement.split(". ")[0].strip().rstrip(".")
        if not first:
            first = ("growth generalises here" if self.generalises
                     else "growth with these statistics does not generalise here")
        return (f"{where.describe()}: {first}. Evidence: strategies/{DEFAULT_FILE} (regime {where.key}) and the "
                "report's 'What to use' section.")


def _choices() -> tuple[dict[Regime, _Entry] | str, str]:
    """The file's choices (or one spec), and a note when the built-in default replaces a damaged file."""
    path = resources.files(__package__).joinpath(DEFAULT_FILE)
    try:
        return _read_default(path), ""
    except ValueError as e:
        problem = str(e).replace("\n", " ")
        if (str(path), problem) not in _WARNED:
            _WARNED.add((str(path), problem))
            # warn_explicit with the file's path in angle brackets as the source: the default formatter prints one
            # line starting with it, and linecache, which the formatter asks for the source line, never opens a
            # name in angle brackets (it would open the file itself: a FIFO there hung every command).
            warnings.warn_explicit(f"{path}: {problem}; using the built-in default {BUILTIN_DEFAULT}",
                                   DefaultFileWarning, f"<{path}>", 0)
        return BUILTIN_DEFAULT, f"{path} is unusable ({problem}): the built-in default {BUILTIN_DEFAULT} is used"


def default_file_specs() -> list[str]:
    """Every distinct spec ``default.json`` names (``[BUILTIN_DEFAULT]`` when it is unusable), read without the
    warning :func:`default_choice` gives about a damaged file: for checking options against what may run."""
    try:
        choices = _read_default(resources.files(__package__).joinpath(DEFAULT_FILE))
    except ValueError:
        return [BUILTIN_DEFAULT]
    return [choices] if isinstance(choices, str) else list(dict.fromkeys(e.spec for e in choices.values()))


def default_choice(device: object = "cpu", d_e: int | None = None) -> DefaultChoice:
    """The ``default`` preset's choice for a growth on ``device`` at width ``d_e``.

    Parameters
    ----------
    device : str or torch.device
        Where the growth runs (any accelerator counts as ``cuda``).
    d_e : int, optional
        The width, bias column included; None for :data:`REFERENCE_REGIME`'s band.

    Returns
    -------
    DefaultChoice
        A regime with no choice of its own borrows its nearest neighbour's and says so in ``note``.
    """
    regime = Regime(device_kind(device), REFERENCE_REGIME.band) if d_e is None else Regime.of(device, d_e)
    return _choice_in(regime, *_choices())


def _choice_in(regime: Regime, choices: dict[Regime, _Entry] | str, problem: str) -> DefaultChoice:
    """``regime``'s choice among the file's ``choices`` (as from :func:`_choices`)."""
    if isinstance(choices, str):
        return DefaultChoice(choices, regime, None, problem or f"{DEFAULT_FILE} names one spec for every regime")
    source = nearest(regime, choices)
    note = "" if source == regime else (
        f"no evidence for {regime.describe()} in {DEFAULT_FILE}: using the choice of its nearest regime, "
        f"{source.describe()}")
    entry = choices[source]
    return DefaultChoice(entry.spec, regime, source, note, entry.generalises, entry.statement, entry.batches,
                         entry.tokens_per_entry)


def default_spec(device: object = "cpu", d_e: int | None = None) -> str:
    """The spec of the ``default`` preset, read from ``strategies/default.json``, for one regime.

    Parameters
    ----------
    device : str or torch.device
        Where the growth runs; default ``cpu``.
    d_e : int, optional
        Its width; default the reference regime's band (cpu, d_e ≤ 128: the ``quick`` sweep's).

    Returns
    -------
    str
        The canonical spec (see :func:`default_choice` for where it comes from);
        :data:`BUILTIN_DEFAULT` when the file is missing or invalid, with one
        :class:`DefaultFileWarning` per file and problem.
    """
    return default_choice(device, d_e).spec


def default_specs() -> dict[Regime, DefaultChoice]:
    """The ``default`` preset's choice in every regime (see :func:`default_choice`)."""
    read = _choices()  # once for all regimes
    return {r: _choice_in(r, *read) for r in all_regimes()}


def presets() -> dict[str, str]:
    """``{preset name: canonical spec}``, including ``default``."""
    return {**PRESETS, "default": default_spec()}


def specs() -> list[str]:
    """Every valid spec string of the full grid, baselines included."""
    return [str(s) for s in Spec.grid()]


def parse(spec: str) -> dict[str, str | bool]:
    """Split a spec (or preset name) into its components; ``ValueError`` listing the valid ones otherwise."""
    return Spec.parse(spec).parts()


def canonical(spec: str) -> str:
    """The canonical spec string of a spec or preset name."""
    return str(Spec.parse(spec))
