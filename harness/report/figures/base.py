"""What every figure of the report shares: its result type, the theme, facets, legends, log ticks and labels.

Nothing here writes files: :mod:`harness.report.output` writes the figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # before pyplot: the report draws off-screen, on machines without a display

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from adjustText import adjust_text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402


@dataclass
class FigureResult:
    """One figure of the report, or the note saying why it was not drawn (``fig`` None).

    ``caption`` is two sentences (what is drawn, what it shows); ``table`` holds the numbers behind
    them (its ``wide`` columns wrap as prose, ``formats`` maps a column to its number format, see
    :class:`harness.report.sections.Table`); ``details`` are statements per dataset, one list item
    each; ``data`` is what was plotted; ``png`` is filled once the figure is written.
    """

    name: str
    title: str
    caption: str = ""
    fig: plt.Figure | None = None
    note: str = ""
    data: pd.DataFrame = field(default_factory=pd.DataFrame)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    wide: tuple[str, ...] = ()
    formats: dict[str, str] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    png: bytes = b""


def not_drawn(name: str, error: Exception) -> FigureResult:
    """The note that stands in for a figure whose drawing raised ``error``."""
    return FigureResult(name, f"figure {name}", note=f"This figure could not be drawn: {type(error).__name__}: {error}")


def stored_extra(value) -> dict:
    """A run's ``extra`` column as a dict (stored as JSON text; ``{}`` when unreadable)."""
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if isinstance(value, str) else {}
    except (TypeError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def theme() -> None:
    """The report's plot style; font sizes chosen to stay legible when the page is 800 px wide."""
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.2)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.titleweight": "bold", "svg.fonttype": "path"})


def plain_text(text: object) -> str:
    """A string from the database made safe for matplotlib text (no mathtext)."""
    return str(text).replace("$", r"\$")


def panel_title(name: object, width: int = 24) -> str:
    """A panel's title from a database name, broken at its ``:`` parts when longer than ``width`` characters
    (``minilm-recovery:layer=1:head=3``), so that neighbouring panels' titles never meet."""
    text = plain_text(name)
    if len(text) <= width or ":" not in text:
        return text
    head, _, rest = text.partition(":")
    return f"{head}\n{rest}"


def facets(n: int, ncols: int = 2, size: tuple[float, float] = (6.2, 4.4)) -> tuple[plt.Figure, list[plt.Axes]]:
    """A grid of ``n`` panels, ``ncols`` wide; the unused cells of the last row are hidden."""
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def legend_entries(axes) -> dict[str, object]:
    """``{label: handle}`` over every panel, first occurrence kept, in drawing order."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    return entries


def bottom_legend(fig: plt.Figure, axes, ncol: int, title: str | None = None, top: float = 1.0) -> None:
    """One legend for every panel, centred below them; the figure grows by the legend's height.

    Parameters
    ----------
    fig, axes
        The figure and its panels (their labelled artists make the legend).
    ncol : int
        Entries per legend row (fewer when there are fewer entries).
    title : str, optional
        The legend's title.
    top : float
        Fraction of the figure's height above which the panels must not go (a suptitle's room).
    """
    entries = legend_entries(axes)
    ncol = max(1, min(ncol, len(entries)))
    rows = math.ceil(len(entries) / ncol) + (1 if title else 0)
    # About a quarter inch per legend row, added to the figure so that the panels keep their size.
    legend_height = 0.25 + 0.27 * rows
    panels_height = fig.get_figheight()
    fig.set_figheight(panels_height + legend_height)
    fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=ncol, frameon=False, title=title)
    top_margin = (1 - top) * panels_height
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 1 - top_margin / fig.get_figheight()))


def log_axis(ax: plt.Axes, axis: str = "x", base: float = 10) -> None:
    """A log scale whose tick labels are plain numbers that never run into one another.

    Matplotlib labels minor ticks of a log axis spanning less than a decade or so, in mathtext
    (``3×10⁰``), and they collide; here only 1-2-5 steps (or powers of ``base``) are labelled.
    """
    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    if base == 10:
        low, high = (ax.get_xlim() if axis == "x" else ax.get_ylim())
        decades = math.log10(high / low) if low > 0 and high > low else 3
        subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
        which.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    else:
        which.set_major_locator(mticker.LogLocator(base=base))
    which.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(mticker.NullFormatter())


def obstacle_boxes(ax: plt.Axes, shapes: list[tuple[float, float, float, float, float]]) -> list[Bbox]:
    """Data-coordinate boxes around drawn shapes: each ``(x0, y0, x1, y1, pad)`` is a rectangle in data
    coordinates (a point when x0 == x1 and y0 == y1, an error bar when one side is flat) grown by ``pad``
    pixels on every side (a marker's radius, a bar's half width). Call once the layout is final."""
    to_display, to_data = ax.transData, ax.transData.inverted()
    boxes = []
    for x0, y0, x1, y1, pad in shapes:
        (left, bottom), (right, top) = to_display.transform([(x0, y0), (x1, y1)])
        corners = to_data.transform([(min(left, right) - pad, min(bottom, top) - pad),
                                     (max(left, right) + pad, max(bottom, top) + pad)])
        boxes.append(Bbox(corners))
    return boxes


MIXED_COLOR = "#333333"  # the name of coincident points of different colours


def _merge_coincident(ax: plt.Axes, points: list[tuple[float, float, str, str]],
                      within: float = 6.0) -> list[tuple[float, float, str, str]]:
    """One name for points drawn within ``within`` pixels of one another ("zero, random"), in their colour or,
    when they differ, dark grey: separate names for markers that cover one another could only go far from them."""
    merged: list[list] = []
    for x, y, text, color in points:
        px, py = ax.transData.transform((x, y))
        for group in merged:
            if abs(group[4] - px) <= within and abs(group[5] - py) <= within:
                group[2] += f", {text}"
                group[3] = group[3] if group[3] == color else MIXED_COLOR
                break
        else:
            merged.append([x, y, text, color, px, py])
    return [(x, y, text, color) for x, y, text, color, _, _ in merged]


def label_points(ax: plt.Axes, points: list[tuple[float, float, str, str]], obstacles: list[Bbox],
                 fontsize: float = 9) -> None:
    """Name some of the plotted points, moving the names off every marker and bar and off one another.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel; call once its limits and layout are final (names are placed in screen space).
    points : list of (x, y, text, colour)
        The points to name.
    obstacles : list of Bbox
        What the names must not cover (:func:`obstacle_boxes`).
    """
    if not points:
        return
    points = _merge_coincident(ax, points)
    # Names start just above their points (every panel keeps room at the top), which the solver then spreads.
    to_display, to_data = ax.transData, ax.transData.inverted()
    starts = to_data.transform(to_display.transform([(x, y) for x, y, _, _ in points]) + [0, 12])
    texts = [ax.text(sx, sy, text, fontsize=fontsize, color=color, ha="center")
             for (sx, sy), (_, _, text, color) in zip(starts, points, strict=True)]
    # Bounded: adjust_text iterates until nothing overlaps, which a crowded panel may never reach.
    # No pull back towards the points: a name may go as far as it must to cover nothing (a leader line follows it).
    adjust_text(texts, target_x=[p[0] for p in points], target_y=[p[1] for p in points], objects=obstacles, ax=ax,
                expand=(1.15, 1.4), force_static=(0.4, 0.6), force_text=(0.3, 0.5), force_pull=(0.0, 0.0),
                prevent_crossings=False, ensure_inside_axes=True, iter_lim=600,
                arrowprops=dict(arrowstyle="-", color="#555555", lw=0.6, alpha=0.8), min_arrow_len=6)
