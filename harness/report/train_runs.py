"""``growbench train`` runs as the report reads them: loaded, one per configuration, grouped into panels,
and summarised as medians over seeds (a table per dataset × variant, median curves per step).

Runs are grouped by *panel*: the dataset, with the sizes appended when one database holds the same
dataset at several sizes, and the schedule when it holds one variant at several schedules (medians never mix
them).
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from growbench.harness.report.wording import first_line
from growbench.harness.runner.train_sweep import variant_names
from growbench.harness.store.training import load
from growbench.harness.train import config_fields, tokens_per_step

MAIN_METHODS = ("default", "random", "zero", "gradmax", "fixed-small", "fixed-large")
BASELINES = ("random", "zero", "gradmax")
# Variants compared with one another (in the table's ``comparison`` column, the variants
# figure's details and the verdict). The first name of each group is its reference.
COMPARISONS = (
    ("scale policy (default)", ("default", "default fixed", "default learnable")),
    ("scale policy (fixed-large)", ("fixed-large", "fixed-large fixed", "fixed-large learnable")),
    ("Adam state", ("default", "default reset")),
    ("trigger", ("default", "default bottleneck")),
    ("two heads", ("default h=2", "default h=2 budget", "fixed-large h=2", "fixed-small h=2")),
)
# Settings that no variant of one design changes: runs that differ in any of them are different panels.
SETUP_FIELDS = ("d_s", "d_e", "b", "d_k0", "steps", "lr", "eval_every", "stats_batches", "device", "dtype")
# The growth schedule, which some variants of one design change: runs of one variant that differ in it are
# different panels.
SCHEDULE_FIELDS = ("d_k_max", "p", "grow_every")
TABLE_COLUMNS = ["dataset", "variant", "comparison", "seeds", "failed", "final_heldout", "best_heldout",
                 "final_vs_fixed_large", "wall_s", "total_flops", "growth_flops_share", "n_growths", "final_d_k"]
CURVE_COLUMNS = ["panel", "variant", "step", "tokens", "flops", "wall_s", "heldout", "lo", "hi", "seeds"]
# Columns of a run the report reads, present even in a database written before some of them existed.
RUN_COLUMNS = ("status", "error", "final_heldout", "best_heldout", "wall_s", "total_flops", "growth_flops",
               "n_growths", "final_d_k", "events")


def load_training(db_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, curves)`` of the database; two empty frames when it has no readable training tables."""
    try:
        return load(db_path)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError):
        # Not a database at all: the growth-sweep loader reports that; here there is simply no training.
        return pd.DataFrame(), pd.DataFrame()


def has_training(runs: pd.DataFrame) -> bool:
    """Whether ``runs`` holds at least one successful training run."""
    return not runs.empty and bool((runs.status == "ok").any())


def stored_json(value, default):
    """A JSON column's value (a list or dict), ``default`` when it is missing or unreadable."""
    if isinstance(value, list | dict):
        return value
    try:
        return json.loads(value) if isinstance(value, str) else default
    except (TypeError, ValueError):
        return default


def _width(value) -> str:
    """A stored final width (JSON list per head) as text: ``8``, ``4, 4`` for two heads, ``16 ×12`` for twelve
    heads of one width (the real model's narrowed layer)."""
    w = stored_json(value, value)
    if isinstance(w, list) and len(w) > 2 and len(set(w)) == 1:
        return f"{w[0]} ×{len(w)}"
    return ", ".join(str(x) for x in w) if isinstance(w, list) else str(w)


def is_main(variant: str) -> bool:
    """Whether ``variant`` is a method at default settings (one head, no changed setting)."""
    return variant in MAIN_METHODS or " " not in variant


def latest_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per configuration: a database resumed after the code changed holds the same configuration
    under several code versions (several keys); the most recently finished successful run counts (or,
    without one, the most recent failure), so that a seed is never counted twice."""
    if runs.empty:
        return runs.copy()
    cols = [c for c in config_fields() if c in runs]
    order = runs.assign(_ok=runs.status == "ok", _at=runs.get("finished_at", pd.Series("", index=runs.index))
                        .fillna("").astype(str))
    order = order.sort_values(["_ok", "_at"], kind="stable")
    keep = ~order[cols].astype(str).duplicated(keep="last")
    return order[keep].drop(columns=["_ok", "_at"]).sort_index().copy()


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`latest_runs` of ``runs`` with ``variant``, ``panel`` (dataset, plus sizes or schedule where a dataset
    has several) and ``growth_flops_share`` columns; rows sorted by panel, variant and seed."""
    runs = runs.reindex(columns=list(dict.fromkeys([*runs.columns, *config_fields(), *RUN_COLUMNS])))
    runs = latest_runs(runs)
    runs["variant"] = variant_names(runs) if len(runs) else pd.Series(dtype=str)
    runs["panel"] = runs.dataset.astype(str)
    for ds, same in runs.groupby("dataset", sort=False):
        differ = [f for f in SETUP_FIELDS if same[f].astype(str).nunique() > 1]
        # A variant may change the schedule (the bottleneck trigger, two heads), but one variant at two schedules
        # is two designs (the real model grown in four growths or in one).
        differ += [f for f in SCHEDULE_FIELDS if same.groupby("variant")[f].nunique(dropna=False).max() > 1]
        if differ:
            labels = [", ".join(f"{f}={v}" for f, v in zip(differ, vals, strict=True))
                      for vals in same[differ].itertuples(index=False)]
            runs.loc[same.index, "panel"] = [f"{ds} ({label})" for label in labels]
    total = pd.to_numeric(runs.total_flops, errors="coerce")
    runs["growth_flops_share"] = np.where(total > 0, pd.to_numeric(runs.growth_flops, errors="coerce") / total,
                                          np.nan)
    return runs.sort_values(["panel", "variant", "seed"], kind="stable").reset_index(drop=True)


def variant_order(variants) -> list[str]:
    """Main methods first (in MAIN_METHODS order), then the compared variants by group, then the rest."""
    present = set(variants)
    order = [v for v in MAIN_METHODS if v in present]
    order += sorted(v for v in present if is_main(v) and v not in order)
    for _, names in COMPARISONS:
        order += [v for v in names if v in present and v not in order]
    return order + sorted(v for v in present if v not in order)


def _comparison(variant: str, present: set[str]) -> str:
    """The groups ``variant`` is compared in, among those with two or more of their variants ``present``."""
    groups = [g for g, names in COMPARISONS if variant in names and len(present & set(names)) >= 2]
    if is_main(variant):
        return "method" + ("; reference of " + ", ".join(groups) if groups else "")
    return ", ".join(groups)


def _median(runs: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(runs[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else math.nan


def _variant_row(panel: str, variant: str, runs: pd.DataFrame, reference_final: float, present: set[str]) -> dict:
    """One table row: the medians over the successful runs of ``variant`` in ``panel``."""
    ok = runs[runs.status == "ok"]
    final = _median(ok, "final_heldout")
    widths = ok.final_d_k.map(_width).mode()
    return {
        "dataset": panel, "variant": variant, "comparison": _comparison(variant, present), "seeds": len(ok),
        "failed": int((runs.status != "ok").sum()), "final_heldout": final, "best_heldout": _median(ok, "best_heldout"),
        "final_vs_fixed_large": (final / reference_final if reference_final and math.isfinite(reference_final)
                                 else math.nan),
        "wall_s": _median(ok, "wall_s"), "total_flops": _median(ok, "total_flops"),
        "growth_flops_share": _median(ok, "growth_flops_share"), "n_growths": _median(ok, "n_growths"),
        "final_d_k": widths.iloc[0] if len(widths) else "",
    }


def training_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per dataset (panel) × variant.

    Columns: ``dataset`` (the panel), ``variant``, ``comparison`` (the groups it belongs to),
    ``seeds`` (successful runs), ``failed``, and the medians over the successful runs of
    ``final_heldout``, ``best_heldout``, ``wall_s``, ``total_flops``, ``growth_flops_share``
    (growth FLOPs / total FLOPs, per run) and ``n_growths``; ``final_vs_fixed_large`` is the
    median final held-out loss over the ``fixed-large`` one of the same panel, ``final_d_k``
    the most frequent final width.
    """
    if runs.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    if "panel" not in runs:
        runs = prepare(runs)
    rows = []
    for panel, in_panel in runs.groupby("panel", sort=True):
        ok = in_panel[in_panel.status == "ok"]
        reference = ok[ok.variant == "fixed-large"].final_heldout
        reference_final = float(reference.median()) if len(reference) else math.nan
        rows += [_variant_row(panel, v, in_panel[in_panel.variant == v], reference_final, set(ok.variant))
                 for v in variant_order(in_panel.variant)]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def table_row(table: pd.DataFrame, panel: str, variant: str) -> pd.Series | None:
    """``variant``'s row of the table in ``panel``, None when it has no successful run there."""
    r = table[(table.dataset == panel) & (table.variant == variant) & (table.seeds > 0)]
    return None if r.empty else r.iloc[0]


def failed_training_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The failed training runs: dataset, variant, seed and the first line of the error."""
    cols = ["dataset", "variant", "method", "seed", "device", "status", "error"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    f = runs[runs.status != "ok"]
    out = pd.DataFrame({"dataset": f.panel, "variant": f.variant, "method": f.method, "seed": f.seed,
                        "device": f.device, "status": f.status})
    out["error"] = f.error.map(first_line)
    return out.reset_index(drop=True)


def median_curves(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per panel, variant and step: medians over the successful seeds of held-out loss, FLOPs and wall
    time, the min and max held-out loss, and the number of seeds at that step; ``tokens`` is the sequence
    positions the optimiser has trained on by then (:func:`harness.train.tokens_per_step`; a growth's
    captured batches are not counted)."""
    if runs.empty or curves.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    ok = runs[runs.status == "ok"][["key", "panel", "variant", "dataset", "b", "d_s"]]
    ok = ok.assign(per_step=[tokens_per_step(str(d), int(b), int(n)) for d, b, n in zip(ok.dataset, ok.b, ok.d_s,
                                                                                         strict=True)])
    merged = curves.merge(ok.drop(columns=["dataset", "b", "d_s"]), on="key")
    if merged.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    merged["tokens"] = merged.step * merged.per_step
    grouped = merged.groupby(["panel", "variant", "step"], sort=True)
    out = pd.DataFrame({"tokens": grouped.tokens.median(), "flops": grouped.flops.median(),
                        "wall_s": grouped.wall_s.median(),
                        "heldout": grouped.heldout_loss.median(), "lo": grouped.heldout_loss.min(),
                        "hi": grouped.heldout_loss.max(), "seeds": grouped.size()})
    return out.reset_index()[CURVE_COLUMNS]


def growth_steps(runs: pd.DataFrame, panel: str, variant: str = "default") -> list[int]:
    """The last step before each growth of ``variant`` in ``panel`` (union over its successful seeds):
    a growth recorded at step ``s`` happens before the update of step ``s``, after the curve point ``s − 1``."""
    ok = runs[(runs.panel == panel) & (runs.variant == variant) & (runs.status == "ok")]
    return sorted({int(e["step"]) - 1 for events in ok.events for e in stored_json(events, [])
                   if isinstance(e, dict) and "step" in e})
