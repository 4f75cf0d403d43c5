"""Held-out loss during training, against compute and against steps: the methods, then the variants."""

from __future__ import annotations

import itertools
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from growbench.harness.report.figures.base import (
    MAX_WIDTH_IN,
    FigureResult,
    bottom_legend,
    facets,
    log_axis,
    plain_text,
    si_ticks,
    theme,
)
from growbench.harness.report.figures.palette import BLACK, BLUE, GREEN, GREY, HUES, ORANGE, PURPLE, shades
from growbench.harness.report.train_runs import (
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
from growbench.harness.report.train_verdict import comparison_text, measured_groups
from growbench.harness.report.wording import four_digits, plural

# The references of the variants figure: the design every variant changes one setting of, and the target size.
REFERENCE_STYLES = {"default": dict(color=BLACK, ls="--", lw=2.2),
                    "fixed-large": dict(color="#666666", ls="-.", lw=2.2)}
# Characters per line of a panel's title (a half-width axis at the figure's font size).
PANEL_TITLE_WIDTH = 40
# The most variants one panel of the variants figure shows (the references aside): more are not told apart.
MAX_SERIES = 5
# The methods' families: default growth alone, each baseline alone, the fixed sizes together (shades of black,
# dashed). The baselines were once shades of one warm hue: random, zero and gradmax, whose curves often lie on one
# another, could not be told apart; each now has a hue of its own, far from the default's blue and from each other.
METHOD_FAMILIES = {"default": "default", **{b: b for b in BASELINES}, "fixed-small": "fixed", "fixed-large": "fixed"}
METHOD_HUES = {"default": BLUE, "random": ORANGE, "zero": GREEN, "gradmax": PURPLE, "fixed": BLACK}
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


def _plot_lines(targets: list[tuple[plt.Axes, str]], curves: pd.DataFrame, show: list[str], refs: list[str],
                styles: dict) -> None:
    """Each variant's median curve (band min–max when several seeds) on each ``(panel, x column)`` of ``targets``;
    the references in black and grey, dashed and thick, named as references."""
    for v in refs:
        curve = curves[curves.variant == v]
        for ax, x in targets:
            if len(curve):
                ax.plot(curve[x], curve.heldout, label=f"{plain_text(v)} (reference)", zorder=2.5,
                        **REFERENCE_STYLES.get(v, REFERENCE_STYLES["fixed-large"]))
    for v in show:
        curve = curves[curves.variant == v]
        for ax, x in targets:
            if len(curve):
                ax.plot(curve[x], curve.heldout, label=plain_text(v), zorder=3, **styles[v])
                if curve.seeds.max() > 1:
                    ax.fill_between(curve[x], curve.lo, curve.hi, color=styles[v]["color"], alpha=0.12, lw=0,
                                    zorder=2)


def _mark_growths(targets: list[tuple[plt.Axes, str]], runs: pd.DataFrame, curves: pd.DataFrame, panel: str,
                  color: str = BLUE) -> None:
    """Dotted lines at default's growths, at their step (x column ``step``) or the FLOPs spent by then (``flops``)."""
    steps = growth_steps(runs, panel)
    default = curves[curves.variant == "default"]
    if not steps or default.empty:
        return
    at = {"step": steps, "flops": np.interp(steps, default.step, default.flops)}
    for ax, x in targets:
        for i, value in enumerate(at[x]):
            # Above the grid (which may fall on the same steps), below the curves.
            ax.axvline(value, color=color, ls=":", lw=1.0, alpha=0.8, label="growth of default" if i == 0 else None,
                       zorder=1.5)


def _scale_y(axes: list[plt.Axes], shown: pd.DataFrame) -> str:
    """Log y when the loss spans more than a decade, else the first steps clipped when they would squash the rest;
    returns the y label that says which."""
    positive = shown.heldout[shown.heldout > 0]
    log_y = bool(len(positive)) and positive.max() / positive.min() > LOG_Y_RATIO
    limits = None if log_y else _clip(shown)
    for ax in axes:
        if log_y:
            log_axis(ax, "y")
        elif limits is not None:
            ax.set_ylim(*limits)
    return "held-out loss (median over seeds" + (", log scale)" if log_y else "; early steps clipped)" if limits
                                                 else ")")


def _flops_axis(ax: plt.Axes, curves: pd.DataFrame) -> None:
    """FLOPs on x, on a log scale when they span a lot, with SI prefixes."""
    flops = curves.flops[curves.flops > 0]
    log_x = bool(len(flops)) and flops.max() / flops.min() > LOG_X_RATIO
    if log_x:
        log_axis(ax, "x")
    si_ticks(ax.xaxis)
    ax.set_xlabel("FLOPs, training + growth (median over seeds" + (", log scale)" if log_x else ")"))


def _scale_axes(ax_flops, ax_steps, curves: pd.DataFrame, shown: pd.DataFrame, panel: str) -> None:
    """Both panels of a row: y as :func:`_scale_y`, FLOPs as :func:`_flops_axis`, steps with the tokens on top."""
    # One label for the row (both panels show the same loss): on the right panel it would run into the left one.
    ax_flops.set_ylabel(_scale_y([ax_flops, ax_steps], shown))
    _flops_axis(ax_flops, curves)
    ax_steps.set_xlabel("optimiser step")
    _tokens_axis(ax_steps, curves)
    # A panel named by its dataset and schedule is too long for one line above a half-width axis.
    name = "\n".join(textwrap.wrap(plain_text(panel), PANEL_TITLE_WIDTH, break_long_words=False))
    ax_flops.set_title(f"{name}: against compute")
    ax_steps.set_title(f"{name}: against steps")


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
    si_ticks(top.xaxis)


def _draw(runs: pd.DataFrame, med: pd.DataFrame, show: list[str], title: str) -> plt.Figure:
    """Rows of (held-out vs FLOPs, held-out vs step) panels, one row per panel of the runs."""
    panels = sorted(med[med.variant.isin(show)].panel.unique())
    fig, axes = plt.subplots(len(panels), 2, figsize=(11.2, 3.9 * len(panels) + 0.6), squeeze=False)
    styles = _styles(show)
    for (ax_flops, ax_steps), panel in zip(axes, panels, strict=True):
        curves = med[med.panel == panel]
        targets = [(ax_flops, "flops"), (ax_steps, "step")]
        _plot_lines(targets, curves, show, [], styles)
        _mark_growths(targets, runs, curves, panel)
        _scale_axes(ax_flops, ax_steps, curves, curves[curves.variant.isin(show)], panel)
    fig.suptitle(title, fontweight="bold")
    bottom_legend(fig, axes.flat, ncol=4)
    return fig


def variant_groups(variants: list[str]) -> list[tuple[str, list[str]]]:
    """The variants in the comparison groups they belong to (each in its first), then the rest, at most
    :data:`MAX_SERIES` to a group: one small panel each, with few enough lines to tell apart."""
    groups, placed = [], set()
    for group, names in COMPARISONS:
        members = [v for v in names if v in variants and v not in placed]
        if members:
            groups.append((group, members))
            placed.update(members)
    rest = [v for v in variants if v not in placed]
    groups += [("other variants", rest[i:i + MAX_SERIES]) for i in range(0, len(rest), MAX_SERIES)]
    return groups


def _draw_variants(runs: pd.DataFrame, med: pd.DataFrame, show: list[str], refs: list[str], title: str
                   ) -> plt.Figure:
    """One small panel per dataset and comparison group, against FLOPs: the group's variants in distinct hues,
    ``refs`` (default and fixed-large) as references."""
    cells = [(panel, group, members) for panel in sorted(med[med.variant.isin(show)].panel.unique())
             for group, members in variant_groups([v for v in show if v in set(med.variant[med.panel == panel])])]
    fig, axes = facets(len(cells), ncols=2, size=(MAX_WIDTH_IN / 2, 4.3))
    for ax, (panel, group, members) in zip(axes, cells, strict=True):
        curves = med[med.panel == panel]
        styles = {v: dict(color=HUES[i % len(HUES)], lw=1.8) for i, v in enumerate(members)}
        _plot_lines([(ax, "flops")], curves, members, refs, styles)
        _mark_growths([(ax, "flops")], runs, curves, panel, color=GREY)
        ax.set_ylabel(_scale_y([ax], curves[curves.variant.isin([*members, *refs])]))
        _flops_axis(ax, curves)
        ax.set_title(f"{plain_text(panel)}: {group}")
        ax.legend(loc="upper right", framealpha=0.9)
    fig.suptitle(title, fontweight="bold")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
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
    fig = _draw(runs, med, show, title + "\n(medians over seeds, bands min–max)")
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
    """Held-out loss against FLOPs for every variant besides the default settings, one small panel per dataset and
    group of variants compared with one another."""
    theme()
    title = "Growth during training: variants"
    runs, table, med = _prepared(runs, curves, table)
    show = variant_order([v for v in med.variant.unique() if not is_main(v)])
    if not show:
        return FigureResult("train_variants", title, note="No training variant beyond the single-head methods at "
                                                          "default settings (scale policies, Adam state reset, "
                                                          "bottleneck trigger, two heads) is in the database.")
    fig = _draw_variants(runs, med, show, ["default", "fixed-large"],
                         title + " (medians over seeds; default and fixed-large as references)")
    panels = sorted(med[med.variant.isin(show)].panel.unique())
    caption = ("Each variant changes one setting of the default design (one head, scale policy rescale, Adam "
               "state padded, growth on a schedule), one panel per group of variants compared with one another, "
               "with default (black, dashed) and fixed-large (grey, dash-dotted) as references; lines are medians "
               "over seeds, dotted lines mark default's "
               f"growths. Lowest final held-out loss among the variants: {_lowest(table, panels, show)}.")
    return FigureResult("train_variants", title, caption, fig, data=med[med.variant.isin(show)],
                        details=[_variant_detail(table, panel, show) for panel in panels])
