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
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.transforms import Bbox, offset_copy  # noqa: E402

#: The widest a figure is drawn (inches at 100 dpi): the page shows it at 800 px or less, so that every text of
#: :data:`MIN_FONT_PT` points or more stays at least 9 px high there.
MAX_WIDTH_IN = 11.5
#: The smallest font of any text in a figure (tick labels, point names, bar labels), in points.
MIN_FONT_PT = 9.5


@dataclass
class FigureResult:
    """One figure of the report, or the note saying why it was not drawn (``fig`` None).

    ``caption`` is two sentences (what is drawn, what it shows); ``table`` holds the numbers behind
    them (its ``wide`` columns wrap as prose, ``formats`` maps a column to its number format, see
    :class:`harness.report.sections.Table`); ``details`` are statements per dataset, one list item
    each; ``data`` is what was plotted; ``png`` is filled once the figure is written, and ``svg`` is set
    when its SVG is written beside the PNG (``figures/<name>.svg``, which both pages then link to zoom).
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
    svg: bool = False


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


#: Seed of the strip plots' jitter: the same database draws the same figure, bit for bit.
JITTER_SEED = 0


def strip_plot(**kwargs) -> plt.Axes:
    """``seaborn.stripplot(**kwargs)`` with its jitter drawn from :data:`JITTER_SEED`.

    seaborn draws the jitter from numpy's global generator: each report drew its dots elsewhere (a new PNG and SVG
    for the same runs). The global state is put back as it was.
    """
    state = np.random.get_state()
    np.random.seed(JITTER_SEED)
    try:
        return sns.stripplot(**kwargs)
    finally:
        np.random.set_state(state)


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
    which.set_major_formatter(mticker.FuncFormatter(_power_of_two_label if base == 2 else lambda v, _: f"{v:g}"))
    which.set_minor_formatter(mticker.NullFormatter())


def si_ticks(axis) -> None:
    """Tick labels with SI prefixes (``500 G``, ``1.5 T``) on ``axis`` (an x or y axis of a panel, or a secondary
    axis): matplotlib would otherwise write large numbers with an offset text (``1e12``) set at the axis's end,
    where it runs into the axis label."""
    axis.set_major_formatter(mticker.EngFormatter(sep=" "))


def _power_of_two_label(value: float, _position=None) -> str:
    """``1/16`` rather than ``0.0625`` below one (a ratio reads as a fraction), ``v:g`` from one."""
    if 0 < value < 1 and float(1 / value).is_integer():
        return f"1/{1 / value:g}"
    return f"{value:g}"


def cover_powers(ax: plt.Axes, values, axis: str = "x", base: float = 2) -> None:
    """Limits of a log axis from the power of ``base`` at or below the smallest of ``values`` to the one at or above
    the largest, with a margin: every point then lies between two labelled ticks, none left of the first."""
    positive = [float(v) for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return
    low = base ** math.floor(math.log(min(positive), base) + 1e-9)
    high = base ** math.ceil(math.log(max(positive), base) - 1e-9)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(low / base ** 0.25, high * base ** 0.25)


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
    """One name for points drawn within ``within`` pixels of one another (one line each), in their colour or,
    when they differ, dark grey: separate names for markers that cover one another could only go far from them."""
    merged: list[list] = []
    for x, y, text, color in points:
        px, py = ax.transData.transform((x, y))
        for group in merged:
            if abs(group[4] - px) <= within and abs(group[5] - py) <= within:
                group[2] += f"\n{text}"  # stacked: a long line of names could not fit beside a panel's edge
                group[3] = group[3] if group[3] == color else MIXED_COLOR
                break
        else:
            merged.append([x, y, text, color, px, py])
    return [(x, y, text, color) for x, y, text, color, _, _ in merged]


#: Where a name may go, as directions and distances (pixels) of its nearest corner or edge from its point: above
#: first, then beside, then below, nearer before farther.
_DIRECTIONS = ((0, 1), (1, 1), (-1, 1), (1, 0), (-1, 0), (1, -1), (-1, -1), (0, -1))
_DISTANCES = (8, 20, 34, 50, 70, 95)


def _candidates(width: float, height: float):
    """Each place of a ``width`` × ``height`` name around a point at the origin, as the lower left corner (x0, y0)
    of its box, in the order they are tried."""
    for distance in _DISTANCES:
        for dx, dy in _DIRECTIONS:
            x0 = -width / 2 if dx == 0 else distance * 0.8 if dx > 0 else -distance * 0.8 - width
            y0 = -height / 2 if dy == 0 else distance * 0.6 if dy > 0 else -distance * 0.6 - height
            yield x0, y0


def _overlap(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def label_points(ax: plt.Axes, points: list[tuple[float, float, str, str]], obstacles: list[Bbox],
                 fontsize: float = MIN_FONT_PT) -> None:
    """Name a few of the plotted points, each where it covers no marker, bar or other name and stays inside the
    panel, with a leader line when it is not right beside its point.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel; call once its limits and layout are final (names are placed in screen space).
    points : list of (x, y, text, colour)
        The points to name (a handful: the places tried are near each point).
    obstacles : list of Bbox
        What the names must not cover (:func:`obstacle_boxes`).
    """
    if not points:
        return
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer).padded(-4)
    taken = [Bbox(ax.transData.transform(box.get_points())) for box in obstacles]
    sized = []
    for x, y, text, color in _merge_coincident(ax, points):
        probe = ax.text(0, 0, text, fontsize=fontsize, transform=None)
        sized.append((x, y, text, color, probe.get_window_extent(renderer)))
        probe.remove()
    # The largest first: a long name fits in fewer places, and a short one placed before it could take its only one
    for x, y, text, color, size in sorted(sized, key=lambda s: -s[4].width * s[4].height):
        px, py = ax.transData.transform((x, y))
        # The first free place; where none is, the one covering least (outside the panel never).
        best, best_cost = None, math.inf
        for x0, y0 in _candidates(size.width + 2, size.height + 2):
            box = Bbox.from_bounds(px + x0, py + y0, size.width + 2, size.height + 2)
            if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
                continue
            cost = sum(_overlap(box, other) for other in taken)
            if cost < best_cost:
                best, best_cost = box, cost
                if cost == 0:
                    break
        if best is None:  # larger than the panel: left where it is, clipped by the panel rather than the page
            best = Bbox.from_bounds(px - size.width / 2, py + 8, size.width, size.height)
        taken.append(best)
        centre = ((best.x0 + best.x1) / 2 - px, (best.y0 + best.y1) / 2 - py)
        ax.text(x, y, text, transform=_shifted(ax, centre), ha="center", va="center", fontsize=fontsize, color=color,
                clip_on=True)
        if abs(centre[0]) > best.width / 2 + 12 or abs(centre[1]) > best.height / 2 + 12:  # not right beside it
            edge = (min(max(px, best.x0), best.x1) - px, min(max(py, best.y0), best.y1) - py)
            ax.annotate("", (x, y), xytext=(x, y), textcoords=_shifted(ax, edge), arrowprops=dict(
                arrowstyle="-", color="#555555", lw=0.6, alpha=0.8, shrinkA=0, shrinkB=3))


def _shifted(ax: plt.Axes, pixels: tuple[float, float]):
    """Data coordinates moved by ``pixels`` of the screen, in points: the SVG is drawn at another resolution than the
    screen the names were placed on, and points keep the same place in both."""
    return offset_copy(ax.transData, fig=ax.figure, x=pixels[0] * 72 / ax.figure.dpi,
                       y=pixels[1] * 72 / ax.figure.dpi, units="points")
