"""Grow the reference block once with every preset and tabulate quality and time: ``growbench example``.

A quick look at one problem (:func:`datasets.teacher.reference_problem`); the measurements
behind the report and the recommendation come from the sweep, ``growbench run``.
"""

from __future__ import annotations

import statistics as stats_mod

import pandas as pd
import torch

from growbench import strategies
from growbench.datasets.teacher import reference_problem
from growbench.harness.validate import check_example
from growbench.strategies import metrics


def run_example(
    b: int = 256,
    d_s: int = 128,
    d_e: int = 64,
    d_k: int = 8,
    p: int = 8,
    cond: float = 100.0,
    repeats: int = 5,
    seed: int = 0,
    device: str = "cpu",
    names: list[str] | None = None,
    max_memory: float | None = None,
) -> pd.DataFrame:
    """One growth per preset on the reference problem; a row per preset.

    Time is the median of ``repeats`` calls of ``grow`` after one warm-up call.

    Raises
    ------
    harness.validate.ConfigError
        Sizes, ``cond``, ``repeats``, device or estimated memory (limit ``max_memory``
        GiB) refused before the problem is built (:func:`harness.validate.check_example`).
    """
    check_example(b=b, d_s=d_s, d_e=d_e, d_k=d_k, p=p, cond=cond, repeats=repeats, device=device,
                  max_memory=max_memory)
    pb = reference_problem(b=b, d_s=d_s, d_e=d_e, d_k=d_k, cond=cond, seed=seed, device=device)
    new_scale = pb.block.new_scale(0, p)
    rows = []
    presets = strategies.presets()
    for name in names or list(presets):
        s = strategies.make(name)
        times = []
        for i in range(repeats + 1):
            r = s.grow(pb.W_Q, pb.W_K, pb.X, pb.G, p=p, loss_of_scores=pb.loss_of_scores,
                       scale=pb.scale, new_scale=new_scale, mask=pb.mask)
            if i:
                times.append(r.timings["total"])
        rows.append({
            "preset": name,
            "spec": s.spec,
            "optimality": metrics.optimality(pb.G, pb.X, r.dZ, pb.mask),
            "first_order_decrease": r.first_order_decrease,
            "loss_before": r.loss_before,
            "loss_after": r.loss_after,
            "lambda": r.lam,
            "loss_evals": r.n_loss_evals,
            "time_ms": 1e3 * stats_mod.median(times),
            "fallback": "; ".join(r.fallback),
        })
    df = pd.DataFrame(rows)
    df.attrs["bottleneck"] = metrics.bottleneck(pb.G, pb.X, pb.mask)
    df.attrs["problem"] = dict(b=b, d_s=d_s, d_e=d_e, d_k=d_k, p=p, cond=cond, seed=seed, device=device,
                               threads=torch.get_num_threads(), torch=torch.__version__)
    return df
