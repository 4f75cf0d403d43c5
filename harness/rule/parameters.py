"""The rule's fixed parameters: its tolerances, its confidence, the measure that decides and the verdicts' names.

One module of the recommendation (:mod:`harness.recommend` lists them all); every other part reads these values
from here, so that the rule, its wording and the report cannot disagree on them.
"""

from __future__ import annotations

#: How far below the best's mean held-out gain a strategy may be, as a share of it, and still be within
#: (rule step 4): a strategy within keeps at least 80 % of the best's gain, beyond noise.
TOLERANCE = 0.2
#: How much slower than the fastest qualifying strategy another may be and still count as as fast (rule step 6).
TIME_TOLERANCE = 0.05
#: Confidence of every interval of the rule.
CONFIDENCE = 0.95
#: The measure that decides (rule step 4).
DECIDING = "heldout_gain"
#: Diagnostics of the step, shown beside the decision (medians over seeds).
DIAGNOSTICS = ("optimality", "path_efficiency", "batch_gain")
QUALITY_NAMES = {"heldout_gain": "held-out gain", "optimality": "optimality", "path_efficiency": "path efficiency",
                 "batch_gain": "batch gain"}
#: Verdicts of a regime (:attr:`harness.rule.choice.Recommendation.verdict`).
GENERALISES, CLOSEST, DOES_NOT_GENERALISE = "generalises", "closest", "does not generalise"
