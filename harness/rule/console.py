"""The recommendation as ``growbench recommend`` prints it: the choice per regime, its evidence, the runners-up.

One module of the recommendation (:mod:`harness.recommend` lists them all); :func:`what_to_use` is also the
report's lead table.
"""

from __future__ import annotations

import math

import pandas as pd

from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.loading import preset_names
from growbench.harness.rule.parameters import CLOSEST, DIAGNOSTICS, DOES_NOT_GENERALISE, GENERALISES, QUALITY_NAMES
from growbench.strategies.regimes import Regime


def _g(value: float | None, unit: str = "") -> str:
    """``value`` with three significant digits and its unit, or ``n/a`` when there is none (a run without a time)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}{unit}"


def format_text(rec: Recommendation) -> str:
    """The rule, the choice, its evidence and the runners-up, as printed by ``growbench recommend``."""
    names = preset_names()
    regime = Regime.parse(rec.regime).describe() if rec.regime else "all runs"
    lines = [f"=== regime: {regime} ===", "rule: " + rec.rule, "", "reference configurations:"]
    lines += [f"  {ds:15s} {desc}" for ds, desc in rec.cells.items()]
    if rec.excluded_baselines:
        lines.append(f"not eligible (baselines / not growth specs): {', '.join(rec.excluded_baselines)}")
    lines.append("")
    if rec.spec is None:
        lines.append("choice: none: no growth strategy is eligible (never failed and ran on every dataset)")
    else:
        tag = f" (preset {names[rec.spec]})" if rec.spec in names else ""
        flag = {GENERALISES: "", CLOSEST: "  [FALLBACK: nothing qualifies]",
                DOES_NOT_GENERALISE: "  [GROWTH DOES NOT GENERALISE HERE]"}[rec.verdict]
        lines.append(f"choice: {rec.spec}{tag}{flag}")
        lines.append("  " + rec.statement)
        time, floor = _g(rec.evidence["median_time_ms"], " ms"), _g(rec.evidence["median_x_floor"], "×")
        lines.append(f"  median over datasets of per-dataset median t_total: {time}; of t_total/t_floor: {floor}")
        lines.append("evidence (held-out gain: mean over seeds [95% interval]; best = best eligible strategy's mean; "
                     "diagnostics: medians):")
        lines += ["  " + ln for ln in evidence_frame(rec).to_string().splitlines()]
    lines += ["", "runners-up (by median time; ms and multiple of the floor):"]
    if rec.spec is not None:
        lines.append("  " + rank_note(rec))
    for r in rec.runners_up.itertuples():
        tag = f" [{r.preset}]" if r.preset else ""
        t = f"{r.time_ms:8.3g} ms {r.x_floor:6.3g}×fl" if math.isfinite(r.time_ms) else "       – ms"
        lines.append(f"  {r.rank:2d}. {t}  {r.strategy}{tag}: {r.reason}")
    return "\n".join(lines)


def evidence_frame(rec: Recommendation) -> pd.DataFrame:
    """One row per dataset: the choice's held-out gain with its interval against the best, per-seed counts, time and
    the diagnostics, as text."""
    rows = {}
    for ds, e in rec.evidence.items():
        if not isinstance(e, dict):
            continue
        mean, low, high, n = e["heldout_gain"]
        rows[ds] = {
            "held-out gain": f"{100 * mean:+.3g}% [{100 * low:+.3g}, {100 * high:+.3g}]"
                             + ("" if e["lowers"] else " (not > 0)"),
            "best": f"{100 * e['best_heldout_gain']:+.3g}%" + ("" if e["within"] else " (NOT within)"),
            "seeds lowered/raised": f"{e['seeds_lowered']}/{e['seeds_raised']} of {n}",
            "time_ms": _g(e["time_ms"]),
            **{QUALITY_NAMES[q]: f"{e[q]:.3g}" if e[q] is not None else "–" for q in DIAGNOSTICS},
        }
    return pd.DataFrame(rows).T


def what_to_use(recs: dict[str, Recommendation]) -> pd.DataFrame:
    """One row per regime: its choice and verdict, time, held-out gain and diagnostics over datasets, the runner-up."""
    rows = []
    for key, rec in recs.items():
        ev, up = rec.evidence, rec.runner_up
        rows.append({
            "regime": Regime.parse(key).describe(), "spec": rec.spec or "none", "verdict": rec.verdict,
            "fallback": rec.fallback, "time_ms": ev.get("median_time_ms"), "x_floor": ev.get("median_x_floor"),
            "heldout_gain": ev.get("median_heldout_gain"), **{q: ev.get(f"median_{q}") for q in DIAGNOSTICS},
            "datasets": len(rec.datasets),
            "seeds": min((e["seeds"] for e in ev.values() if isinstance(e, dict)), default=0),
            "runner_up": None if up is None else up.strategy,
            "runner_up_reason": None if up is None else up.reason,
        })
    return pd.DataFrame(rows)


def format_regimes(recs: dict[str, Recommendation]) -> str:
    """Every regime's :func:`format_text`, after a what-to-use summary."""
    table = what_to_use(recs)
    summary = ["what to use (per regime; held-out gain: median over datasets of the mean over seeds):"]
    for r in table.itertuples():
        if r.spec == "none":
            summary.append(f"  {r.regime:24s} none")
            continue
        flag = "" if r.verdict == GENERALISES else f"  [{r.verdict.upper()}]"
        gain = "n/a" if r.heldout_gain is None or not math.isfinite(r.heldout_gain) else f"{100 * r.heldout_gain:+.3g}%"
        summary.append(f"  {r.regime:24s} {r.spec}{flag}  ({_g(r.time_ms, ' ms')}, {_g(r.x_floor, '× floor')}; "
                       f"held-out gain {gain})")
    return "\n\n".join(["\n".join(summary), *(format_text(rec) for rec in recs.values())])


def rank_note(rec: Recommendation) -> str:
    """Why the runners-up's ranks skip one: the ranks count every growth strategy, the choice included.

    Returns
    -------
    str
        One sentence naming the choice's rank; empty when there is no choice.
    """
    if rec.spec is None:
        return ""
    rank = int(rec.table.loc[rec.table.strategy == rec.spec, "rank"].iloc[0])
    above = (" The strategies ranked above it are faster but lost for the reason on their line."
             if rank > 1 else "")
    name = preset_names().get(rec.spec)
    who = rec.spec + (f" [{name}]" if name else "")
    return (f"Ranks order all {len(rec.table)} growth strategies by median time; rank {rank}, missing below, "
            f"is the choice itself, {who}.{above}")
