"""What a sweep's run is expected to cost, relative to the others: the weights of the progress bar's estimate.

Only the bar's estimate of the time left depends on these numbers (nothing measured does):
they may be tuned freely.
"""

from __future__ import annotations

from growbench.datasets.registry import parse_dataset

#: Relative cost of a run per dataset at equal sizes (a synthetic dataset is about 1). Calibrated on the quick
#: sweep's run times in results/growbench.sqlite (finished_at - started_at), so that a unit of cost takes about
#: the same time on every dataset (about 0.26 s there; 0.75 s with two workers on a busy 2-core machine). The
#: real model's datasets rerun MiniLM's layers at every loss evaluation: at their sizes (d_e = 384, 8 windows of
#: 32 tokens, 2 statistics batches) a run costs 30-70 times a quick teacher run; the contrastive one also trains
#: 20 warm-up steps. A dataset not listed costs 1.
DATASET_COST = {
    "teacher": 1.0,
    "icl-regression": 1.0,
    "digits": 1.0,
    "text": 1.7,
    "minilm-recovery": 30.0,
    "minilm-similarity": 70.0,
}

#: The sizes of the reference run, which costs 1 on a dataset of cost 1: the quick sweep's teacher.
REFERENCE = dict(n_batches=4, b=64, d_s=32, d_e=32, repeats=3)


def _work(n_batches: int, b: int, d_s: int, d_e: int, repeats: int) -> float:
    # The statistics cost d_e² per token and the scores d_s per token and width; every timed repeat grows again.
    return n_batches * b * d_s * d_e * (d_e + d_s) * (1 + repeats)


def sweep_cost(config: dict) -> float:
    """The expected cost of a sweep run (a :class:`harness.measure.RunConfig` as a dict, or its row).

    It grows with the dataset's factor (:data:`DATASET_COST`), the statistics batches, the
    batch, the sequence length and the width; half of the reference run's cost is taken as
    a floor that does not shrink with the sizes (Python's and torch's overhead per call).

    Parameters
    ----------
    config : dict
        Has ``dataset``, ``n_batches``, ``b``, ``d_s``, ``d_e`` and ``repeats``.

    Returns
    -------
    float
        The cost relative to :data:`REFERENCE` on a dataset of cost 1; always positive.
    """
    name, _ = parse_dataset(str(config["dataset"]))
    sizes = {k: config[k] for k in REFERENCE}
    return DATASET_COST.get(name, 1.0) * (1 + _work(**sizes) / _work(**REFERENCE)) / 2
