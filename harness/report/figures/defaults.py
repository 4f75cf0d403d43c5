"""Which strategy is "the default" in each panel of a figure: the choice of the panel's regime.

A figure shows datasets of several regimes (the small band's synthetic tasks, the real model in the medium band);
each regime has its own default, and a figure marks that one in each panel. The choice comes from this report's
recommendations when they cover the regime, else from what ``strategies.make("default")`` would run there
(``strategies/default.json``, or its nearest regime's choice).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from growbench import strategies
from growbench.harness.rule.choice import Recommendation
from growbench.strategies.regimes import Regime

#: How every figure names the marked strategy in its legend.
DEFAULT_LABEL = "the regime's default"


def regime_default(device: str, d_e: int, regimes: Mapping[str, Recommendation] | None = None) -> str:
    """The default of the regime of ``device`` and ``d_e``: the recommendation's choice there, else the shipped one."""
    regime = Regime.of(device, int(d_e))
    rec = (regimes or {}).get(regime.key)
    if rec is not None and rec.spec is not None:
        return rec.spec
    return strategies.default_choice(regime.device, int(d_e)).spec


def dataset_defaults(runs: pd.DataFrame, regimes: Mapping[str, Recommendation] | None = None) -> dict[str, str]:
    """``{dataset: its regime's default}`` for the datasets of ``runs`` (each dataset's first run decides its regime).

    Parameters
    ----------
    runs : pandas.DataFrame
        Runs with ``dataset``, ``device`` and ``d_e`` (reference runs: one configuration per dataset).
    regimes : mapping of str to Recommendation, optional
        This report's recommendations, ``{regime key: Recommendation}``.
    """
    if runs.empty:
        return {}
    first = runs.drop_duplicates("dataset")
    return {r.dataset: regime_default(r.device, r.d_e, regimes) for r in first.itertuples()}
