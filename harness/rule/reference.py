"""The runs that count: each dataset's reference configuration, the regime of every run, the rule's measures.

One module of the recommendation (:mod:`harness.recommend` lists them all): rule steps 1 and 2, and the per-run
measures of step 4.
"""

from __future__ import annotations

import pandas as pd

from growbench.harness.rule.loading import is_growth
from growbench.strategies.regimes import Regime, all_regimes

CELL_COLUMNS = ("d_s", "d_e", "b", "d_k", "p", "n_batches", "repeats", "warmup_steps", "dtype", "scale_policy",
                "heldout_batches", "device")
#: Between a dataset's name and the configuration that tells apart its tied reference configurations, in the
#: ``dataset`` column of :func:`reference_runs` ("teacher @ d_e=768").
PROBLEM_SEPARATOR = " @ "


def reference_runs(frame: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """The successful runs of each dataset's reference configurations (see :mod:`harness.recommend`).

    Where several configurations of a dataset tie, each counts as a dataset of its own: its rows' ``dataset`` reads
    ``"<dataset> @ <what differs>"`` (:data:`PROBLEM_SEPARATOR`; ``d_e=768`` when the widths differ).

    ``device``: restrict to one device; default the one with the most successful runs
    (``cpu`` on a tie).
    """
    ok = frame[frame.status == "ok"]
    if ok.empty:
        return ok
    if device is None:
        counts = ok.device.value_counts()
        top = counts[counts == counts.max()].index
        device = "cpu" if "cpu" in top else sorted(top)[0]
    ok = ok[ok.device == device]
    parts = []
    for _, runs in ok.groupby("dataset", sort=True):
        cells = runs.groupby(list(CELL_COLUMNS), dropna=False)
        stats = pd.DataFrame({"n_strategies": cells.strategy.nunique(), "n_runs": cells.size()}).reset_index()
        top = stats[(stats.n_strategies == stats.n_strategies.max()) & (stats.n_runs == stats.n_runs.max())]
        top = top.sort_values(["d_s", "d_e", "b", "d_k", "p"], kind="stable")
        # Configurations that tie are each a problem of their own (the scale set's widths of one band, say): one of
        # them alone would let the band's smallest width decide for its largest.
        named_by = ["d_e"] if top.d_e.nunique() > 1 else [c for c in CELL_COLUMNS if top[c].nunique(dropna=False) > 1]
        for _, cell in top.iterrows():
            sel = pd.Series(True, index=runs.index)
            for c in CELL_COLUMNS:
                sel &= (runs[c] == cell[c]) | (runs[c].isna() & pd.isna(cell[c]))
            part = runs[sel]
            if len(top) > 1:
                part = part.assign(dataset=f"{part.dataset.iloc[0]}{PROBLEM_SEPARATOR}"
                                           + ",".join(f"{c}={cell[c]}" for c in named_by))
            parts.append(part)
    return pd.concat(parts) if parts else ok.iloc[:0]


def dataset_name(problem: str) -> str:
    """The dataset of a problem of :func:`reference_runs` (``"teacher @ d_e=768"`` → ``"teacher"``)."""
    return str(problem).split(PROBLEM_SEPARATOR, 1)[0]


def cell_description(ref: pd.DataFrame) -> dict[str, str]:
    """``{dataset: "d_s=.. d_e=.. b=.. d_k=.. p=.. n_batches=.. device, N seeds"}`` of the reference runs."""
    out = {}
    for ds, runs in ref.groupby("dataset", sort=True):
        r = runs.iloc[0]
        out[ds] = (f"d_s={r.d_s} d_e={r.d_e} b={r.b} d_k={r.d_k} p={r.p} n_batches={r.n_batches} "
                   f"repeats={r.repeats} on {r.device}, seeds {sorted(runs.seed.unique().tolist())}")
    return out


def run_regimes(frame: pd.DataFrame) -> pd.Series:
    """The regime key (``device/band``) of every run, from its device and ``d_e``."""
    keys = {(dev, d): Regime.of(dev, int(d)).key for dev, d in set(zip(frame.device, frame.d_e, strict=True))}
    return pd.Series([keys[(dev, d)] for dev, d in zip(frame.device, frame.d_e, strict=True)], index=frame.index,
                     dtype=object)


def regimes_with_runs(frame: pd.DataFrame) -> list[Regime]:
    """The regimes with a successful growth run, cpu first, narrowest band first."""
    ok = frame[(frame.status == "ok") & frame.strategy.map(is_growth)]
    present = set(run_regimes(ok)) if len(ok) else set()
    return [r for r in all_regimes() if r.key in present]


def measures(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The rule's per-run measures from a runs table: the held-out gain and its standard error, the batch gain,
    ``x_floor``, and path efficiency as the rule reads it (capped at 1: above means the search beat the scan; NaN,
    where the path holds no decrease at all, counts as 1)."""
    return {"heldout_gain": runs.heldout_decrease / runs.heldout_before,
            "heldout_gain_se": runs.heldout_decrease_se / runs.heldout_before,
            "batch_gain": runs.loss_decrease / runs.loss_before,
            "x_floor": runs.t_total / runs.t_floor,
            "path_efficiency": runs.path_efficiency.clip(upper=1.0).fillna(1.0)}
