"""The rule's wording: the rule in one paragraph, a regime's verdict in plain words, why each strategy lost.

One module of the recommendation (:mod:`harness.recommend` lists them all). The rule (:mod:`harness.rule.choice`)
decides; this module only says what it decided, from the numbers it decided with.
"""

from __future__ import annotations

import math

import pandas as pd

from growbench.harness.rule.loading import is_growth
from growbench.harness.rule.paired import Paired, SeedRuns
from growbench.harness.rule.parameters import (
    CLOSEST,
    CONFIDENCE,
    DOES_NOT_GENERALISE,
    GENERALISES,
    TIME_TOLERANCE,
    TOLERANCE,
)
from growbench.harness.validate import input_width
from growbench.strategies.regimes import Regime

RULE = (
    "Per regime (device kind x band of d_e), among growth strategies (baselines excluded) that never failed on a run "
    "of the regime and ran every seed of every dataset of it, the decision is made on the held-out gain (held-out "
    "loss decrease as a share of the held-out loss before growth, on test batches the step never saw; doing nothing "
    "gains 0). A strategy qualifies when, on every dataset, the {conf:g}% t interval of its mean gain over seeds lies "
    "above 0 (it lowers the held-out loss beyond noise) and the lower end of the {conf:g}% t interval of its paired "
    "differences to the best strategy's gain is at least -{frac:g}*|best| (non-inferior to the best, which has the "
    "highest mean gain). Among qualifying strategies, the fastest by the median over datasets of the per-dataset "
    "median {metric} is chosen; strategies within {time_tol:g}% of its time count as as fast, and among them the one "
    "with the smallest mean shortfall from the best's gain wins. If none qualifies, the one with the smallest worst "
    "shortfall among those that lower the held-out loss on every dataset is chosen (fallback); if no strategy does, "
    "growth does not generalise in the regime, and the same steps are applied to the datasets where some strategy "
    "lowers the held-out loss, among the strategies shown harmless on the others (there the lower end of their "
    "interval is at least -{frac:g} times the median best gain of those datasets); if no dataset or no strategy "
    "allows that, the strategy with the highest mean gain on its worst dataset (the one that harms least) is named. "
    "Per dataset only its reference configuration counts: the sizes/settings/device group with the most strategies "
    "(then the most runs); groups that still tie count as datasets of their own."
)


def rule_text(tolerance: float = TOLERANCE, time_metric: str = "t_total", confidence: float = CONFIDENCE) -> str:
    """The rule in one paragraph, with the tolerance and confidence filled in."""
    metric = "t_total" if time_metric == "t_total" else "t_total/t_floor (x_floor)"
    return RULE.format(frac=tolerance, metric=metric, conf=100 * confidence, time_tol=100 * TIME_TOLERANCE)


def rule_in_brief(tolerance: float = TOLERANCE) -> str:
    """The rule's conditions in one clause, for prose that names the choice: "lowers the held-out loss beyond noise
    on every dataset and keeps at least 80% of the best's held-out gain there (...)"."""
    return (f"lowers the held-out loss beyond seed noise on every dataset and keeps, beyond noise, at least "
            f"{100 * (1 - tolerance):g}% of the best strategy's held-out gain there (times within "
            f"{100 * TIME_TOLERANCE:g}% of the fastest count as equal, and then the closer to the best wins)")


def spared_how(row: pd.Series) -> str:
    """How step 7 chose ``row``'s strategy where growth does not generalise, in words."""
    if row.harmless and row.qualifies_growable:
        return ("this one is the rule's choice on the datasets where some strategy lowers it, and is shown harmless on "
                "the others")
    if row.harmless and row.lowers_growable:
        return (f"this one comes closest to the best's gain on the datasets where some strategy lowers it (worst "
                f"shortfall {100 * row.worst_shortfall_growable:.0f}%), and is shown harmless on the others")
    return f"this one harms least, mean held-out gain {100 * row.worst_gain:+.3g}% on its worst dataset"


def explain_choice(table: pd.DataFrame, chosen: str, verdict: str, key: str, tied: dict[str, float]) -> None:
    """Give the choice, and every qualifying strategy it beat, their reasons (in ``table``, in place)."""
    mine = table.loc[table.strategy == chosen].iloc[0]
    front = mine[key] / tied[chosen] if chosen in tied else math.nan  # the front-runner's time
    unit = " ms" if key == "time_ms" else "× the floor"
    why = {GENERALISES: "",
           CLOSEST: f" (fallback: nothing qualifies; its worst shortfall from the best's held-out gain is "
                    f"{100 * mine.worst_shortfall:.1f}%)",
           DOES_NOT_GENERALISE: (" (fallback: no strategy lowers the held-out loss on every dataset; "
                                 f"{spared_how(mine)})")}
    for i, r in table.iterrows():
        if r.strategy == chosen:
            table.at[i, "reason"] = "chosen" + why[verdict]
        elif r.strategy in tied:
            gaps = " vs ".join(distinct_percents(r.mean_shortfall, mine.mean_shortfall))
            lost = (f"further from the best: mean shortfall from the best's held-out gain {gaps}"
                    if r.mean_shortfall > mine.mean_shortfall else
                    f"as close to the best (mean shortfall {gaps}) and "
                    + ("slower" if r[key] > mine[key] else "after it in spec order"))
            speed = (f"as fast ({r[key]:.3g}{unit} vs {mine[key]:.3g}{unit}; both within {100 * TIME_TOLERANCE:g}% "
                     "of the fastest)" if math.isfinite(front) else
                     "as fast as far as anyone can tell (no qualifying strategy has a usable time)")
            table.at[i, "reason"] = f"qualifies and is {speed} but {lost}"
        elif r.qualifies and not math.isfinite(r[key]):
            table.at[i, "reason"] = ("qualifies but has no usable time (t_total of its runs missing, infinite or not "
                                     "positive), so it cannot be shown as fast as the choice")
        elif r.qualifies:
            table.at[i, "reason"] = (f"qualifies but slower: {r[key]:.3g}{unit} vs {mine[key]:.3g}{unit} "
                                     f"({r[key] / mine[key]:.2f}×; more than {100 * TIME_TOLERANCE:g}% above the "
                                     f"fastest qualifying strategy's {front:.3g}{unit})")


def distinct_percents(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` as percentages with two decimals, or with as many more (up to six) as it takes for two
    different values not to read as equal (a tie broken at the fourth decimal must not print "4.37% vs 4.37%")."""
    for decimals in range(2, 7):
        pa, pb = f"{100 * a:.{decimals}f}%", f"{100 * b:.{decimals}f}%"
        if pa != pb or a == b:
            break
    return pa, pb


def budgets_tried(frame: pd.DataFrame, dataset: str, confidence: float) -> str | None:
    """What the runs of ``dataset`` at every statistics budget in ``frame`` say: the fewest tokens at which a growth
    strategy lowers the held-out loss beyond noise on every seed (its mean gain's interval above 0 and each seed's
    gain above 0), or, where none does, the most tokens tried. None with one budget only (the reference's, which the
    statement already names).
    """
    ok = frame[(frame.status == "ok") & frame.strategy.map(is_growth) & (frame.dataset == dataset)]
    ok = ok[ok.statistics_tokens.notna() & (ok.statistics_tokens > 0)]
    if ok.statistics_tokens.nunique() < 2:
        return None
    gain = ok.heldout_decrease / ok.heldout_before  # the rule's held-out gain (rule.reference.measures)
    d_in = input_width(dataset, int(ok.d_e.iloc[0]))
    per_entry = ok.statistics_tokens / d_in**2
    works = []
    for (tokens, strategy), idx in ok.groupby(["statistics_tokens", "strategy"]).groups.items():
        seeds = gain[idx].to_numpy()
        if len(seeds) > 1 and (seeds > 0).all() and Paired.of(seeds, confidence).above_zero():
            works.append((int(tokens), strategy))
    if works:
        tokens, strategy = min(works)
        return (f"with {tokens} statistics tokens ({float(per_entry[ok.statistics_tokens == tokens].iloc[0]):.2g} per "
                f"entry of P) {strategy} does, on every seed")
    most = int(ok.statistics_tokens.max())
    return (f"no growth strategy does on every seed at any budget these runs tried, up to {most} statistics tokens "
            f"({float(per_entry[ok.statistics_tokens == most].iloc[0]):.2g} per entry of P)")


def regime_statement(mine: pd.Series, verdict: str, runs: SeedRuns, eligible: set[str], evidence: dict,
                     tolerance: float, regime: Regime, budgets: dict[str, str] | None = None) -> str:
    """The regime's verdict in plain words (``mine``: the chosen strategy's row of the table)."""
    chosen = mine.strategy
    if verdict == GENERALISES:
        return (f"{chosen} lowers the held-out loss beyond noise on every dataset of {regime.describe()} and keeps, "
                f"beyond noise, at least {100 * (1 - tolerance):g}% of the best strategy's held-out gain there.")
    if verdict == CLOSEST:
        return (f"Every dataset of {regime.describe()} has growth strategies that lower the held-out loss beyond "
                f"noise, but none keeps {100 * (1 - tolerance):g}% of the best one's gain on every dataset beyond "
                f"noise; {chosen} comes closest (its worst shortfall from the best's gain: "
                f"{100 * evidence['worst_shortfall']:.0f}%).")
    growable = runs.growable(eligible)
    nowhere = [ds for ds in runs.datasets if ds not in growable]
    tokens = [f"{ds}: {evidence[ds]['statistics_tokens']:.0f} tokens, {evidence[ds]['tokens_per_d_e2']:.2g} per entry "
              "of P" for ds in nowhere if ds in evidence and evidence[ds]["statistics_tokens"] is not None]
    worst = min((ds for ds in evidence if isinstance(evidence[ds], dict)),
                key=lambda ds: evidence[ds]["heldout_gain"][0], default=None)
    if worst is None:
        return ("These runs hold no held-out gain (runs from before it was measured): the rule cannot tell whether "
                f"growth generalises here; {chosen} is named only as the first eligible strategy.")
    if mine.harmless and (mine.qualifies_growable or mine.lowers_growable):
        how = ("the rule's choice there (it lowers the held-out loss beyond noise and keeps, beyond noise, at least "
               f"{100 * (1 - tolerance):g}% of the best strategy's gain)" if mine.qualifies_growable else
               f"the closest there to the best strategy's gain (worst shortfall "
               f"{100 * mine.worst_shortfall_growable:.0f}%)")
        why = (f"the strategy that, on the datasets where growth generalises ({', '.join(growable)}), is {how}, and "
               f"that is shown not to raise the held-out loss on {', '.join(nowhere)} by more than "
               f"{100 * tolerance:g}% of the best gain where growth works")
    else:
        why = (f"the strategy that harms least (mean held-out gain {100 * evidence[worst]['heldout_gain'][0]:+.3g}% "
               f"on its worst dataset, {worst})")
    tried = [f"on {ds}, {budgets[ds]}" for ds in nowhere if (budgets or {}).get(ds)]
    advice = (f"At other budgets of these runs: {'; '.join(tried)}." if tried else
              "Use more statistics tokens, or do not grow.")
    return (f"Growth with these statistics does not generalise here: on {', '.join(nowhere)}, no growth strategy "
            f"lowers the held-out loss beyond noise ({'; '.join(tokens) or 'statistics tokens not recorded'}). "
            f"{advice} strategies.make(\"default\") runs {chosen}, {why}, and records this in the growth's "
            "fallback.")
