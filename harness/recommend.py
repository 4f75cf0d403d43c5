"""Choose the default strategy of each regime from a results database, by a fixed rule judged on unseen data.

The rule (:func:`rule_text`), applied by :func:`recommend` to the runs of one regime
(device kind × band of widths, :mod:`strategies.regimes`) and by
:func:`recommend_regimes` to each regime with runs, is below. This module is its index: each part lives in a
module of its own, and every public name is importable from here.

- :mod:`harness.rule.parameters`: the tolerances, the confidence, the verdicts' names;
- :mod:`harness.rule.loading`: the database as one frame (:func:`load_frame`), timings cleaned; which names are
  growth specs;
- :mod:`harness.rule.reference`: steps 1 and 2, each dataset's reference configuration and every run's regime;
  the per-run measures;
- :mod:`harness.rule.paired`: the statistics, :class:`Paired` (a mean over seeds and its t interval) and the
  runs summarised by seed;
- :mod:`harness.rule.choice`: steps 3 to 7, :func:`recommend` and :class:`Recommendation`;
- :mod:`harness.rule.wording`: the rule in one paragraph, each verdict in plain words, each runner-up's reason;
- :mod:`harness.rule.console`: what ``growbench recommend`` prints;
- :mod:`harness.rule.default_file`: writing ``strategies/default.json`` (:func:`write_default`).

The rule:

1. **Regime.** Only the runs of the regime count: its device kind (cpu, or cuda for any
   accelerator) and its band of ``d_e`` (≤ 128, 128–1024, > 1024).
2. **Reference configuration.** For each dataset, only the runs of its *reference
   configuration* count: the group of runs sharing sizes (``d_s, d_e, b, d_k, p``),
   ``n_batches``, ``repeats``, ``warmup_steps``, ``dtype``, ``scale_policy``,
   ``heldout_batches`` and device that covers the most distinct strategies and, among those, has
   the most runs. Configurations that still tie each count as a dataset of their own (the scale
   set's widths within one band, say), so that the band's smallest width does not decide for its
   largest. Every strategy is thus compared on the same problems and seeds.
3. **Eligible.** Growth strategies only (the baselines ``random``, ``zero``, ``gradmax`` and
   names that are not valid specs are excluded) that never failed on any run of the regime
   and that have a successful reference run for every seed of every dataset of it.
4. **The measure that decides: the held-out gain.** A run's held-out gain is its held-out
   loss decrease as a share of the held-out loss before the growth
   (``heldout_decrease / heldout_before``, measured on ``heldout_batches`` test batches the
   step never saw). Doing nothing (``zero``) has a gain of exactly 0. Per dataset, over seeds:
   a strategy **lowers the held-out loss** there when the lower end of the 95 % Student-t
   interval of its mean gain is above 0; the **best** is the eligible strategy with the highest
   mean gain; a strategy is **within** the tolerance of the best when the lower end of the 95 %
   t interval of its paired differences to the best (by seed) is at least
   ``−tolerance · |best|``. That is a non-inferiority test: a wide interval (few seeds, noisy
   data) makes a strategy *not* within, never within, and a strategy worse than the best by
   more than the tolerance on every seed is never within (:class:`Paired`).
5. **Qualifies:** lowers the held-out loss on every dataset of the regime, and is within the
   tolerance of the best on every dataset.
6. **Speed, within noise.** Time is ``t_total`` (the growth, statistics included): the
   median over seeds per dataset, then the median of these per-dataset medians. The fastest
   qualifying strategy is the *front-runner*; a qualifying strategy at most 5 % slower
   (:data:`TIME_TOLERANCE`) is *as fast*. Among those, the one with the smallest mean shortfall
   of its mean held-out gain from the best's is chosen (ties: the faster, then the spec). Runs whose
   time is unusable (NULL, infinite, not positive: :func:`clean_timings`) have none; a strategy
   without a time ranks after every timed one, and when no qualifying strategy has one, all count
   as as fast.
7. **When nothing qualifies.** If some strategies lower the held-out loss on every dataset,
   the one with the smallest worst shortfall from the best is chosen, flagged ``fallback``.
   If none does, growth with these statistics does not generalise in the regime: the entry
   says so in plain words (:attr:`Recommendation.statement`, with the statistics tokens
   measured), and names the strategy that ``strategies.make("default")`` then runs,
   recording that in ``fallback``: among the *harmless* strategies, the one steps 5–7 choose
   on the datasets where some strategy lowers it (the *growable* ones), so that a dataset
   where every gain is noise does not decide by its noise. Harmless is shown, not assumed:
   on every other dataset the lower end of the strategy's interval is at least ``−margin``,
   with ``margin`` the tolerance times the median over growable datasets of the best's gain
   (gains are shares of each dataset's held-out loss); a wide interval is never harmless. If
   no dataset is growable or no strategy is harmless, the one that harms least (the highest
   mean gain on its worst dataset) is named. Where the database also holds such a dataset at
   other statistics budgets (a tokens study), the statement names the fewest tokens at which a
   strategy lowers the held-out loss beyond noise on every seed, or the most tokens tried
   (:func:`harness.rule.wording.budgets_tried`); this decides nothing.

Batch optimality, path efficiency and the batch decrease are diagnostics of the step: they are
in the evidence to explain the choice, never part of it. The evidence (per-dataset means with
their intervals, per-seed counts, the diagnostics) and every runner-up, with the reason it lost,
come with each choice.
"""

from __future__ import annotations

from growbench.harness.rule.choice import (
    Recommendation,
    as_fast,
    primary_regime,
    recommend,
    recommend_regimes,
)
from growbench.harness.rule.console import evidence_frame, format_regimes, format_text, rank_note, what_to_use
from growbench.harness.rule.default_file import database_label, default_file, read_existing, write_default
from growbench.harness.rule.loading import (
    CONFIGURATION_COLUMNS,
    NoResults,
    clean_timings,
    first_error,
    is_growth,
    label,
    load_frame,
    preset_names,
    stored_spec,
    untimed,
)
from growbench.harness.rule.paired import Paired, SeedRuns, shortfall
from growbench.harness.rule.parameters import (
    CLOSEST,
    CONFIDENCE,
    DECIDING,
    DIAGNOSTICS,
    DOES_NOT_GENERALISE,
    GENERALISES,
    QUALITY_NAMES,
    TIME_TOLERANCE,
    TOLERANCE,
)
from growbench.harness.rule.reference import (
    CELL_COLUMNS,
    PROBLEM_SEPARATOR,
    cell_description,
    dataset_name,
    measures,
    reference_runs,
    regimes_with_runs,
    run_regimes,
)
from growbench.harness.rule.wording import RULE, rule_in_brief, rule_text
from growbench.harness.rule.wording import distinct_percents as _distinct_percents  # the name tests knew

__all__ = [
    "CELL_COLUMNS", "CLOSEST", "CONFIDENCE", "CONFIGURATION_COLUMNS", "DECIDING", "DIAGNOSTICS", "DOES_NOT_GENERALISE",
    "GENERALISES", "PROBLEM_SEPARATOR", "QUALITY_NAMES", "RULE", "TIME_TOLERANCE", "TOLERANCE", "NoResults", "Paired",
    "Recommendation", "SeedRuns", "_distinct_percents", "as_fast", "cell_description", "clean_timings",
    "database_label", "dataset_name", "default_file", "evidence_frame", "first_error", "format_regimes",
    "format_text", "is_growth", "label", "load_frame", "measures", "preset_names", "primary_regime", "rank_note",
    "read_existing", "recommend", "recommend_regimes", "reference_runs", "regimes_with_runs", "rule_in_brief",
    "rule_text", "run_regimes", "shortfall", "stored_spec", "untimed", "what_to_use", "write_default",
]
