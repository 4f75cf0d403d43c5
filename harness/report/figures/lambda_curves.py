"""The loss along λ (fast and normal paths, tangent) and the λ each line search chose on it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from growbench import strategies
from growbench.harness.report.figures.base import (
    MIN_FONT_PT,
    FigureResult,
    bottom_legend,
    facets,
    panel_title,
    plain_text,
    stored_extra,
    theme,
)
from growbench.harness.report.figures.defaults import DEFAULT_LABEL, dataset_defaults
from growbench.harness.report.figures.palette import BLACK, BLUE, VERMILLION
from growbench.harness.report.names import short_label
from growbench.harness.report.wording import listing
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.loading import is_growth, preset_names, stored_spec
from growbench.harness.rule.reference import reference_runs

TITLE = "Loss along λ and the λ each search chooses"
PATH_COLORS = {"fast": BLUE, "normal": VERMILLION}
# Filled markers only: an unfilled one ("x", "+") ignores the face colour that tells fast from normal.
METHOD_MARKERS = {"grid": "s", "bounded": "D", "newton": "o", "quadratic": "^", "bracket": "v"}
OTHER_MARKER = "P"
# The components a run must share with the base spec for its λ to be a point on the base's curve.
DIRECTION_AXES = ("averaging", "inverse", "truncation", "metric")
STILL_FALLING = "normal path, still falling at the largest λ sampled"


def _same_direction(a: strategies.Spec, b: strategies.Spec) -> bool:
    return all(getattr(a, axis) == getattr(b, axis) for axis in DIRECTION_AXES)


def _base_spec(ref: pd.DataFrame) -> str | None:
    """The spec whose curve is drawn: among those that recorded one, the one with the most runs differing from
    it only in line search / method (the default preferred)."""
    has_curve = ref.extra.map(lambda e: bool(stored_extra(e).get("lambda_curve", {}).get("lam")))
    candidates = sorted(set(ref.strategy[has_curve]))
    if not candidates:
        return None
    parsed = {s: stored_spec(s) for s in set(ref.strategy)}
    default = strategies.default_spec()

    def siblings(spec: str) -> int:
        return sum(1 for other in parsed if other != spec and _same_direction(parsed[spec], parsed[other]))

    return sorted(candidates, key=lambda s: (-siblings(s), s != default, s))[0]


def lambda_panels(frame: pd.DataFrame, regimes: dict[str, Recommendation] | None = None
                  ) -> tuple[str | None, list[dict]]:
    """The base spec and, per dataset, its λ curve (lowest seed of the reference runs), the λ chosen by the
    runs of that seed that share its direction, and the default of the dataset's regime."""
    ref = reference_runs(frame)
    ref = ref[ref.strategy.map(is_growth)]
    base = _base_spec(ref) if len(ref) else None
    if base is None:
        return None, []
    base_spec = stored_spec(base)
    defaults = dataset_defaults(ref, regimes)
    panels = []
    for ds, runs in ref.groupby("dataset", sort=True):
        seed = runs[runs.strategy == base].seed.min()
        if pd.isna(seed):
            continue
        same = runs[runs.seed == seed]
        curve = stored_extra(same[same.strategy == base].iloc[0].extra).get("lambda_curve") or {}
        if not curve.get("lam"):
            continue
        marks = []
        for r in same.itertuples():
            spec = stored_spec(r.strategy)
            if _same_direction(spec, base_spec):
                # The search with its flags (+holdout, +shrink, +damp) names one run; the glyph, its path and method.
                marks.append(dict(strategy=r.strategy, search=str(spec).rsplit("/", 1)[1],
                                  glyph=f"{spec.line_search}:{spec.method}", line_search=spec.line_search,
                                  method=spec.method, lam=r.lam, loss_after=r.loss_after, loss_before=r.loss_before))
        panels.append(dict(dataset=ds, seed=int(seed), curve=curve, default=defaults.get(ds),
                           marks=sorted(marks, key=lambda m: (m["line_search"], m["method"], m["search"]))))
    return base, panels


def _draw_panel(ax, panel: dict) -> list[dict]:
    """Curves, tangent and the chosen λ inside the sampled range; returns the marks beyond it (named in the
    panel instead: the curves could not cover them)."""
    curve = panel["curve"]
    lam = np.asarray(curve["lam"], float)
    loss0 = float(curve["loss0"])
    fast, normal = np.asarray(curve["fast"], float) - loss0, np.asarray(curve["normal"], float) - loss0
    ax.plot(lam, fast, "-", color=PATH_COLORS["fast"], lw=1.8, label="fast path  L(S − λ X P̂ Xᵀ)")
    ax.plot(lam, normal, "--", color=PATH_COLORS["normal"], lw=1.8, label="normal path  L(X T(Z − λP̂) Xᵀ)")
    ax.plot(lam, float(curve["slope"]) * lam, ":", color=BLACK, lw=1.2, label="first-order tangent  slope·λ")
    values = np.r_[fast, normal, 0]
    span = np.nanmax(values) - np.nanmin(values)
    low, high = np.nanmin(values) - 0.25 * span, np.nanmax(values) + 0.15 * span
    ax.set_ylim(low, high if high > low else low + 1e-6)
    ax.set_xlim(-0.02 * lam[-1], lam[-1] * 1.02)
    beyond = []
    for m in panel["marks"]:
        if not 0 <= m["lam"] <= lam[-1]:
            beyond.append(m)
            continue
        color = PATH_COLORS.get(m["line_search"], BLACK)
        ax.axvline(m["lam"], color=color, lw=0.6, alpha=0.5)
        ax.scatter([m["lam"]], [m["loss_after"] - loss0], marker=METHOD_MARKERS.get(m["method"], OTHER_MARKER), s=55,
                   facecolors=color if m["line_search"] == "fast" else "white", edgecolors=color, zorder=5,
                   label=f"chosen λ: {plain_text(m['glyph'])}")
        if m["strategy"] == panel.get("default"):
            ax.scatter([m["lam"]], [m["loss_after"] - loss0], marker="o", s=240, facecolors="none",
                       edgecolors=BLACK, linewidths=1.8, zorder=6, label=f"λ of {DEFAULT_LABEL} (ringed)")
    if beyond:
        ax.text(0.98, 0.96, "beyond the sampled λ:\n" + "\n".join(
                    f"{plain_text(m['search'])}{' (default)' if m['strategy'] == panel.get('default') else ''} "
                    f"λ={m['lam']:.3g}" for m in beyond),
                transform=ax.transAxes, ha="right", va="top", fontsize=MIN_FONT_PT,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor="#bbbbbb"))
    ax.set_title(panel_title(f"{panel['dataset']} (seed {panel['seed']})", width=34))
    ax.set_xlabel("λ (step in score space, units of ‖dS‖)")
    ax.set_ylabel("loss change L(λ) − L(0)")
    return beyond


def _panel_rows(panel: dict, beyond: list[dict]) -> list[dict]:
    """The table rows of one panel: each search's λ and decrease (share of the largest), the normal path's minimum."""
    curve = panel["curve"]
    lam, loss0 = np.asarray(curve["lam"], float), float(curve["loss0"])
    normal = np.asarray(curve["normal"], float) - loss0
    decrease = {m["search"]: loss0 - m["loss_after"] for m in panel["marks"]}
    top = max(decrease.values()) if decrease else math.nan
    rows = [dict(dataset=panel["dataset"], search=m["search"], λ=m["lam"], **{"loss decrease": decrease[m["search"]]},
                 **{"% of the largest": 100 * decrease[m["search"]] / top if top > 0 else math.nan},
                 **{"on the curve": m not in beyond}) for m in panel["marks"]]
    lowest = int(np.nanargmin(normal))
    rows.append(dict(dataset=panel["dataset"], λ=lam[lowest], **{"loss decrease": -normal[lowest]},
                     search=STILL_FALLING if lowest == len(lam) - 1 else "normal path, its minimum"))
    return rows


def loss_along_lambda(frame: pd.DataFrame, regimes: dict[str, Recommendation] | None = None) -> FigureResult:
    """Actual loss along λ on the fast and normal paths, the tangent, and the λ each search chose (the regime's
    default's ringed, or marked "(default)" when beyond the sampled range)."""
    theme()
    base, panels = lambda_panels(frame, regimes)
    if not panels:
        return FigureResult("lambda", TITLE, note="No run records the loss along λ (extra.lambda_curve; databases "
                                                  "made before it existed lack it).")
    names = preset_names()
    fig, axes = facets(len(panels), size=(5.6, 4.3))
    rows, falling, off_curve = [], [], []
    for ax, panel in zip(axes, panels, strict=True):
        beyond = _draw_panel(ax, panel)
        rows += _panel_rows(panel, beyond)
        off_curve += [panel["dataset"]] if beyond else []
        falling += [panel["dataset"]] if rows[-1]["search"] == STILL_FALLING else []
    fig.suptitle(plain_text(f"{TITLE}:\ndirection of {short_label(base, names)} ({base})"), fontweight="bold")
    bottom_legend(fig, axes, ncol=3, top=0.96)
    table = pd.DataFrame(rows, columns=["dataset", "search", "λ", "loss decrease", "% of the largest", "on the curve"])
    searches = table.dropna(subset=["% of the largest"])
    close = searches.groupby("dataset")["% of the largest"].min() >= 95
    caption = (f"Curves are the loss along λ for {short_label(base, names)}'s direction ({base}) on the fast and "
               "normal paths (the normal one lies above wherever truncation to rank d_k + p loses part of the step) "
               "with the first-order tangent; markers are the λ chosen, and the loss reached, by the runs that "
               "differ from it only in line search / method (ringed: the regime's default). "
               f"Every search reaches 95% of the largest decrease on {int(close.sum())} of {len(close)} datasets; the "
               f"normal path still falls at the largest λ sampled on {listing(falling)}, and λ chosen beyond the "
               f"sampled range (named in the panel, not drawn) occur on {listing(off_curve)}.")
    return FigureResult("lambda", TITLE, caption, fig, data=table, table=table,
                        formats={"λ": ".3g", "loss decrease": ".3g", "% of the largest": ".0f"})
