"""How the report names strategies: preset names, ``default[x]`` for one-component variants, categories."""

from __future__ import annotations

from typing import Literal

from growbench import strategies
from growbench.harness.rule.loading import preset_names, stored_spec

NAMING = ("Strategy names: specs are averaging/inverse/truncation[+metric]/line_search[+holdout][+shrink][+damp]"
          ":method; presets go by their names from strategies.presets(); in figures, default[x] is the default with "
          "one component changed to x (e.g. default[rsvd], default[−metric], default[normal search]).")
# How a changed component reads inside default[...]: the line search's name alone would be ambiguous.
_VALUE_FORMAT = {"line_search": "{} search"}


def _component(axis: str, value: object) -> str:
    if axis in ("metric", *strategies.Spec.LINE_SEARCH_FLAGS):  # the flags: on or off
        return f"+{axis}" if value else f"−{axis}"
    return _VALUE_FORMAT.get(axis, "{}").format(value)


def short_label(spec: str, names: dict[str, str] | None = None) -> str:
    """A preset's name, or ``preset[change, ...]`` for a spec one or two components away from a preset.

    Parameters
    ----------
    spec : str
        A stored strategy name.
    names : dict, optional
        ``{spec: preset name}`` (:func:`harness.recommend.preset_names`, read once by callers in a loop).

    Returns
    -------
    str
        E.g. ``default[rsvd]``, ``default[−metric]``, ``default[normal search]`` (the default preferred
        among presets equally close); the spec itself when no preset is within two components.
    """
    names = preset_names() if names is None else names
    if spec in names:
        return names[spec]
    parsed = stored_spec(spec)
    if parsed is None or parsed.is_baseline:
        return str(spec)
    best = None
    for name, preset_spec in strategies.presets().items():
        preset = stored_spec(preset_spec)
        if preset is None or preset.is_baseline:
            continue
        diff = [axis for axis in strategies.Spec.AXES if getattr(preset, axis) != getattr(parsed, axis)]
        key = (len(diff), name != "default", name)
        if best is None or key < best[0]:
            best = (key, name, diff)
    if best is None or len(best[2]) > 2:
        return str(spec)
    _, name, diff = best
    return f"{name}[{', '.join(_component(axis, getattr(parsed, axis)) for axis in diff)}]"


Category = Literal["preset", "variant", "baseline", "other"]


def category(spec: str, names: dict[str, str]) -> Category:
    """``preset``, ``variant`` (a growth spec that is no preset), ``baseline``, or ``other`` (not a valid spec)."""
    parsed = stored_spec(spec)
    if parsed is None:
        return "other"
    if parsed.is_baseline:
        return "baseline"
    return "preset" if spec in names else "variant"
