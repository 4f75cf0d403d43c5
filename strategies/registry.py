"""Spec strings, presets and the registry of interchangeable components.

A spec names one component per axis::

    averaging/inverse/truncation[+metric]/line_search:method
    e.g. "gram/solve/rsvd+metric/fast:newton"

or a baseline (``random``, ``zero``, ``gradmax``), or a preset name. New components
are added with :func:`register`.
"""

from __future__ import annotations

import itertools
import json
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


def register(axis: str, name: str):
    """Class decorator adding a component to an axis of the registry."""
    if axis not in REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(REGISTRY)}")

    def deco(cls: type) -> type:
        REGISTRY[axis][name] = cls
        return cls

    return deco


def default_spec() -> str:
    """The spec of the ``default`` preset, read from ``strategies/default.json``."""
    data = json.loads(resources.files(__package__).joinpath(DEFAULT_FILE).read_text())
    return canonical(data["spec"])


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
