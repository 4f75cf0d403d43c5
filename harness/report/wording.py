"""Numbers and counts as the report writes them: one format per kind of number, shared by every section."""

from __future__ import annotations

import math

import pandas as pd


def plural(n: int, noun: str) -> str:
    """A count with its noun in the right number.

    Examples
    --------
    >>> plural(1, "seed"), plural(3, "seed")
    ('1 seed', '3 seeds')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def four_digits(value: float | None) -> str:
    """A loss or other measured value: four significant digits, ``n/a`` when missing."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def three_digits(value: float | None) -> str:
    """A FLOP count or another large magnitude: three significant digits, ``n/a`` when missing."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"


def ratio(value: float) -> str:
    """A ratio with three decimals, or three significant digits when it is far below one."""
    return "n/a" if not math.isfinite(value) else f"{value:.3f}" if abs(value) >= 0.01 else f"{value:.3g}"


def signed(value: float, fmt: str) -> str:
    """``value`` with its sign, without a negative zero ("-0.000" reads as a loss)."""
    text = format(value, "+" + fmt)
    return text.replace("-", "+", 1) if float(text) == 0 else text


def times(factor: float) -> str:
    """A speed factor: ``2.9×`` below ten, ``12×`` from ten."""
    return f"{factor:.1f}×" if factor < 10 else f"{factor:.0f}×"


def listing(items: list[str]) -> str:
    """Items joined by commas, or ``none``."""
    return ", ".join(items) if items else "none"


def first_line(error: object) -> str:
    """The first line of a stored error message ("" when there is none)."""
    return str(error).strip().splitlines()[0] if isinstance(error, str) and error.strip() else ""


def distinct(frame: pd.DataFrame, column: str) -> str:
    """The distinct values of a column, sorted, comma-separated (``–`` when there are none)."""
    if column not in frame:
        return "–"
    return ", ".join(sorted({str(v) for v in frame[column].dropna().unique()})) or "–"


def finished_range(frame: pd.DataFrame) -> str:
    """``first – last`` of the runs' ``finished_at`` timestamps."""
    if "finished_at" not in frame:
        return "–"
    return f"{frame.finished_at.dropna().min()} – {frame.finished_at.dropna().max()}"
