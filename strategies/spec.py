"""A strategy's spec as a value, its preset names, and the ``default`` preset.

A spec names one registered component per axis::

    averaging/inverse/truncation[+metric]/line_search:method
    e.g. "gram/solve/rsvd+metric/fast:newton"

or a baseline (``random``, ``zero``, ``gradmax``), or a preset name. :class:`Spec` is the
one place a spec string is split or assembled.

The ``default`` preset is read from ``strategies/default.json`` and validated on every
read (:func:`check_default_choice`): a JSON object whose string ``spec`` names a growth
strategy, never ``default`` itself nor a baseline. A missing or damaged file warns once
(:class:`DefaultFileWarning`, naming the file and the problem) and falls back to
:data:`BUILTIN_DEFAULT`, so that every other strategy keeps working.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings
from dataclasses import dataclass
from importlib import resources

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
# Used when default.json is missing or invalid: the committed choice of the quick sweep.
BUILTIN_DEFAULT = "gram/solve/full+metric/normal:newton"

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

    #: The fields of a growth spec, in the order of its string (figures and tables group by them).
    AXES = ("averaging", "inverse", "truncation", "metric", "line_search", "method")

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
        ls_name, _, method = ls.partition(":")
        problems = [
            f"{axis} {value!r}"
            for axis, value, ok in (
                ("averaging", avg, avg in REGISTRY["averaging"]),
                ("inverse", inv, inv in REGISTRY["inverse"]),
                ("truncation", trunc_name, trunc_name in REGISTRY["truncation"]),
                ("truncation flag", flag, not plus or flag == "metric"),
                ("line search", ls_name, ls_name in REGISTRY["line_search"]),
                ("search method", method, ls_name not in REGISTRY["line_search"] or method in _methods(ls_name)),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"unknown {', '.join(problems)} in spec {text!r}; {_valid_message()}")
        return cls(averaging=avg, inverse=inv, truncation=trunc_name, metric=bool(plus), line_search=ls_name,
                   method=method)

    @classmethod
    def grid(cls) -> list[Spec]:
        """Every registered combination of the axes, then every baseline."""
        out = [
            cls(averaging=a, inverse=i, truncation=t, metric=m, line_search=ls, method=meth)
            for a, i, t, m, ls in itertools.product(
                REGISTRY["averaging"], REGISTRY["inverse"], REGISTRY["truncation"], (False, True),
                REGISTRY["line_search"],
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
        return f"{self.averaging}/{self.inverse}/{self.truncation}{metric}/{self.line_search}:{self.method}"


def _valid_message() -> str:
    def names(axis: str) -> str:
        return ", ".join(REGISTRY[axis])

    return (
        "valid specs are 'averaging/inverse/truncation[+metric]/line_search:method' with "
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
            # line that starts with the file's path, and no source line of this module.
            warnings.warn_explicit(f"{path}: {problem}; using the built-in default {BUILTIN_DEFAULT}",
                                   DefaultFileWarning, str(path), 0)
        return BUILTIN_DEFAULT


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
