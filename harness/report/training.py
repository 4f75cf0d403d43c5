"""The report's section "Growth during training": ``growbench train`` runs as figures, a verdict and tables.

Everything is computed from the ``train_runs`` and ``train_curves`` tables
(:func:`harness.store.training.load`); nothing here writes files (:mod:`harness.report.build`
writes the figures and ``training_summary.csv``).
"""

from __future__ import annotations

import itertools
import sys
import traceback
from dataclasses import dataclass, field

import pandas as pd

from growbench.harness.report.figures.base import FigureResult, not_drawn
from growbench.harness.report.figures.training import training_curves, training_variants
from growbench.harness.report.sections import (
    Bullet,
    Bullets,
    Facts,
    Link,
    Paragraph,
    Section,
    Span,
    Table,
    figure_section,
)
from growbench.harness.report.train_runs import failed_training_runs, prepare, training_table
from growbench.harness.report.train_verdict import (
    ScheduleComparison,
    Verdict,
    overall_text,
    schedule_comparisons,
    verdicts,
)
from growbench.harness.report.wording import distinct, finished_range
from growbench.harness.runner.train_sweep import train_presets
from growbench.harness.train import config_fields

TITLE, ANCHOR = "Growth during training", "training"
FAILED_TITLE, FAILED_ANCHOR = "Failed training runs", "training-failed"
INTRO = ("Each training run trains a fresh model of the dataset with Adam, starting from d_k0 and growing every "
         "grow_every steps by p columns until d_k_max with the run's method (default: the default growth strategy; "
         "random, zero, gradmax: baselines), next to fixed-size models at d_k0 (fixed-small) and d_k_max "
         "(fixed-large). On the real pretrained model (the minilm-* panels with narrow=layer or narrow=all), the "
         "model is all-MiniLM-L6-v2: every head of the chosen layers is narrowed to the best rank-d_k0 factors of "
         "its pretrained query/key product, and only those factors are trained, by distillation to the original "
         "model's output (minilm-recovery) or on its contrastive objective (minilm-similarity); fixed-large starts "
         "from the best rank-d_k_max factors. FLOPs count every training step and every growth; wall time excludes "
         "the held-out evaluation and the making of batches. All numbers are medians over seeds.")
DISPLAY = {"final_heldout": "final held-out", "best_heldout": "best held-out",
           "final_vs_fixed_large": "final / fixed-large", "wall_s": "wall (s)", "total_flops": "total FLOPs",
           "growth_flops_share": "growth FLOPs share", "n_growths": "growths", "final_d_k": "final d_k"}


@dataclass
class TrainingSection:
    """Everything the report shows about training; ``figures`` are not yet written (``png`` empty)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    verdicts: list[Verdict]
    figures: list[FigureResult]
    failed: pd.DataFrame
    facts: dict
    notes: list[str] = field(default_factory=list)
    schedules: list[ScheduleComparison] = field(default_factory=list)


def training_facts(runs: pd.DataFrame, superseded: int = 0) -> dict:
    """What the training tables hold: counts, datasets, devices, environment; ``superseded`` runs (an
    identical configuration run again, see :func:`harness.report.train_runs.latest_runs`) are named when
    there are any."""
    facts = {
        "training runs": len(runs), "ok": int((runs.status == "ok").sum()), "failed": int((runs.status != "ok").sum()),
        "datasets": distinct(runs, "dataset"), "variants": runs.variant.nunique(), "steps": distinct(runs, "steps"),
        "devices": distinct(runs, "device"), "cpu kernels": distinct(runs, "cpu_capability"),
        "torch": distinct(runs, "torch_version"),
        "git commit": distinct(runs, "git_commit"), "code version": distinct(runs, "code_version"),
        "runs finished": finished_range(runs),
    }
    if superseded:
        facts["superseded runs"] = (f"{superseded} (the same configuration stored again, e.g. under a newer code "
                                    "version: only the latest successful run of each configuration counts)")
    return facts


def infer_train_preset(runs: pd.DataFrame) -> list[str] | None:
    """The fewest ``growbench train`` presets, run into the same database, whose configurations together are
    exactly the database's, if any."""
    try:
        have = {tuple(r) for r in runs[config_fields()].astype(str).itertuples(index=False)}
        sets = {name: {tuple(str(v) for v in c.as_dict().values()) for c in configs}
                for name, configs in train_presets().items()}
        for k in range(1, len(sets) + 1):
            for combination in itertools.combinations(sets.items(), k):
                if have == set().union(*(configs for _, configs in combination)):
                    return [name for name, _ in combination]
    except Exception:  # noqa: BLE001 - only a convenience for the report's first lines
        return None
    return None


def build_training(runs: pd.DataFrame, curves: pd.DataFrame, *, figures: bool = True) -> TrainingSection:
    """Figures, table, verdicts and failures of the training runs.

    Parameters
    ----------
    runs, curves : pandas.DataFrame
        As from :func:`harness.report.train_runs.load_training`.
    figures : bool
        Draw the figures (without, ``figures`` is empty: the numbers alone are much faster).

    Returns
    -------
    TrainingSection
        A figure that cannot be drawn becomes a note in its place; it never loses the section.
    """
    stored = len(runs)
    runs = prepare(runs)
    table = training_table(runs)
    drawn = []
    for make in (training_curves, training_variants) if figures else ():
        try:
            drawn.append(make(runs, curves, table))
        except Exception as e:  # noqa: BLE001 - one figure's failure must not lose the report
            print(f"growbench report: figure {make.__name__} failed: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            drawn.append(not_drawn(make.__name__, e))
    return TrainingSection(runs=runs, table=table, verdicts=verdicts(runs, table, curves), figures=drawn,
                           failed=failed_training_runs(runs), facts=training_facts(runs, stored - len(runs)),
                           schedules=schedule_comparisons(runs))


def training_link() -> Link:
    """A link to the training section (from the growth-sweep's database facts)."""
    return Link(TITLE, ANCHOR, TITLE)


def training_sections(section: TrainingSection) -> list[Section]:
    """The training section and its subsections, as the report shows them."""
    facts = section.facts
    head = [Paragraph.of(INTRO), Facts(facts)]
    if facts["failed"]:
        head.append(Paragraph.of(Span(f"{facts['failed']} of {facts['training runs']} training runs failed", "strong"),
                                 ": see ", Link("failed training runs", FAILED_ANCHOR, FAILED_TITLE), ".",
                                 style="note"))
    verdict = [Paragraph.of(overall_text(section.verdicts)),
               Bullets([*(Bullet((Span(v.dataset, "strong"),), tuple(v.parts)) for v in section.verdicts),
                        *(Bullet((Span(f"{c.dataset}, two schedules", "strong"),), (c.text,))
                          for c in section.schedules)])]
    table = [Paragraph.of("Also in ", Span("training_summary.csv", "file"), ". ", Span("final / fixed-large", "code"),
                          ": median final held-out loss over fixed-large's; growth FLOPs share: growth FLOPs / total "
                          "FLOPs (median over runs); the comparison column names the groups a variant belongs to."),
             Table(section.table.rename(columns=DISPLAY), small=True)]
    failed = ([Table(section.failed, wide=("error",))] if len(section.failed) else
              [Paragraph.of("None: every training run succeeded.")])
    return [Section(TITLE, head, anchor=ANCHOR), Section("Verdict", verdict, level=3, anchor="training-verdict"),
            *(figure_section(r, level=3) for r in section.figures),
            Section("Medians over seeds per dataset and variant", table, level=3),
            Section(FAILED_TITLE, failed, level=3, anchor=FAILED_ANCHOR)]
