"""``growbench report``: the ablation report of a results database.

Writes, under ``out``:

- ``report.html``: one self-contained page (figures embedded as base64 PNG, inline CSS,
  no external resource; every string from the database is HTML-escaped);
- ``report.md``: the same text, linking ``figures/*.png``;
- ``figures/<name>.png`` (and ``.svg`` unless ``svg=False``);
- ``summary.csv``: one line per dataset × device × strategy (``harness.runner.sweep.summary``);
- ``recommendation.json``: the default-strategy recommendation (``harness.recommend``);
- ``training_summary.csv``: when the database holds ``growbench train`` runs, one line per
  dataset × training variant (:func:`harness.report.train_runs.training_table`), and the section
  "Growth during training" in both reports;
- ``.growbench-report.json``: the list of these files (:mod:`harness.report.output`).

The page opens with one plain answer per kind of data (:mod:`harness.report.answers`), then what to use per
regime, the advice and the evidence. Successful runs without a usable time are left out of the figures of time,
with a note in the database section (:func:`untimed_note`).

Every file is built in memory and written only once the whole report is: atomically, never through a
symlink (one in the folder is refused before anything is written). The files an earlier report wrote
and this one does not are removed, and said on stderr; no other file in the folder is touched.

A database with training runs but no successful growth-sweep run gets a report of the
training section alone. Both pages render one :class:`~harness.report.sections.Report`
(:mod:`harness.report.render`).
"""

from __future__ import annotations

import inspect
import shlex
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from growbench.harness.report.advice import advice_section
from growbench.harness.report.answers import answers_section
from growbench.harness.report.figures.ablation import ablation
from growbench.harness.report.figures.base import FigureResult, not_drawn
from growbench.harness.report.figures.formula import formula_convergence
from growbench.harness.report.figures.heldout import generalisation, statistics_tokens
from growbench.harness.report.figures.lambda_curves import loss_along_lambda
from growbench.harness.report.figures.pareto import pareto
from growbench.harness.report.figures.timing import breakdown, devices, scaling
from growbench.harness.report.names import NAMING
from growbench.harness.report.output import FIXED_FILES, ReportFiles, check_report_folder, recommendation_json
from growbench.harness.report.render import render_html, render_markdown
from growbench.harness.report.sections import Paragraph, Report, Section, figure_section
from growbench.harness.report.sweep import (
    database_facts,
    database_section,
    failed_runs,
    failed_section,
    infer_sweep,
    recommendation_sections,
    summary_section,
    summary_table,
    timing_reliability,
    what_to_use_section,
)
from growbench.harness.report.train_runs import has_training, load_training
from growbench.harness.report.training import (
    TITLE as TRAINING_TITLE,
)
from growbench.harness.report.training import (
    TrainingSection,
    build_training,
    infer_train_preset,
    training_link,
    training_sections,
)
from growbench.harness.rule.choice import Recommendation, primary_regime, recommend_regimes
from growbench.harness.rule.loading import NoResults, load_frame, untimed
from growbench.harness.store.dbfile import DatabaseFileError

# The growth sweep's figures after the Pareto front (which also needs the recommendation), in report order.
SWEEP_FIGURES: tuple[Callable[[pd.DataFrame], FigureResult], ...] = (
    generalisation, statistics_tokens, ablation, breakdown, scaling, formula_convergence, loss_along_lambda, devices)
# The figures that show time alone: runs without a time (untimed) are left out of them. The ablation keeps them: a
# pair with a time on one side only still shows its quality effects.
TIMING_FIGURES = ("pareto", "breakdown", "scaling", "devices")


def _failed(what: str, error: Exception) -> None:
    """Say on stderr that one part of the report failed (the rest is still written)."""
    print(f"growbench report: {what} failed: {type(error).__name__}: {error}", file=sys.stderr)
    traceback.print_exc(file=sys.stderr)


def _training(db, files: ReportFiles) -> tuple[TrainingSection | None, str | None]:
    """The training section of ``db`` (None without a successful training run), with its CSV staged, and the
    ``growbench train`` command that regenerates the runs when they are exactly a preset's."""
    runs, curves = load_training(db)
    if not has_training(runs):
        return None, None
    section = build_training(runs, curves)
    command = None
    if presets := infer_train_preset(runs):
        names = [repr(q) for q in presets]
        which = (f"the {names[0]} training preset's" if len(names) == 1 else
                 f"the {', '.join(names[:-1])} and {names[-1]} training presets'")
        command = "\n".join(f"growbench train --preset {p} --db {shlex.quote(str(db))}   # the training runs: "
                            f"exactly {which}" for p in presets)
    files.add_table("training_summary.csv", section.table)  # last: a section that failed leaves no CSV
    return section, command


def _sweep_figures(frame: pd.DataFrame, recs: dict[str, Recommendation], files: ReportFiles,
                   svg: bool) -> list[FigureResult]:
    """Draw and stage each figure of the growth sweep (one at a time: each is closed once rendered)."""
    def front(f: pd.DataFrame) -> FigureResult:
        return pareto(f, regimes=recs)  # each panel stars its own regime's choice

    timed = frame[~untimed(frame)]
    results = []
    for name, make in (("pareto", front), *((m.__name__, m) for m in SWEEP_FIGURES)):
        runs = timed if name in TIMING_FIGURES else frame
        # A figure that marks the default takes the recommendations: each panel marks its own regime's choice.
        marks = "regimes" in inspect.signature(make).parameters
        try:
            result = make(runs, regimes=recs) if marks else make(runs)
            files.add_figure(result, svg)  # drawing happens here: a failure to draw is this figure's alone too
        except Exception as e:  # noqa: BLE001 - one figure's failure must not lose the report
            _failed(f"figure {name}", e)
            result = not_drawn(name, e)
        results.append(result)
    return results


def untimed_note(frame: pd.DataFrame) -> str:
    """What the report does with successful runs without a time, or "" when every run has one."""
    n = int(untimed(frame).sum())
    if not n:
        return ""
    ok = int((frame.status == "ok").sum())
    return (f"{n} of {ok} successful runs have no usable time (t_total missing, infinite or not positive): they are "
            "left out of the figures of time (Pareto front, time breakdown, scaling, CPU against GPU) and of the "
            "times the rule and the tables compare; their held-out and batch measures count as any run's.")


def _done(files: ReportFiles, report: Report, figures: list[FigureResult], notes: list[str]) -> dict:
    """Stage both pages, write every file, remove the earlier report's stale ones; what the report did."""
    files.add("report.html", render_html(report))
    files.add("report.md", render_markdown(report))
    written, removed = files.write()
    if removed:
        print(f"growbench report: removed {len(removed)} file(s) the previous report in {files.out} wrote and this "
              f"one does not: {', '.join(removed)}", file=sys.stderr)
    return {"files": [str(p) for p in written], "figures": [r.name for r in figures if r.fig is not None],
            "notes": [f"{r.name}: {r.note}" for r in figures if r.fig is None] + notes,
            "removed": [str(files.out / name) for name in removed]}


def _training_only(db, files: ReportFiles, svg: bool, command: str, sweep_error: str) -> dict:
    """The report of a database with training runs and no successful growth-sweep run."""
    training, train_command = _training(db, files)
    for r in training.figures:
        files.add_figure(r, svg)
    report = Report("growbench report", f"{train_command}\n{command}" if train_command else command,
                    datetime.now(UTC).isoformat(timespec="seconds"), training_sections(training),
                    advice=advice_section(None, {}, None, training), source=str(db),
                    preamble=[Paragraph.of(f"No growth-sweep section: {sweep_error}.", style="note")])
    return _done(files, report, training.figures, [])


def _recommendations(frame: pd.DataFrame, device: str | None
                     ) -> tuple[dict[str, Recommendation], Recommendation | None, str | None]:
    """Every regime's recommendation, the primary one (the regime with the most runs, which the figures
    mark), and the error when there is none."""
    runs = frame if device is None else frame[frame.device == device]
    try:
        recs = recommend_regimes(runs)
    except ValueError as e:
        return {}, None, str(e)
    return recs, recs.get(primary_regime(runs).key), None


def _database(frame: pd.DataFrame, db, training: TrainingSection | None) -> Section:
    """The database section: its facts, the timing noise, and the training runs it also holds."""
    facts = database_facts(frame, str(db))
    facts["timing noise"] = timing_reliability(frame)
    extra: list = [Paragraph.of(note, style="note")] if (note := untimed_note(frame)) else []
    if training:
        facts["training runs"] = (f"{training.facts['training runs']} ({training.facts['ok']} ok, "
                                  f"{training.facts['failed']} failed): see {TRAINING_TITLE}")
        extra.append(Paragraph.of("The database also holds training runs: see ", training_link(), "."))
    return database_section(facts, extra)


def build_report(db: str | Path, out: str | Path = "reports", *, svg: bool = True, command: str | None = None,
                 device: str | None = None) -> dict:
    """Write the report of ``db`` under ``out``; return ``{"files": [...], "figures": [...], "notes": [...]}``.

    When ``db`` holds ``growbench train`` runs, the report gains the section "Growth during
    training" and ``training_summary.csv``; when it holds training runs but no successful
    growth-sweep run, the report has that section only.

    Raises :class:`harness.recommend.NoResults` (a ``ValueError``) when the database is missing,
    empty or holds no successful run (of the growth sweep, nor of training), and
    :class:`harness.files.OutputFileError` (a ``ValueError``), before anything is written, when ``out``,
    ``out/figures`` or a file the report writes is a symlink (:func:`~.output.check_report_folder`).
    """
    out = Path(out)
    check_report_folder(out, FIXED_FILES)  # before the work; every file is checked again before anything is written
    files = ReportFiles(out)
    try:
        frame = load_frame(db)
    except NoResults as e:
        if not has_training(load_training(db)[0]):
            raise
        frame, sweep_error = None, str(e)
    command = command or f"growbench report --db {shlex.quote(str(db))} --out {shlex.quote(str(out))}"
    if frame is None:
        return _training_only(db, files, svg, command, sweep_error)
    notes = []
    try:
        training, train_command = _training(db, files)
    except DatabaseFileError:
        raise  # the user's file is at fault, not the report: one line, exit 2, like the sweep's table
    except Exception as e:  # noqa: BLE001 - the training section's failure must not lose the sweep's report
        _failed("training section", e)
        training, train_command = None, None
        notes.append(f"training: the section could not be built: {type(e).__name__}: {e}")
    preset = infer_sweep(frame)
    command = f"{train_command}\n{command}" if train_command else command
    if preset:
        command = (f"growbench run --preset {preset} --db {shlex.quote(str(db))}   # the database: "
                   f"its runs are exactly the '{preset}' sweep's\n{command}")

    recs, rec, rec_error = _recommendations(frame, device)
    results = _sweep_figures(frame, recs, files, svg)
    train_figures = training.figures if training else []
    for r in train_figures:
        files.add_figure(r, svg)
    summary = summary_table(frame)
    files.add_table("summary.csv", summary)
    files.add("recommendation.json", recommendation_json(recs, rec_error, str(db)))

    regime_sections = [section for i, r in enumerate(recs.values() or [None])
                       for section in recommendation_sections(r, rec_error, "recommendation" if i == 0 else "")]
    sections = [_database(frame, db, training), *regime_sections,
                *(figure_section(r) for r in results), summary_section(summary), failed_section(failed_runs(frame)),
                *(training_sections(training) if training else [])]
    report = Report("growbench ablation report", command, datetime.now(UTC).isoformat(timespec="seconds"), sections,
                    advice=advice_section(frame, recs, rec_error, training), preamble=[Paragraph.of(NAMING)],
                    lead=[s for s in (answers_section(recs, frame), what_to_use_section(recs, rec_error)) if s])
    return _done(files, report, results + train_figures, notes)
