"""The report's training section: ``growbench train`` runs as curves, a table and a verdict.

Everything is computed from the ``train_runs`` and ``train_curves`` tables
(:func:`harness.store.training.load`); nothing here writes files (see :mod:`harness.report.sweep`,
which writes the figures and ``training_summary.csv`` and places the section in
``report.html`` and ``report.md``).

- :func:`training_curves`: held-out loss against FLOPs and against the step, medians
  over seeds, for the single-head methods at default settings;
- :func:`training_variants`: the same for every other variant (scale policies,
  optimiser-state reset, bottleneck trigger, two heads), with ``default`` and
  ``fixed-large`` as grey references;
- :func:`training_table`: medians over seeds per dataset × variant;
- :func:`verdicts`: per dataset, whether ``default`` growth meets its two targets.

Runs are grouped by *panel*: the dataset, with the sizes appended when one database
holds the same dataset at several sizes (medians never mix sizes).
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report import figures as F
from harness.report.figures import FigureResult, tx

MAIN_METHODS = ("default", "random", "zero", "gradmax", "fixed-small", "fixed-large")
BASELINES = ("random", "zero", "gradmax")
TOLERANCE = 0.05
# Variants compared with one another (in the table's ``comparison`` column, the variants
# figure's caption and the verdict). The first name of each group is its reference.
COMPARISONS = (
    ("scale policy (default)", ("default", "default fixed", "default learnable")),
    ("scale policy (fixed-large)", ("fixed-large", "fixed-large fixed", "fixed-large learnable")),
    ("Adam state", ("default", "default reset")),
    ("trigger", ("default", "default bottleneck")),
    ("two heads", ("default h=2", "default h=2 budget", "fixed-large h=2", "fixed-small h=2")),
)
# How each compared variant is called inside its group (the setting that differs).
SETTING_NAMES = {
    "scale policy (default)": {"default": "rescale", "default fixed": "fixed", "default learnable": "learnable"},
    "scale policy (fixed-large)": {"fixed-large": "rescale", "fixed-large fixed": "fixed",
                                   "fixed-large learnable": "learnable"},
    "Adam state": {"default": "pad", "default reset": "reset"},
    "trigger": {"default": "schedule", "default bottleneck": "bottleneck"},
}
# Settings that no variant of one design changes: runs that differ in any of them are different panels.
SETUP_FIELDS = ("d_s", "d_e", "b", "d_k0", "steps", "lr", "eval_every", "stats_batches", "device", "dtype")
MAIN_COLORS = {"default": "#1f77b4", "random": "#ff7f0e", "zero": "#2ca02c", "gradmax": "#9467bd",
               "fixed-small": "#7f7f7f", "fixed-large": "#000000"}
TABLE_COLUMNS = ["dataset", "variant", "comparison", "seeds", "failed", "final_heldout", "best_heldout",
                 "final_vs_fixed_large", "wall_s", "total_flops", "growth_flops_share", "n_growths", "final_d_k"]
NEGATIVE = "A target that is not met is reported as measured, not hidden."


@dataclass
class Verdict:
    """The verdict of one panel: ``None`` for a target that could not be judged (runs missing).

    ``text`` is ``parts`` (target (a), target (b), other comparisons, ...) joined; ``numbers`` holds the
    medians the targets were judged on.
    """

    dataset: str
    matches_fixed_large: bool | None
    beats_baselines: bool | None
    text: str
    numbers: dict = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)


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


# ------------------------------------------------------------------ loading
def load_training(db_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, curves)`` of the database; two empty frames when it has no readable training tables."""
    from harness.store.training import load

    try:
        return load(db_path)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError):
        # Not a database at all: the growth-sweep loader reports that; here there is simply no training.
        return pd.DataFrame(), pd.DataFrame()


def has_training(runs: pd.DataFrame) -> bool:
    """Whether ``runs`` holds at least one successful training run."""
    return not runs.empty and bool((runs.status == "ok").any())


def _json(value, default):
    if isinstance(value, list | dict):
        return value
    try:
        return json.loads(value) if isinstance(value, str) else default
    except (TypeError, ValueError):
        return default


def _width(value) -> str:
    """A stored final width (JSON list per head) as text: ``8``, or ``4, 4`` for two heads."""
    w = _json(value, value)
    return ", ".join(str(x) for x in w) if isinstance(w, list) else str(w)


def _is_main(variant: str) -> bool:
    return variant in MAIN_METHODS or " " not in variant


def latest_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per configuration: a database resumed after the code changed holds the same configuration
    under several code versions (several keys); the most recently finished successful run counts (or,
    without one, the most recent failure), so that a seed is never counted twice."""
    from harness.train import config_fields

    if runs.empty:
        return runs.copy()
    cols = [c for c in config_fields() if c in runs]
    order = runs.assign(_ok=runs.status == "ok", _at=runs.get("finished_at", pd.Series("", index=runs.index))
                        .fillna("").astype(str))
    order = order.sort_values(["_ok", "_at"], kind="stable")
    keep = ~order[cols].astype(str).duplicated(keep="last")
    return order[keep].drop(columns=["_ok", "_at"]).sort_index().copy()


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`latest_runs` of ``runs`` with ``variant``, ``panel`` (dataset, plus sizes where a dataset has
    several) and ``growth_flops_share`` columns; rows sorted by panel, variant and seed."""
    from harness.train import config_fields
    from harness.runner.train_sweep import variant_names

    runs = runs.reindex(columns=list(dict.fromkeys([*runs.columns, *config_fields(), "status", "error",
                                                    "final_heldout", "best_heldout", "wall_s", "total_flops",
                                                    "growth_flops", "n_growths", "final_d_k", "events"])))
    runs = latest_runs(runs)
    runs["variant"] = variant_names(runs) if len(runs) else pd.Series(dtype=str)
    runs["panel"] = runs.dataset.astype(str)
    for ds, same in runs.groupby("dataset", sort=False):
        differ = [f for f in SETUP_FIELDS if same[f].astype(str).nunique() > 1]
        if differ:
            labels = [", ".join(f"{f}={v}" for f, v in zip(differ, vals, strict=True))
                      for vals in same[differ].itertuples(index=False)]
            runs.loc[same.index, "panel"] = [f"{ds} ({lab})" for lab in labels]
    total = pd.to_numeric(runs.total_flops, errors="coerce")
    runs["growth_flops_share"] = np.where(total > 0, pd.to_numeric(runs.growth_flops, errors="coerce") / total,
                                          np.nan)
    return runs.sort_values(["panel", "variant", "seed"], kind="stable").reset_index(drop=True)


def _variant_order(variants) -> list[str]:
    """Main methods first (in MAIN_METHODS order), then the compared variants by group, then the rest."""
    order = [v for v in MAIN_METHODS if v in set(variants)]
    order += sorted(v for v in set(variants) if _is_main(v) and v not in order)
    for _, names in COMPARISONS:
        order += [v for v in names if v in set(variants) and v not in order]
    return order + sorted(v for v in set(variants) if v not in order)


def _comparison(variant: str, present: set[str]) -> str:
    """The groups ``variant`` is compared in, among those with two or more of their variants ``present``."""
    groups = [g for g, names in COMPARISONS if variant in names and len(present & set(names)) >= 2]
    if _is_main(variant):
        return "method" + ("; reference of " + ", ".join(groups) if groups else "")
    return ", ".join(groups)


# ------------------------------------------------------------------ table
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
    for panel, pr in runs.groupby("panel", sort=True):
        ok_panel = pr[pr.status == "ok"]
        ref = ok_panel[ok_panel.variant == "fixed-large"].final_heldout
        ref_final = float(ref.median()) if len(ref) else math.nan
        present = set(ok_panel.variant)
        for v in _variant_order(pr.variant):
            g = pr[pr.variant == v]
            ok = g[g.status == "ok"]

            def med(col, ok=ok):
                vals = pd.to_numeric(ok[col], errors="coerce").dropna()
                return float(vals.median()) if len(vals) else math.nan

            final = med("final_heldout")
            widths = ok.final_d_k.map(_width).mode()
            rows.append({
                "dataset": panel, "variant": v, "comparison": _comparison(v, present), "seeds": len(ok),
                "failed": int((g.status != "ok").sum()), "final_heldout": final, "best_heldout": med("best_heldout"),
                "final_vs_fixed_large": final / ref_final if ref_final and math.isfinite(ref_final) else math.nan,
                "wall_s": med("wall_s"), "total_flops": med("total_flops"),
                "growth_flops_share": med("growth_flops_share"), "n_growths": med("n_growths"),
                "final_d_k": widths.iloc[0] if len(widths) else "",
            })
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def failed_training_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The failed training runs: dataset, variant, seed and the first line of the error."""
    cols = ["dataset", "variant", "method", "seed", "device", "status", "error"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    f = runs[runs.status != "ok"]
    out = pd.DataFrame({"dataset": f.panel, "variant": f.variant, "method": f.method, "seed": f.seed,
                        "device": f.device, "status": f.status})
    out["error"] = f.error.map(lambda e: str(e).strip().splitlines()[0] if isinstance(e, str) and e.strip() else "")
    return out.reset_index(drop=True)


# ------------------------------------------------------------------ verdict
def _g(v: float) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.4g}"


def _e(v: float) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.3g}"


def _ratio(v: float) -> str:
    """A ratio with three decimals, or three significant digits when it is far below one."""
    return "n/a" if not math.isfinite(v) else f"{v:.3f}" if abs(v) >= 0.01 else f"{v:.3g}"


def _row(table: pd.DataFrame, panel: str, variant: str) -> pd.Series | None:
    r = table[(table.dataset == panel) & (table.variant == variant) & (table.seeds > 0)]
    return None if r.empty else r.iloc[0]


def _paired_wins(runs: pd.DataFrame, panel: str, a: str, b: str) -> tuple[int, int]:
    """Seeds where ``a``'s final held-out loss is below ``b``'s, and the seeds both ran successfully."""
    ok = runs[(runs.panel == panel) & (runs.status == "ok")]
    x = ok[ok.variant == a].groupby("seed").final_heldout.median()
    y = ok[ok.variant == b].groupby("seed").final_heldout.median()
    both = pd.concat([x.rename("a"), y.rename("b")], axis=1, join="inner")
    return int((both.a < both.b).sum()), len(both)


def _measured_groups(table: pd.DataFrame, panel: str) -> list[tuple[str, list[tuple[str, pd.Series]]]]:
    """The comparison groups with two or more measured variants in ``panel``, with their table rows."""
    out = []
    for group, names in COMPARISONS:
        have = [(v, _row(table, panel, v)) for v in names]
        have = [(v, r) for v, r in have if r is not None and math.isfinite(r.final_heldout)]
        if len(have) >= 2:
            out.append((group, have))
    return out


def comparison_text(table: pd.DataFrame, panel: str) -> list[str]:
    """One sentence per comparison group with two or more measured variants in ``panel`` (medians over seeds)."""
    out = []
    for group, have in _measured_groups(table, panel):
        label = SETTING_NAMES.get(group, {})
        parts = [f"{label.get(v, v)} {_g(r.final_heldout)}" for v, r in have]
        best_v, best_r = min(have, key=lambda t: t[1].final_heldout)
        ref_v, ref_r = have[0]
        text = f"{group}: median final held-out {', '.join(parts)}; lowest: {label.get(best_v, best_v)}"
        if best_v != ref_v:
            text += f" ({100 * (best_r.final_heldout / ref_r.final_heldout - 1):+.2g}% vs {label.get(ref_v, ref_v)})"
        if group == "trigger":
            text += (f"; growths {', '.join(f'{label.get(v, v)} {_g(r.n_growths)}' for v, r in have)}, total FLOPs "
                     f"{', '.join(f'{label.get(v, v)} {_e(r.total_flops)}' for v, r in have)}")
        out.append(text)
    return out


def panel_verdict(runs: pd.DataFrame, table: pd.DataFrame, panel: str) -> Verdict:
    """Judge ``default`` growth on one panel against its two targets.

    (a) ``default`` reaches ``fixed-large``'s median final held-out loss within 5 %
    (``default <= 1.05 × fixed-large``) with fewer median total FLOPs; (b) ``default``'s median
    final held-out loss is below that of each of ``random``, ``zero`` and ``gradmax``. Both use
    the variants at default settings (one head, ``rescale``, ``pad``, ``schedule``).
    """
    d, fl = _row(table, panel, "default"), _row(table, panel, "fixed-large")
    nums: dict = {}
    bits = []
    a: bool | None = None
    if d is None or fl is None:
        miss = " and ".join(v for v, r in (("default", d), ("fixed-large", fl)) if r is None)
        bits.append(f"(a) not judged: no successful {miss} run.")
    else:
        ratio = d.final_heldout / fl.final_heldout
        fr = d.total_flops / fl.total_flops
        loss_ok = bool(d.final_heldout <= (1 + TOLERANCE) * fl.final_heldout)
        flops_ok = bool(d.total_flops < fl.total_flops)
        a = loss_ok and flops_ok
        nums.update(default_final=d.final_heldout, fixed_large_final=fl.final_heldout, loss_ratio=ratio,
                    default_flops=d.total_flops, fixed_large_flops=fl.total_flops, flops_ratio=fr)
        loss = (f"final held-out loss {_g(d.final_heldout)} against fixed-large's {_g(fl.final_heldout)} "
                f"(×{_ratio(ratio)}; target ≤ ×{1 + TOLERANCE:.2f})")
        flops = f"total FLOPs {_e(d.total_flops)} against {_e(fl.total_flops)} (×{_ratio(fr)})"
        if a:
            bits.append(f"(a) met: default growth reaches fixed-large's loss within 5% with fewer FLOPs: {loss}, "
                        f"{flops}.")
        else:
            why = ("comes within 5% of fixed-large's loss, but with more FLOPs" if loss_ok else
                   "does not come within 5% of fixed-large's loss (with fewer FLOPs)" if flops_ok else
                   "does not come within 5% of fixed-large's loss and uses more FLOPs")
            bits.append(f"(a) NOT met: default growth {why}: {loss}, {flops}.")

    b: bool | None = None
    if d is None:
        bits.append("(b) not judged: no successful default run.")
    else:
        have = {v: _row(table, panel, v) for v in BASELINES}
        measured = {v: r for v, r in have.items() if r is not None}
        missing = [v for v in BASELINES if v not in measured]
        if not measured:
            bits.append("(b) not judged: no successful random, zero or gradmax run.")
        else:
            beaten = {v: bool(d.final_heldout < r.final_heldout) for v, r in measured.items()}
            parts = []
            for v, r in measured.items():
                w, n = _paired_wins(runs, panel, "default", v)
                parts.append(f"{v} {_g(r.final_heldout)} (default lower on {w} of {F.plural(n, 'seed')})")
                nums[f"{v}_final"] = r.final_heldout
            sizes = {v: r.final_d_k for v, r in measured.items() if r.final_d_k != d.final_d_k}
            size = ("at equal final size (d_k " + str(d.final_d_k) + ")" if not sizes else
                    "at UNEQUAL final size (default d_k " + str(d.final_d_k) + "; "
                    + ", ".join(f"{v} {s}" for v, s in sizes.items()) + ")")
            lost = [v for v, won in beaten.items() if not won]
            if lost:
                b = False
                head = f"(b) NOT met: default does not beat {', '.join(lost)}"
                head += f" ({', '.join(missing)} did not run)" if missing else ""
            elif sizes:
                head = "(b) not judged: default has the lower loss, but the final sizes differ"
            elif missing:
                head = (f"(b) not fully judged: default beats the {len(measured)} measured, but "
                        f"{', '.join(missing)} did not run")
            else:
                b = True
                head = "(b) met: default beats random, zero and gradmax"
            bits.append(f"{head} {size}: median final held-out loss default {_g(d.final_heldout)}, "
                        + ", ".join(parts) + ".")
    bits += [f"{t[0].upper()}{t[1:]}." for t in comparison_text(table, panel)]
    if a is False or b is False:
        bits.append(NEGATIVE)
    return Verdict(panel, a, b, " ".join(bits), nums, bits)


def verdicts(runs: pd.DataFrame, table: pd.DataFrame | None = None) -> list[Verdict]:
    """One :func:`panel_verdict` per panel of ``runs``."""
    if runs.empty:
        return []
    if "panel" not in runs:
        runs = prepare(runs)
    table = training_table(runs) if table is None else table
    return [panel_verdict(runs, table, p) for p in sorted(runs.panel.unique())]


def overall_text(vs: list[Verdict]) -> str:
    """One sentence counting the panels where each target was met."""
    def count(attr: str) -> str:
        judged = [getattr(v, attr) for v in vs if getattr(v, attr) is not None]
        met = sum(judged)
        return f"{met} of {len(judged)} dataset{'s' if len(judged) != 1 else ''}"

    return (f"Target (a), default growth within 5% of fixed-large's final held-out loss with fewer FLOPs: met on "
            f"{count('matches_fixed_large')}. Target (b), default below random, zero and gradmax at equal final "
            f"size: met on {count('beats_baselines')}.")


# ------------------------------------------------------------------ curves
def median_curves(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per panel, variant and step: medians over the successful seeds of held-out loss, FLOPs and wall
    time, the min and max held-out loss, and the number of seeds at that step."""
    cols = ["panel", "variant", "step", "flops", "wall_s", "heldout", "lo", "hi", "seeds"]
    if runs.empty or curves.empty:
        return pd.DataFrame(columns=cols)
    ok = runs[runs.status == "ok"][["key", "panel", "variant"]]
    c = curves.merge(ok, on="key")
    if c.empty:
        return pd.DataFrame(columns=cols)
    g = c.groupby(["panel", "variant", "step"], sort=True)
    out = pd.DataFrame({"flops": g.flops.median(), "wall_s": g.wall_s.median(), "heldout": g.heldout_loss.median(),
                        "lo": g.heldout_loss.min(), "hi": g.heldout_loss.max(), "seeds": g.size()})
    return out.reset_index()[cols]


def growth_steps(runs: pd.DataFrame, panel: str, variant: str = "default") -> list[int]:
    """The last step before each growth of ``variant`` in ``panel`` (union over its successful seeds):
    a growth recorded at step ``s`` happens before the update of step ``s``, after the curve point ``s − 1``."""
    ok = runs[(runs.panel == panel) & (runs.variant == variant) & (runs.status == "ok")]
    steps = {int(e["step"]) - 1 for ev in ok.events for e in _json(ev, []) if isinstance(e, dict) and "step" in e}
    return sorted(steps)


def _styles(variants: list[str]) -> dict[str, dict]:
    import seaborn as sns

    others = [v for v in variants if v not in MAIN_COLORS]
    # No grey (the references are grey), and a second palette once the first is used up.
    colors = [c for i, c in enumerate(sns.color_palette("colorblind", 10)) if i != 7]
    colors += [c for i, c in enumerate(sns.color_palette("dark", 10)) if i != 7]
    palette = {v: colors[i % len(colors)] for i, v in enumerate(others)}
    out = {}
    for v in variants:
        fixed = v.startswith("fixed-")
        out[v] = dict(color=MAIN_COLORS.get(v, palette.get(v)), ls="--" if fixed else "-",
                      lw=2.2 if v == "default" else 1.5)
    return out


def _clip(m: pd.DataFrame) -> tuple[float, float] | None:
    """y limits that keep the last 80 % of the steps legible when the first steps' loss, far above, would
    squash them (a linear axis only); None when no clipping is needed."""
    if m.empty:
        return None
    late = m[m.step >= 0.2 * m.step.max()]
    lo, hi, late_hi = m.lo.min(), m.hi.max(), late.hi.max()
    if not (np.isfinite(lo) and np.isfinite(late_hi)) or late_hi <= lo or (hi - lo) < 2.5 * (late_hi - lo):
        return None
    return float(lo - 0.05 * (late_hi - lo)), float(late_hi + 0.15 * (late_hi - lo))


def _draw(runs: pd.DataFrame, med: pd.DataFrame, show: list[str], refs: list[str], title: str):
    """Rows of (held-out vs FLOPs, held-out vs step) panels; returns the figure."""
    import matplotlib.pyplot as plt

    panels = sorted(med[med.variant.isin(show)].panel.unique())
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 3.9 * len(panels) + 1.0), squeeze=False)
    styles = _styles(_variant_order(show))
    for (ax_f, ax_s), panel in zip(axes, panels, strict=True):
        m = med[med.panel == panel]
        for v in refs:
            c = m[m.variant == v]
            if len(c):
                for ax, x in ((ax_f, c.flops), (ax_s, c.step)):
                    ax.plot(x, c.heldout, color="#bdbdbd", lw=1.1, ls="--" if v.startswith("fixed") else "-",
                            label=f"{tx(v)} (reference)", zorder=1)
        for v in _variant_order(show):
            c = m[m.variant == v]
            if c.empty:
                continue
            st = styles[v]
            for ax, x in ((ax_f, c.flops), (ax_s, c.step)):
                ax.plot(x, c.heldout, label=tx(v), zorder=3, **st)
                if c.seeds.max() > 1:
                    ax.fill_between(x, c.lo, c.hi, color=st["color"], alpha=0.12, lw=0, zorder=2)
        steps = growth_steps(runs, panel)
        d = m[m.variant == "default"]
        if steps and len(d):
            at = np.interp(steps, d.step, d.flops)
            for i, (s, f) in enumerate(zip(steps, at, strict=True)):
                lab = "growth of default" if i == 0 else None
                # Above the grid (which may fall on the same steps), below the curves.
                ax_s.axvline(s, color=MAIN_COLORS["default"], ls=":", lw=1.0, alpha=0.8, label=lab, zorder=1.5)
                ax_f.axvline(f, color=MAIN_COLORS["default"], ls=":", lw=1.0, alpha=0.8, label=lab, zorder=1.5)
        shown = m[m.variant.isin([*show, *refs])]
        pos = shown.heldout[shown.heldout > 0]
        log_y = bool(len(pos)) and pos.max() / pos.min() > 10
        lims = _clip(shown) if not log_y else None
        for ax in (ax_f, ax_s):
            if log_y:
                ax.set_yscale("log")
            elif lims is not None:
                ax.set_ylim(*lims)
            ax.set_ylabel("held-out loss (median over seeds" + (", log scale)" if log_y else
                                                                  "; early steps clipped)" if lims else ")"))
        fpos = m.flops[m.flops > 0]
        log_x = len(fpos) and fpos.max() / fpos.min() > 100
        if log_x:
            ax_f.set_xscale("log")
        ax_f.set_xlabel("FLOPs, training + growth (median over seeds" + (", log scale)" if log_x else ")"))
        ax_s.set_xlabel("optimiser step")
        ax_f.set_title(f"{tx(panel)}: against compute")
        ax_s.set_title(f"{tx(panel)}: against steps")
    handles: dict = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    ncol = min(5, len(handles))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, frameon=False, fontsize=8.5)
    fig.suptitle(title, fontweight="bold")
    rows = math.ceil(len(handles) / max(ncol, 1))
    fig.tight_layout(rect=(0, (0.2 + 0.22 * rows) / fig.get_figheight(), 1, 1))
    return fig


def _seeds_text(table: pd.DataFrame, panel: str, variants: list[str]) -> str:
    n = table[(table.dataset == panel) & table.variant.isin(variants)].seeds
    n = n[n > 0]
    if n.empty:
        return "no seeds"
    return f"{int(n.min())} seed{'s' if n.min() != 1 else ''}" if n.min() == n.max() else \
        f"{int(n.min())}–{int(n.max())} seeds"


def training_curves(runs: pd.DataFrame, curves: pd.DataFrame, table: pd.DataFrame | None = None) -> FigureResult:
    """Held-out loss against FLOPs and steps for the single-head methods at default settings."""
    F._theme()
    title = "Growth during training: held-out loss of each method"
    if "panel" not in runs:
        runs = prepare(runs)
    table = training_table(runs) if table is None else table
    med = median_curves(runs, curves)
    show = _variant_order([v for v in med.variant.unique() if _is_main(v)])
    if not show:
        return FigureResult("train_curves", title, note="No successful training run of a single-head method at "
                                                        "default settings has a curve.")
    fig = _draw(runs, med, show, [], title + " (medians over seeds, bands min–max)")
    parts = []
    for panel in sorted(med[med.variant.isin(show)].panel.unique()):
        t = table[(table.dataset == panel) & table.variant.isin(show) & (table.seeds > 0)]
        t = t.dropna(subset=["final_heldout"])
        finals = ", ".join(f"{r.variant} {_g(r.final_heldout)}" for r in t.itertuples())
        text = f"{panel} ({_seeds_text(table, panel, show)}): final held-out loss {finals}"
        if len(t):
            best = t.loc[t.final_heldout.idxmin()]
            text += f"; lowest: {best.variant}"
        steps = growth_steps(runs, panel)
        if steps:
            d = runs[(runs.panel == panel) & (runs.variant == "default") & (runs.status == "ok")]
            text += (f"; default grew after steps {', '.join(map(str, steps))} (dotted lines), d_k "
                     f"{int(d.d_k0.iloc[0])} → {_row(table, panel, 'default').final_d_k}")
        parts.append(text)
    caption = ("Lines are medians over seeds at each evaluation step (seeds share steps), shaded bands the min–max "
               "over seeds; FLOPs count training steps and growths (statistics, direction, line search), not the "
               "held-out evaluation. Per dataset: " + "; ".join(parts) + ".")
    return FigureResult("train_curves", title, caption, fig, data=med[med.variant.isin(show)])


def training_variants(runs: pd.DataFrame, curves: pd.DataFrame, table: pd.DataFrame | None = None) -> FigureResult:
    """Held-out loss against FLOPs and steps for every variant besides the default settings."""
    F._theme()
    title = "Growth during training: variants"
    if "panel" not in runs:
        runs = prepare(runs)
    table = training_table(runs) if table is None else table
    med = median_curves(runs, curves)
    show = _variant_order([v for v in med.variant.unique() if not _is_main(v)])
    if not show:
        return FigureResult("train_variants", title, note="No training variant beyond the single-head methods at "
                                                          "default settings (scale policies, Adam state reset, "
                                                          "bottleneck trigger, two heads) is in the database.")
    fig = _draw(runs, med, show, ["default", "fixed-large"],
                title + " (medians over seeds; default and fixed-large in grey)")
    parts = []
    for panel in sorted(med[med.variant.isin(show)].panel.unique()):
        bits = comparison_text(table, panel)
        grouped = {v for _, have in _measured_groups(table, panel) for v, _ in have}
        rest = table[(table.dataset == panel) & table.variant.isin([v for v in show if v not in grouped])
                     & (table.seeds > 0)]
        bits += [f"{r.variant}: final held-out {_g(r.final_heldout)}" for r in rest.itertuples()]
        parts.append(f"{panel} ({_seeds_text(table, panel, show)}): " + ("; ".join(bits) or "no comparison"))
    caption = ("Each variant changes one setting of the default design (one head, scale policy rescale, Adam "
               "state padded, growth on a schedule); lines are medians over seeds, dotted lines mark default's "
               "growths. " + " ".join(f"{p}." for p in parts))
    return FigureResult("train_variants", title, caption, fig, data=med[med.variant.isin(show)])


# ------------------------------------------------------------------ the section
def training_facts(runs: pd.DataFrame, superseded: int = 0) -> dict:
    """What the training tables hold: counts, datasets, devices, environment; ``superseded`` runs (an
    identical configuration run again, see :func:`latest_runs`) are named when there are any."""
    def uniq(col):
        return ", ".join(sorted({str(v) for v in runs[col].dropna().unique()})) if col in runs else "–"

    return {
        "training runs": len(runs), "ok": int((runs.status == "ok").sum()), "failed": int((runs.status != "ok").sum()),
        "datasets": uniq("dataset"), "variants": runs.variant.nunique(), "steps": uniq("steps"),
        "devices": uniq("device"), "torch": uniq("torch_version"), "git commit": uniq("git_commit"),
        "code version": uniq("code_version"),
        "runs finished": (f"{runs.finished_at.dropna().min()} – {runs.finished_at.dropna().max()}"
                          if "finished_at" in runs else "–"),
    } | ({"superseded runs": f"{superseded} (the same configuration stored again, e.g. under a newer code "
                              "version: only the latest successful run of each configuration counts)"}
         if superseded else {})


def infer_train_preset(runs: pd.DataFrame) -> str | None:
    """The ``growbench train`` preset whose configurations are exactly the database's, if any."""
    from harness.train import config_fields
    from harness.runner.train_sweep import train_presets

    cols = config_fields()
    try:
        have = {tuple(r) for r in runs[cols].astype(str).itertuples(index=False)}
        for name, configs in train_presets().items():
            if have == {tuple(str(v) for v in c.as_dict().values()) for c in configs}:
                return name
    except Exception:  # noqa: BLE001 - only a convenience for the report's first lines
        return None
    return None


def build_training(runs: pd.DataFrame, curves: pd.DataFrame, *, figures: bool = True) -> TrainingSection:
    """Figures, table, verdicts and failures of the training runs.

    Parameters
    ----------
    runs, curves : pandas.DataFrame
        As from :func:`load_training`.
    figures : bool
        Draw the figures (without, ``figures`` is empty: the numbers alone are much faster).

    Returns
    -------
    TrainingSection
        A figure that cannot be drawn becomes a note in its place; it never loses the section.
    """
    import sys
    import traceback

    stored = len(runs)
    runs = prepare(runs)
    table = training_table(runs)
    figs = []
    for make in (training_curves, training_variants) if figures else ():
        try:
            figs.append(make(runs, curves, table))
        except Exception as e:  # noqa: BLE001 - one figure's failure must not lose the report
            name = make.__name__
            print(f"growbench report: figure {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            figs.append(FigureResult(name, f"figure {name}", note=f"This figure could not be drawn: "
                                                                  f"{type(e).__name__}: {e}"))
    return TrainingSection(runs=runs, table=table, verdicts=verdicts(runs, table), figures=figs,
                           failed=failed_training_runs(runs), facts=training_facts(runs, stored - len(runs)))


INTRO = ("Each training run trains a fresh model of the dataset with Adam, starting from d_k0 and growing every "
         "grow_every steps by p columns until d_k_max with the run's method (default: the default growth strategy; "
         "random, zero, gradmax: baselines), next to fixed-size models at d_k0 (fixed-small) and d_k_max "
         "(fixed-large). FLOPs count every training step and every growth; wall time excludes the held-out "
         "evaluation. All numbers are medians over seeds.")
DISPLAY = {"final_heldout": "final held-out", "best_heldout": "best held-out",
           "final_vs_fixed_large": "final / fixed-large", "wall_s": "wall (s)", "total_flops": "total FLOPs",
           "growth_flops_share": "growth FLOPs share", "n_growths": "growths", "final_d_k": "final d_k"}


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with readable column names, as the report shows it."""
    return table.rename(columns=DISPLAY)


def section_html(s: TrainingSection) -> str:
    """The section as HTML (every database string escaped; figures embedded from their ``png``)."""
    from harness.report.sweep import _esc, _html_table, facts_rows_html, figure_html

    h = ['<h2 id="training">Growth during training</h2>', f"<p>{_esc(INTRO)}</p>", "<table>"]
    h += facts_rows_html(s.facts)
    h.append("</table>")
    if s.facts["failed"]:
        h.append(f'<p class="note">{s.facts["failed"]} of {s.facts["training runs"]} training runs failed: see '
                 '<a href="#training-failed">failed training runs</a>.</p>')
    h += ['<h3 id="training-verdict">Verdict</h3>', f"<p>{_esc(overall_text(s.verdicts))}</p>", "<ul>"]
    h += [f"<li><b>{_esc(v.dataset)}</b><ul>" + "".join(f"<li>{_esc(p)}</li>" for p in v.parts) + "</ul></li>"
          for v in s.verdicts]
    h.append("</ul>")
    for r in s.figures:
        h += figure_html(r, "h3")
    h += ["<h3>Medians over seeds per dataset and variant</h3>",
          "<p>Also in <code>training_summary.csv</code>. <code>final / fixed-large</code>: median final held-out "
          "loss over fixed-large's; growth FLOPs share: growth FLOPs / total FLOPs (median over runs); the "
          "comparison column names the groups a variant belongs to.</p>",
          '<div class="small">' + _html_table(display_table(s.table), "{:.4g}") + "</div>",
          '<h3 id="training-failed">Failed training runs</h3>',
          _html_table(s.failed, wide_text=("error",)) if len(s.failed) else
          "<p>None: every training run succeeded.</p>"]
    return "\n".join(h)


def section_markdown(s: TrainingSection) -> str:
    """The section as Markdown (figures linked as ``figures/<name>.png``)."""
    from harness.report.sweep import _md_esc, _md_table, figure_markdown

    m = ["## Growth during training", "", _md_esc(INTRO), "",
         _md_table(pd.DataFrame({"": list(s.facts), "value": [str(v) for v in s.facts.values()]}))]
    if s.facts["failed"]:
        m.append(f"**{s.facts['failed']} of {s.facts['training runs']} training runs failed**: see "
                 "[failed training runs](#failed-training-runs).\n")
    m += ["### Verdict", "", _md_esc(overall_text(s.verdicts)), ""]
    for v in s.verdicts:
        m += [f"- **{_md_esc(v.dataset)}**", *(f"  - {_md_esc(p)}" for p in v.parts)]
    m.append("")
    for r in s.figures:
        m += figure_markdown(r, "###")
    m += ["### Medians over seeds per dataset and variant", "", "Also in [training_summary.csv](training_summary.csv).",
          "", _md_table(display_table(s.table)), "### Failed training runs", "",
          _md_table(s.failed) if len(s.failed) else "None: every training run succeeded.\n"]
    return "\n".join(m)
