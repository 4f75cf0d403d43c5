"""Spec strings, presets and the registry of interchangeable components.

A spec names one component per axis::

    averaging/inverse/truncation[+metric]/line_search:method
    e.g. "gram/solve/rsvd+metric/fast:newton"

or a baseline (``random``, ``zero``, ``gradmax``), or a preset name. New components
are added with :func:`register`.

The ``default`` preset is read from ``strategies/default.json`` and validated on every
read (:func:`check_default_choice`): a JSON object whose string ``spec`` names a growth
strategy, never ``default`` itself nor a baseline. A missing or damaged file warns once
(:class:`DefaultFileWarning`, naming the file and the problem) and falls back to
:data:`BUILTIN_DEFAULT`, so that every other strategy keeps working.
"""

from __future__ import annotations

import itertools
import json
import warnings
from importlib import resources

from .averaging import AVERAGINGS
from .baselines import BASELINES
from .growth import GrowthStrategy, Strategy
from .inverse import INVERSES
from .line_search import LINE_SEARCHES, METHODS
from .truncation import TRUNCATIONS

REGISTRY: dict[str, dict[str, type]] = {
    "averaging": AVERAGINGS,
    "inverse": INVERSES,
    "truncation": TRUNCATIONS,
    "line_search": LINE_SEARCHES,
    "baseline": BASELINES,
}

_PRESETS = {
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
# Used when default.json is missing or invalid: the committed choice of the quick sweep.
BUILTIN_DEFAULT = "gram/solve/full+metric/normal:newton"

# (file, problem) pairs already warned about: default_spec() runs on every parse("default"),
# presets() and list, and one damaged file should produce one warning, not dozens.
_WARNED: set[tuple[str, str]] = set()


class DefaultFileWarning(UserWarning):
    """``strategies/default.json`` is missing or invalid; the built-in default is used instead."""


def register(axis: str, name: str):
    """Class decorator adding a component to an axis of the registry."""
    if axis not in REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(REGISTRY)}")

    def deco(cls: type) -> type:
        REGISTRY[axis][name] = cls
        return cls

    return deco


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
        c = canonical(s)  # s != "default", so this never reads default.json again
    except ValueError as e:
        # parse's message lists every valid component: too long for a one-line warning.
        raise ValueError(str(e).split("; valid specs are")[0]) from None
    if c in REGISTRY["baseline"]:
        raise ValueError(f'"spec" {spec!r} is the baseline {c!r}, not a growth strategy')
    return c


def _read_default(path: object) -> str:
    """The validated spec in the file at ``path`` (a Traversable); ``ValueError`` naming the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError("file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object with a \"spec\" key, got a JSON {type(data).__name__}")
    if "spec" not in data:
        raise ValueError('no "spec" key')
    return check_default_choice(data["spec"])


def default_spec() -> str:
    """The spec of the ``default`` preset, read from ``strategies/default.json``.

    Returns
    -------
    str
        The file's canonical ``spec``; :data:`BUILTIN_DEFAULT` when the file is missing
        or invalid, with one :class:`DefaultFileWarning` per file and problem.
    """
    path = resources.files(__package__).joinpath(DEFAULT_FILE)
    try:
        return _read_default(path)
    except ValueError as e:
        problem = str(e).replace("\n", " ")
        if (str(path), problem) not in _WARNED:
            _WARNED.add((str(path), problem))
            # warn_explicit at the file itself, line 0: the default formatter then prints one
            # line that starts with the file's path, and no source line of registry.py.
            warnings.warn_explicit(f"{path}: {problem}; using the built-in default {BUILTIN_DEFAULT}",
                                   DefaultFileWarning, str(path), 0)
        return BUILTIN_DEFAULT


def presets() -> dict[str, str]:
    """``{preset name: canonical spec}``, including ``default``."""
    return {**_PRESETS, "default": default_spec()}


def specs() -> list[str]:
    """Every valid spec string of the full grid, baselines included."""
    out = [
        f"{a}/{i}/{t}{m}/{ls}:{meth}"
        for a, i, t, m, ls, meth in itertools.product(
            REGISTRY["averaging"], REGISTRY["inverse"], REGISTRY["truncation"], ("", "+metric"),
            REGISTRY["line_search"], METHODS,
        )
    ]
    return out + list(REGISTRY["baseline"])


def _valid_message() -> str:
    return (
        "valid specs are 'averaging/inverse/truncation[+metric]/line_search:method' with "
        f"averaging in {{{', '.join(REGISTRY['averaging'])}}}, inverse in {{{', '.join(REGISTRY['inverse'])}}}, "
        f"truncation in {{{', '.join(REGISTRY['truncation'])}}}, "
        f"line_search in {{{', '.join(REGISTRY['line_search'])}}}, method in {{{', '.join(METHODS)}}}; "
        f"baselines: {', '.join(REGISTRY['baseline'])}; presets: {', '.join([*_PRESETS, 'default'])}"
    )


def parse(spec: str) -> dict[str, str | bool]:
    """Split a spec (or preset name) into its components; ``ValueError`` listing the valid ones otherwise."""
    if not isinstance(spec, str):
        raise ValueError(f"a spec must be a string, got {type(spec).__name__}; {_valid_message()}")
    s = spec.strip().lower()
    if s == "default":
        s = default_spec()
    s = _PRESETS.get(s, s)
    if s in REGISTRY["baseline"]:
        return {"baseline": s}
    parts = s.split("/")
    if len(parts) != 4 or parts[3].count(":") != 1:
        raise ValueError(f"unknown strategy spec {spec!r}; {_valid_message()}")
    avg, inv, trunc, ls = parts
    trunc_name, plus, flag = trunc.partition("+")
    ls_name, _, method = ls.partition(":")
    problems = [
        f"{axis} {value!r}"
        for axis, value, ok in (
            ("averaging", avg, avg in REGISTRY["averaging"]),
            ("inverse", inv, inv in REGISTRY["inverse"]),
            ("truncation", trunc_name, trunc_name in REGISTRY["truncation"]),
            ("truncation flag", flag, not plus or flag == "metric"),
            ("line search", ls_name, ls_name in REGISTRY["line_search"]),
            ("search method", method, method in METHODS),
        )
        if not ok
    ]
    if problems:
        raise ValueError(f"unknown {', '.join(problems)} in spec {spec!r}; {_valid_message()}")
    return {"averaging": avg, "inverse": inv, "truncation": trunc_name, "metric": bool(plus),
            "line_search": ls_name, "method": method}


def canonical(spec: str) -> str:
    """The canonical spec string of a spec or preset name."""
    c = parse(spec)
    if "baseline" in c:
        return c["baseline"]
    metric = "+metric" if c["metric"] else ""
    return f"{c['averaging']}/{c['inverse']}/{c['truncation']}{metric}/{c['line_search']}:{c['method']}"


def make(
    spec: str,
    *,
    averaging: dict | None = None,
    inverse: dict | None = None,
    truncation: dict | None = None,
    line_search: dict | None = None,
    baseline: dict | None = None,
) -> Strategy:
    """Build a strategy from a spec string or preset name.

    Parameters
    ----------
    spec : str
        E.g. ``"gram/solve/rsvd+metric/fast:newton"``, ``"formula1"``, ``"default"``, ``"gradmax"``.
    averaging, inverse, truncation, line_search, baseline : dict, optional
        Keyword options of each component's constructor, e.g.
        ``inverse={"rtol": 1e-6}``, ``truncation={"oversample": 16, "n_iter": 4}``,
        ``averaging={"tol": 1e-8}`` (joint), ``line_search={"newton_steps": 2}``.

    Returns
    -------
    Strategy
        With ``spec``, ``direction``, ``grow`` and ``new_statistics``.
    """
    c = parse(spec)
    if "baseline" in c:
        if any(o for o in (averaging, inverse, truncation, line_search)):
            raise ValueError(f"baseline {c['baseline']!r} only takes baseline=... options")
        return REGISTRY["baseline"][c["baseline"]](**(baseline or {}))
    if baseline:
        raise ValueError("baseline=... options only apply to the baselines")
    inv = REGISTRY["inverse"][c["inverse"]](**(inverse or {}))
    avg = REGISTRY["averaging"][c["averaging"]](inv, **(averaging or {}))
    trunc = REGISTRY["truncation"][c["truncation"]](metric=c["metric"], **(truncation or {}))
    ls = REGISTRY["line_search"][c["line_search"]](method=c["method"], **(line_search or {}))
    return GrowthStrategy(avg, trunc, ls, canonical(spec))
