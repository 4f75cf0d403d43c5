"""Held-out loss during training, against compute and against steps: the methods, then the variants."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.report.figures.base import FigureResult, bottom_legend, log_axis, plain_text, theme
from harness.report.figures.palette import BLACK, BLUE, HUES, ORANGE, shades
from harness.report.train_runs import (
    BASELINES,
    COMPARISONS,
    growth_steps,
    is_main,
    median_curves,
    prepare,
    table_row,
    training_table,
    variant_order,
)
from harness.report.train_verdict import comparison_text, measured_groups
from harness.report.wording import four_digits, plural

REFERENCE_GREY = "#bdbdbd"
# The methods' families: default growth alone, the baselines together, the fixed sizes together.
METHOD_FAMILIES = {"default": "default", **dict.fromkeys(BASELINES, "baselines"),
                   "fixed-small": "fixed", "fixed-large": "fixed"}
METHOD_HUES = {"default": BLUE, "baselines": ORANGE, "fixed": BLACK}
# Beyond this ratio of largest to smallest positive value an axis is drawn on a log scale.
LOG_Y_RATIO, LOG_X_RATIO = 10, 100


def _family(variant: str) -> str:
    """A variant's family: the method's for a method, else the first comparison group it belongs to."""
    if variant in METHOD_FAMILIES:
        return METHOD_FAMILIES[variant]
    return next((group for group, names in COMPARISONS if variant in names), variant)


def _styles(variants: list[str]) -> dict[str, dict]:
    """Line style per variant: a hue per family (the methods' own hues when present), shades within (fixed-large
    the darkest of the fixed sizes: it is the target); fixed sizes dashed."""
    families = list(dict.fromkeys(_family(v) for v in variants))
    taken = {METHOD_HUES[f] for f in families if f in METHOD_HUES}
    free = itertools.cycle([h for h in HUES if h not in taken])
    colors = {}
    for family in families:
        members = sorted((v for v in variants if _family(v) == family), key=lambda v: v != "fixed-large")
        colors.update(zip(members, shades(METHOD_HUES.get(family) or next(free), len(members)), strict=True))
    return {v: dict(color=colors[v], ls="--" if v.startswith("fixed-") else "-", lw=2.4 if v == "default" else 1.6)
            for v in variants}


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


def _plot_lines(ax_flops, ax_steps, curves: pd.DataFrame, show: list[str], refs: list[str], styles: dict) -> None:
    """Each variant's median curve (band min–max when several seeds) on both panels; references in grey."""
    for v in refs:
        curve = curves[curves.variant == v]
        for ax, x in ((ax_flops, curve.flops), (ax_steps, curve.step)):
            if len(curve):
                ax.plot(x, curve.heldout, color=REFERENCE_GREY, lw=1.2, ls="--" if v.startswith("fixed") else "-",
                        label=f"{plain_text(v)} (reference)", zorder=1)
    for v in show:
        curve = curves[curves.variant == v]
        for ax, x in ((ax_flops, curve.flops), (ax_steps, curve.step)):
            if len(curve):
                ax.plot(x, curve.heldout, label=plain_text(v), zorder=3, **styles[v])
                if curve.seeds.max() > 1:
                    ax.fill_between(x, curve.lo, curve.hi, color=styles[v]["color"], alpha=0.12, lw=0, zorder=2)


def _mark_growths(ax_flops, ax_steps, runs: pd.DataFrame, curves: pd.DataFrame, panel: str) -> None:
    """Dotted lines at default's growths, at their step and at the FLOPs spent by then."""
    steps = growth_steps(runs, panel)
    default = curves[curves.variant == "default"]
    if not steps or default.empty:
        return
    for i, (step, flops) in enumerate(zip(steps, np.interp(steps, default.step, default.flops), strict=True)):
        label = "growth of default" if i == 0 else None
        # Above the grid (which may fall on the same steps), below the curves.
        ax_steps.axvline(step, color=BLUE, ls=":", lw=1.0, alpha=0.8, label=label, zorder=1.5)
        ax_flops.axvline(flops, color=BLUE, ls=":", lw=1.0, alpha=0.8, label=label, zorder=1.5)


def _scale_axes(ax_flops, ax_steps, curves: pd.DataFrame, shown: pd.DataFrame, panel: str) -> None:
    """Log y when the loss spans more than a decade, else clip the first steps; log FLOPs when they span a lot."""
    positive = shown.heldout[shown.heldout > 0]
    log_y = bool(len(positive)) and positive.max() / positive.min() > LOG_Y_RATIO
    limits = None if log_y else _clip(shown)
    for ax in (ax_flops, ax_steps):
        if log_y:
            log_axis(ax, "y")
        elif limits is not None:
            ax.set_ylim(*limits)
    # One label for the row (both panels show the same loss): on the right panel it would run into the left one.
    ax_flops.set_ylabel("held-out loss (median over seeds" + (", log scale)" if log_y else
                                                             "; early steps clipped)" if limits else ")"))
    flops = curves.flops[curves.flops > 0]
    log_x = bool(len(flops)) and flops.max() / flops.min() > LOG_X_RATIO
    if log_x:
        log_axis(ax_flops, "x")
    ax_flops.set_xlabel("FLOPs, training + growth (median over seeds" + (", log scale)" if log_x else ")"))
    ax_steps.set_xlabel("optimiser step")
    _tokens_axis(ax_steps, curves)
    ax_flops.set_title(f"{plain_text(panel)}: against compute")
    ax_steps.set_title(f"{plain_text(panel)}: against steps")


def _tokens_axis(ax_steps, curves: pd.DataFrame) -> None:
    """Training tokens seen on the steps panel's top axis: a panel's runs share ``b`` and ``d_s``, so tokens are
    a fixed multiple of steps (held-out loss against tokens is the steps panel, read on that axis)."""
    moved = curves[(curves.step > 0) & curves.tokens.notna()] if "tokens" in curves else curves.iloc[:0]
    if moved.empty:
        return
    per_step = float((moved.tokens / moved.step).median())
    top = ax_steps.secondary_xaxis("top", functions=(lambda s: s * per_step, lambda t: t / per_step))
    top.set_xlabel(f"training tokens seen ({per_step:g} per step)", fontsize="small")
    top.tick_params(labelsize="small")


def _draw(runs: pd.DataFrame, med: pd.DataFrame, show: list[str], refs: list[str], title: str) -> plt.Figure:
    """Rows of (held-out vs FLOPs, held-out vs step) panels, one row per panel of the runs."""
    panels = sorted(med[med.variant.isin(show)].panel.unique())
    fig, axes = plt.subplots(len(panels), 2, figsize=(11.2, 3.9 * len(panels) + 0.6), squeeze=False)
    styles = _styles(show)
    for (ax_flops, ax_steps), panel in zip(axes, panels, strict=True):
        curves = med[med.panel == panel]
        _plot_lines(ax_flops, ax_steps, curves, show, refs, styles)
        _mark_growths(ax_flops, ax_steps, runs, curves, panel)
        _scale_axes(ax_flops, ax_steps, curves, curves[curves.variant.isin([*show, *refs])], panel)
    fig.suptitle(title, fontweight="bold")
    bottom_legend(fig, axes.flat, ncol=4)
    return fig


def _seeds_text(table: pd.DataFrame, panel: str, variants: list[str]) -> str:
    seeds = table[(table.dataset == panel) & table.variant.isin(variants)].seeds
    seeds = seeds[seeds > 0]
    if seeds.empty:
        return "no seeds"
    low, high = int(seeds.min()), int(seeds.max())
    return plural(low, "seed") if low == high else f"{low}–{high} seeds"


def _lowest(table: pd.DataFrame, panels: list[str], variants: list[str]) -> str:
    """``teacher: default; text: zero``: the variant with the lowest median final held-out loss per panel."""
    bits = []
    for panel in panels:
        measured = table[(table.dataset == panel) & table.variant.isin(variants) & (table.seeds > 0)]
        measured = measured.dropna(subset=["final_heldout"])
        if len(measured):
            bits.append(f"{panel}: {measured.loc[measured.final_heldout.idxmin()].variant}")
    return "; ".join(bits) or "none measured"


def _prepared(runs: pd.DataFrame, curves: pd.DataFrame, table: pd.DataFrame | None):
    runs = runs if "panel" in runs else prepare(runs)
    return runs, training_table(runs) if table is None else table, median_curves(runs, curves)


def _method_detail(runs: pd.DataFrame, table: pd.DataFrame, panel: str, show: list[str]) -> str:
    """One panel's finals, the lowest, and default's growth steps (``teacher (3 seeds): final held-out ...``)."""
    measured = table[(table.dataset == panel) & table.variant.isin(show) & (table.seeds > 0)]
    measured = measured.dropna(subset=["final_heldout"])
    finals = ", ".join(f"{r.variant} {four_digits(r.final_heldout)}" for r in measured.itertuples())
    text = f"{panel} ({_seeds_text(table, panel, show)}): final held-out loss {finals}"
    if len(measured):
        text += f"; lowest: {measured.loc[measured.final_heldout.idxmin()].variant}"
    steps = growth_steps(runs, panel)
    if steps:
        default = runs[(runs.panel == panel) & (runs.variant == "default") & (runs.status == "ok")]
        text += (f"; default grew after steps {', '.join(map(str, steps))} (dotted lines), d_k "
                 f"{int(default.d_k0.iloc[0])} → {table_row(table, panel, 'default').final_d_k}")
    return text


def training_curves(runs: pd.DataFrame, curves: pd.DataFrame, table: pd.DataFrame | None = None) -> FigureResult:
    """Held-out loss against FLOPs and steps for the single-head methods at default settings."""
    theme()
    title = "Growth during training: held-out loss of each method"
    runs, table, med = _prepared(runs, curves, table)
    show = variant_order([v for v in med.variant.unique() if is_main(v)])
    if not show:
        return FigureResult("train_curves", title, note="No successful training run of a single-head method at "
                                                        "default settings has a curve.")
    fig = _draw(runs, med, show, [], title + "\n(medians over seeds, bands min–max)")
    panels = sorted(med[med.variant.isin(show)].panel.unique())
    caption = ("Lines are medians over seeds at each evaluation step (seeds share steps), shaded bands the min–max "
               "over seeds; FLOPs count training steps and growths (statistics, direction, line search), not the "
               "held-out evaluation nor the making of batches. The top axis of the right-hand panels reads the steps "
               "as training tokens seen (batch × sequence length per step, twice that for text pairs). "
               f"Lowest final held-out loss: {_lowest(table, panels, show)}.")
    return FigureResult("train_curves", title, caption, fig, data=med[med.variant.isin(show)],
                        details=[_method_detail(runs, table, panel, show) for panel in panels])


def _variant_detail(table: pd.DataFrame, panel: str, show: list[str]) -> str:
    """One panel's comparisons, then the variants outside any measured group with their final loss."""
    bits = comparison_text(table, panel)
    grouped = {v for _, have in measured_groups(table, panel) for v, _ in have}
    rest = table[(table.dataset == panel) & table.variant.isin([v for v in show if v not in grouped])
                 & (table.seeds > 0)]
    bits += [f"{r.variant}: final held-out {four_digits(r.final_heldout)}" for r in rest.itertuples()]
    return f"{panel} ({_seeds_text(table, panel, show)}): " + ("; ".join(bits) or "no comparison")


def training_variants(runs: pd.DataFrame, curves: pd.DataFrame, table: pd.DataFrame | None = None) -> FigureResult:
    """Held-out loss against FLOPs and steps for every variant besides the default settings."""
    theme()
    title = "Growth during training: variants"
    runs, table, med = _prepared(runs, curves, table)
    show = variant_order([v for v in med.variant.unique() if not is_main(v)])
    if not show:
        return FigureResult("train_variants", title, note="No training variant beyond the single-head methods at "
                                                          "default settings (scale policies, Adam state reset, "
                                                          "bottleneck trigger, two heads) is in the database.")
    fig = _draw(runs, med, show, ["default", "fixed-large"],
                title + "\n(medians over seeds; default and fixed-large in grey)")
    panels = sorted(med[med.variant.isin(show)].panel.unique())
    caption = ("Each variant changes one setting of the default design (one head, scale policy rescale, Adam "
               "state padded, growth on a schedule); lines are medians over seeds, dotted lines mark default's "
               f"growths. Lowest final held-out loss among the variants: {_lowest(table, panels, show)}.")
    return FigureResult("train_variants", title, caption, fig, data=med[med.variant.isin(show)],
                        details=[_variant_detail(table, panel, show) for panel in panels])
