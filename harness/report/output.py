"""The report's files besides its two pages: figures, the recommendation, and removing stale files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib.pyplot as plt

from harness.recommend import Recommendation, replace_file
from harness.report.figures.base import FigureResult

# Files an earlier report may have left in the output folder (the figures are found by extension).
DATA_FILES = ("summary.csv", "recommendation.json", "training_summary.csv")


def write_figure(result: FigureResult, figdir: Path, svg: bool) -> list[Path]:
    """Write a drawn figure as PNG (kept in ``result.png`` for the HTML page) and SVG, then close it.

    Returns
    -------
    list of Path
        The files written; none when the figure was not drawn.
    """
    if result.fig is None:
        return []
    buffer = io.BytesIO()
    result.fig.savefig(buffer, format="png", dpi=100)
    result.png = buffer.getvalue()
    written = [figdir / f"{result.name}.png"]
    written[0].write_bytes(result.png)
    if svg:
        result.fig.savefig(figdir / f"{result.name}.svg", format="svg")
        written.append(figdir / f"{result.name}.svg")
    plt.close(result.fig)
    return written


def remove_stale(out: Path, figdir: Path, written: list[Path]) -> None:
    """Remove what an earlier report in ``out`` wrote and this one does not: it would be stale."""
    drawn = {p.name for p in written}
    for old in [*figdir.glob("*.png"), *figdir.glob("*.svg")]:
        if old.name not in drawn:
            old.unlink()
    for name in DATA_FILES:
        if (out / name) not in written and (out / name).is_file():
            (out / name).unlink()


def write_recommendation(path: Path, recs: dict[str, Recommendation], error: str | None, db: str) -> Path:
    """``recommendation.json``: per regime, the recommendation with its table and reference configurations
    (the shape of ``strategies/default.json``, plus the tables), or the error."""
    if not recs:
        data = {"regimes": {}, "error": error}
    else:
        data = {"rule": next(iter(recs.values())).rule, "regimes": {}, "db": db}
        for key, rec in recs.items():
            entry = rec.as_json(db)
            entry["table"] = json.loads(rec.table.to_json(orient="records"))
            entry["reference_configurations"] = rec.cells
            data["regimes"][key] = entry
    replace_file(path, json.dumps(data, indent=2) + "\n")
    return path
