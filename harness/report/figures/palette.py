"""Colours that colour-blind readers can tell apart: one hue per family, shades within it.

The hues are Okabe and Ito's (2008) palette, chosen to stay distinct under the common colour-vision
deficiencies; yellow is left out (it vanishes on white). Members of one family (the three MiniLM
datasets, the baselines random/zero/gradmax, the two-head variants) share their family's hue in
shades from dark to light, so that what belongs together looks together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np
from matplotlib.colors import to_hex, to_rgb

BLUE, ORANGE, GREEN, PURPLE, VERMILLION, SKY = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9"
YELLOW, BLACK, GREY = "#F0E442", "#000000", "#7F7F7F"
# Warm hues apart: orange and vermillion shades would meet in browns if families next in line got both.
HUES = (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY)


def shades(hue: str, n: int) -> list[str]:
    """``n`` shades of ``hue``, darkest first; one shade is the hue itself."""
    if n == 1:
        return [to_hex(hue)]
    rgb = np.array(to_rgb(hue))
    # From 35 % towards black to 45 % towards white: darker and lighter stay tellable apart and visible on white.
    out = []
    for t in np.linspace(-0.35, 0.45, n):
        mixed = rgb * (1 + t) if t < 0 else rgb + (1 - rgb) * t
        out.append(to_hex(np.clip(mixed, 0, 1)))
    return out


def family_colors(names: Iterable[str], family_of: Callable[[str], str] = lambda name: name,
                  hues: tuple[str, ...] = HUES) -> dict[str, str]:
    """A colour per name: a hue per family (in order of first appearance), shades among its members.

    Parameters
    ----------
    names : iterable of str
        What to colour, in the order hues and shades are handed out.
    family_of : callable
        The family of a name (default: each name is its own family).
    hues : tuple of str
        Hues in the order families receive them (cycled when there are more families).
    """
    families: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        families.setdefault(family_of(name), []).append(name)
    colors = {}
    for i, members in enumerate(families.values()):
        colors.update(zip(members, shades(hues[i % len(hues)], len(members)), strict=True))
    return colors


def dataset_family(dataset: str) -> str:
    """A dataset's family: its name up to the first ``-`` or ``:`` (``minilm-recovery:layer=1`` → ``minilm``)."""
    return re.split(r"[-:]", str(dataset), maxsplit=1)[0]


def dataset_colors(datasets: Iterable[str]) -> dict[str, str]:
    """A hue per dataset family, shades within it."""
    return family_colors(sorted(set(datasets)), dataset_family)
