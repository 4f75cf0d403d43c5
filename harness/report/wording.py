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


#: Units of a duration, each with its size in ms and the value from which the next unit takes over.
_TIME_UNITS = (("µs", 1e-3, 1000), ("ms", 1.0, 1000), ("s", 1e3, 60), ("min", 6e4, 60), ("h", 3.6e6, math.inf))


def duration(ms: float | None) -> str:
    """A duration given in milliseconds, three significant digits in the unit that keeps it readable.

    Examples
    --------
    >>> duration(0.25), duration(12.34), duration(3240.0), duration(95_000.0)
    ('250 µs', '12.3 ms', '3.24 s', '1.58 min')
    """
    if ms is None or not math.isfinite(ms):
        return "n/a"
    if ms == 0:
        return "0 ms"
    # The first unit in which the rounded value stays below the next unit's: 999.7 ms is "1 s", not "1e+03 ms".
    unit, size = next((unit, size) for unit, size, next_from in _TIME_UNITS[0 if abs(ms) < 1 else 1:]
                      if abs(float(f"{ms / size:.3g}")) < next_from)
    return f"{ms / size:.3g} {unit}"


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
