"""The growth sweep's sections of the report: the database, the recommendation, the summary, the failures.

Each function returns :class:`~harness.report.sections.Section` data; :mod:`harness.report.build`
puts them in order with the figures and the training section.
"""

from __future__ import annotations

from dataclasses import fields

import pandas as pd

from growbench.harness.measure import RunConfig
from growbench.harness.report.sections import Block, Facts, Link, Paragraph, Section, Span, Table
from growbench.harness.report.wording import distinct, duration, finished_range, first_line
from growbench.harness.rule.choice import Recommendation
from growbench.harness.rule.console import rank_note, what_to_use
from growbench.harness.rule.loading import is_growth, label, preset_names
from growbench.harness.rule.parameters import DIAGNOSTICS, GENERALISES, QUALITY_NAMES, TIME_TOLERANCE
from growbench.harness.rule.reference import CELL_COLUMNS
from growbench.harness.rule.wording import rule_in_brief
from growbench.harness.runner.sweep import iter_configs, summary, sweep_presets
from growbench.strategies.regimes import Regime, all_regimes
from growbench.strategies.spec import default_specs

FAILED_TITLE, FAILED_ANCHOR = "Failed runs", "failed"
NO_CHOICE = "no growth strategy is eligible (never failed and ran on every dataset)"
# Beyond this spread of the floor between runs of one group, differences in t_total are noise.
NOISY_FLOOR_RATIO = 2


def failed_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The failed runs: configuration and the first line of the error."""
    failed = frame[frame.status != "ok"]
    out = failed[["strategy", "dataset", "d_s", "d_e", "b", "d_k", "p", "seed", "device", "status"]].copy()
    out["error"] = failed.error.map(first_line)
    return out.reset_index(drop=True)


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`harness.runner.sweep.summary` with the preset name of each spec."""
    table = summary(frame)
    names = preset_names()
    table.insert(3, "preset", table.strategy.map(lambda s: names.get(s, "")))
    return table


def timing_reliability(frame: pd.DataFrame) -> str:
    """How much the floor (the same work for every strategy of one dataset, seed and configuration) varied
    between runs: a direct measure of how quiet the machine was."""
    ok = frame[(frame.status == "ok") & (frame.t_floor > 0)]
    spread = ok.groupby(["dataset", "seed", *CELL_COLUMNS], dropna=False).t_floor.agg(["min", "max", "size"])
    spread = spread[spread["size"] >= 3]
    if spread.empty:
        return "Too few runs per dataset/seed/configuration to judge timing noise."
    ratio = spread["max"] / spread["min"]
    lowest = ok.merge(spread["min"].rename("group_min").reset_index(), on=["dataset", "seed", *CELL_COLUMNS])
    share = float((lowest.t_floor > 3 * lowest.group_min).mean())
    text = (f"The floor (the same work for every strategy of a dataset, seed and configuration) varied between runs by "
            f"a factor of {ratio.median():.2g} (median over {len(ratio)} groups; at most {ratio.max():.3g}); "
            f"{100 * share:.0f}% of runs measured a floor more than 3× their group's smallest.")
    if ratio.max() > NOISY_FLOOR_RATIO:
        return text + (" The machine was not quiet while the sweep ran (other load, CPU steal): differences in "
                       "t_total between runs of less than that factor are not meaningful. The ablation and "
                       "time-breakdown figures therefore compare times relative to each run's own floor, which is "
                       "timed between the same run's repeats; the Pareto front and the recommendation use t_total "
                       "as specified.")
    return text + " Timings are consistent between runs."


def database_facts(frame: pd.DataFrame, db: str) -> dict:
    """What the database holds: counts, datasets, devices, environment, when the runs finished."""
    ok = frame[frame.status == "ok"]
    return {
        "database": str(db),
        "runs": len(frame), "ok": len(ok), "failed": int((frame.status != "ok").sum()),
        "strategies": frame.strategy.nunique(),
        "growth strategies": int(frame.strategy.drop_duplicates().map(is_growth).sum()),
        "datasets": distinct(frame, "dataset"), "devices": distinct(frame, "device"),
        "device names": distinct(frame, "device_name"), "cpu kernels": distinct(frame, "cpu_capability"),
        "torch": distinct(frame, "torch_version"),
        "threads": distinct(frame, "threads"), "allocator": distinct(frame, "allocator"),
        "git commit": distinct(frame, "git_commit"),
        "code version": distinct(frame, "code_version"), "runs finished": finished_range(frame),
    }


def infer_sweep(frame: pd.DataFrame) -> str | None:
    """The sweep preset whose configurations are exactly the database's, if any (for the regenerating command)."""
    cols = [f.name for f in fields(RunConfig)]
    try:
        have = {tuple(r) for r in frame[cols].astype(str).itertuples(index=False)}
        for name, grids in sweep_presets().items():
            # Configuration by configuration, to the first the database lacks: building the whole of the `full`
            # preset to compare took most of a report's time.
            matched = set()
            for config in iter_configs(grids):
                key = tuple(str(getattr(config, c)) for c in cols)
                if key not in have:
                    break
                matched.add(key)
            else:
                if matched == have:
                    return name
    except Exception:  # noqa: BLE001 - only a convenience for the report's first lines
        return None
    return None


def database_section(facts: dict, extra: list[Block]) -> Section:
    """The database's facts, a pointer to the failed runs when there are any, and ``extra`` blocks."""
    blocks: list[Block] = [Facts(facts)]
    if facts["failed"]:
        blocks.append(Paragraph.of(Span(f"{facts['failed']} of {facts['runs']} runs failed", "strong"), ": see ",
                                   Link("failed runs", FAILED_ANCHOR, FAILED_TITLE), ".", style="note"))
    return Section("Database", blocks + extra)


def evidence_table(rec: Recommendation) -> pd.DataFrame:
    """Per dataset: the choice's mean held-out gain over seeds with its 95 % interval, against the best eligible
    strategy's; seeds on which it lowered or raised the held-out loss beyond its own noise; the step's diagnostics."""
    names = preset_names()
    rows = []
    for ds, e in rec.evidence.items():
        if not isinstance(e, dict):
            continue
        mean, low, high, n = e["heldout_gain"]
        diff = e["difference"]
        rows.append({
            "dataset": ds, "seeds": n, "held-out gain (%)": 100 * mean,
            "95% interval": f"[{100 * low:+.3g}, {100 * high:+.3g}]",
            "lowers beyond noise": "yes" if e["lowers"] else "NO",
            "best (%)": f"{100 * e['best_heldout_gain']:+.3g} ({label(e['best_strategy'], names)})",
            "difference to best (%)": (f"{100 * diff[0]:+.3g} [{100 * diff[1]:+.3g}, {100 * diff[2]:+.3g}]"
                                       if diff[3] > 1 else "0 (the best)"),
            "within": "yes" if e["within"] else "NO",
            "shortfall resolvable (80% power)": (f"{100 * e['resolvable_shortfall']:.2g}% of the best"
                                                 if e.get("resolvable_shortfall") is not None else "–"),
            "seeds lowered / raised": f"{e['seeds_lowered']} / {e['seeds_raised']}",
            "time": duration(e["time_ms"]), **{QUALITY_NAMES[q]: e[q] for q in DIAGNOSTICS},
            "statistics tokens": e["statistics_tokens"], "tokens / d_e²": e["tokens_per_d_e2"],
        })
    return pd.DataFrame(rows)


#: The columns of :func:`evidence_table` the rule decides on; the others are the step's diagnostics.
DECISION_COLUMNS = ("dataset", "held-out gain (%)", "95% interval", "lowers beyond noise", "best (%)",
                    "difference to best (%)", "within", "shortfall resolvable (80% power)")


def what_to_use_section(recs: dict[str, Recommendation], error: str | None) -> Section:
    """The page's lead: per regime, the strategy to use, whether growth generalises there, its cost and held-out
    gain, and the runner-up with its reason.

    Regimes without runs in this database are listed with the choice ``strategies.make("default")``
    borrows for them, so that a reader on a GPU sees what will run.
    """
    if not recs:
        return Section("What to use", [Paragraph.of(f"No recommendation: {error or NO_CHOICE}", style="note")])
    table = what_to_use(recs)
    # The first reason is enough here: the regime's section lists every one.
    table["runner-up: why it lost"] = [
        "" if up is None else f"{up}: {_shorten(str(why).split('; ')[0])}"
        for up, why in zip(table.runner_up, table.runner_up_reason, strict=True)]
    table["heldout_gain"] = 100 * table.heldout_gain
    table["time_ms"] = table.time_ms.map(duration)
    # What a reader picks by: the choice, its verdict, cost and held-out gain. The step's diagnostics (× floor,
    # optimality, path efficiency, batch gain) are in each regime's evidence: here they pushed the table past the
    # width of a laptop's window, and the runner-up's reason out of sight.
    table = table[["regime", "spec", "verdict", "time_ms", "heldout_gain", "seeds", "runner-up: why it lost"]].rename(
        columns={"time_ms": "time", "heldout_gain": "held-out gain (%)"})
    missing = [r for r in all_regimes() if r.key not in recs]
    blocks: list[Block] = [
        Paragraph.of("Use ", Span('strategies.make("default")', "code"), ": it runs, per regime of its inputs "
                     "(device × width d_e), the choice below, which this database's runs make by the rule of ",
                     Link("the recommendation", "recommendation", recommendation_title(next(iter(recs.values())))),
                     f" (the fastest strategy that {rule_in_brief()}). The held-out gain is the held-out loss "
                     "decrease as a share of the held-out loss before the growth, on test batches the step never "
                     "saw (median over the regime's datasets of the mean over seeds); each regime's evidence below "
                     "adds the step's diagnostics on the batches it was fitted to (optimality, path efficiency, "
                     "batch gain)."),
        Table(table, wide=("runner-up: why it lost",), formats={"held-out gain (%)": "+.3g"}),
    ]
    for key, rec in recs.items():
        if rec.verdict != GENERALISES:
            blocks.append(Paragraph.of(Span(f"{Regime.parse(key).describe()}: ", "strong"), rec.statement,
                                       style="note"))
        tied = [s for s in rec.as_fast if s != rec.spec]
        if tied:
            blocks.append(Paragraph.of(
                Span(f"{Regime.parse(key).describe()}: ", "strong"), "a tie. ", Span(rec.spec, "code"), " and ",
                *[part for s in tied for part in (Span(s, "code"), " ")],
                f"all qualify and are as fast within {100 * TIME_TOLERANCE:g}%: they are interchangeable, and a "
                "rerun on another machine may name any of them (the choice among them is the one closest to the "
                "best held-out gain)."))
    if missing:
        shipped = default_specs()
        borrowed = "; ".join(f"{r.describe()}: {shipped[r].spec}" for r in missing)
        blocks.append(Paragraph.of("No runs here for ", ", ".join(r.key for r in missing),
                                   ". There the shipped default.json decides, borrowing its nearest regime's choice "
                                   f"when it has none: {borrowed}.", style="note"))
    return Section("What to use", blocks, anchor="what-to-use")


def _choice(rec: Recommendation) -> Paragraph:
    names = preset_names()
    parts: list = ["Choice: ", Span(rec.spec, "code")]
    if rec.spec in names:
        parts += [" (preset ", Span(names[rec.spec], "strong"), ")"]
    if rec.fallback:
        parts += [" — ", Span(f"fallback: {rec.verdict}", "em")]
    parts.append(f", median time {duration(rec.evidence['median_time_ms'])}. {rec.statement}")
    return Paragraph.of(*parts, style="choice")


def _shorten(text: str, limit: int = 140) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def recommendation_title(rec: Recommendation | None) -> str:
    """The heading of a regime's recommendation (Markdown viewers derive its anchor from it)."""
    title = "Recommended default strategy"
    if rec is not None and rec.regime:
        title += f": {Regime.parse(rec.regime).describe()}"
    return title


def recommendation_sections(rec: Recommendation | None, error: str | None, anchor: str = "recommendation"
                            ) -> list[Section]:
    """The choice of one regime, its rule and reference configurations; its evidence; the runners-up and why
    they lost."""
    title = recommendation_title(rec)
    blocks: list[Block] = []
    if rec is None or rec.spec is None:
        blocks.append(Paragraph.of(f"No recommendation: {error or NO_CHOICE}", style="note"))
    if rec is None:
        return [Section(title, blocks, anchor=anchor)]
    if rec.spec is not None:
        blocks.append(_choice(rec))
    if rec.forced_by:
        blocks.append(Paragraph.of("Forced to a fallback by: " + "; ".join(
            f"{f['dataset']}: " + ("does not lower the held-out loss beyond noise" if f["measure"] == "lowers" else
                                   f"not shown within the tolerance of {label(f['best_strategy'])}")
            for f in rec.forced_by) + ".", style="note"))
    blocks.append(Paragraph.of(Span("Rule.", "strong"), " ", rec.rule))
    cells: list = ["Reference configurations: "]
    for i, (ds, desc) in enumerate(rec.cells.items()):
        cells += ["; " if i else "", Span(ds, "strong"), f": {desc}"]
    blocks.append(Paragraph.of(*cells, "."))
    sections = [Section(title, blocks, anchor=anchor)]
    if rec.spec is not None:
        # Two tables, so that each fits a laptop's window: what the rule decides on, then the step's diagnostics.
        evidence = evidence_table(rec)
        sections.append(Section("Evidence (held-out gain over seeds, diagnostics as medians)", [
            Table(evidence[list(DECISION_COLUMNS)], formats={"held-out gain (%)": "+.3g"}, wide=("best (%)",)),
            Table(evidence[["dataset", *(c for c in evidence.columns if c not in DECISION_COLUMNS)]])],
            level=3, folded="the choice against the best, per dataset"))
    runners_up = rec.runners_up[["rank", "strategy", "preset", "time_ms", "x_floor", "reason"]].rename(
        columns={"time_ms": "median time", "x_floor": "× floor"})
    runners_up["median time"] = runners_up["median time"].map(duration)
    ranks = [Paragraph.of(rank_note(rec))] if rec.spec is not None else []
    sections.append(Section("Runners-up, by median time, with the reason they lost",
                            [*ranks, Table(runners_up, wide=("reason",))], level=3,
                            folded=f"{len(runners_up)} strategies and why each lost"))
    return sections


def summary_section(table: pd.DataFrame) -> Section:
    """The medians per dataset, device and strategy (as in ``summary.csv``)."""
    return Section("Summary: medians per dataset, device and strategy", [
        Paragraph.of("Also in ", Span("summary.csv", "file"), ". Times in ms (medians over the runs of every "
                     "configuration of that dataset); ", Span("x_floor", "code"), " = t_total / t_floor; optimality "
                     "and held-out decrease are medians."),
        Table(table, small=True)])


def failed_section(failed: pd.DataFrame) -> Section:
    """The failed runs with their first error line, or that there are none."""
    blocks: list[Block] = ([Table(failed, wide=("error",))] if len(failed) else
                           [Paragraph.of("None: every run succeeded.")])
    return Section(FAILED_TITLE, blocks, anchor=FAILED_ANCHOR)
