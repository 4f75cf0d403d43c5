"""What a run is expected to cost, relative to the others: the prior of the progress bar's estimate.

Only the bar's estimate of the time left depends on these numbers (nothing measured does):
they may be tuned freely. They are a prior: the estimate rescales them, per dataset, by the
times of the runs that finish (:mod:`harness.runner.progress`), so they need only be right
within a factor of a few, and right between datasets until each has finished a run.
"""

from __future__ import annotations

from growbench.datasets.registry import parse_dataset

#: Relative cost of a run per dataset at equal sizes (a synthetic dataset is about 1). Calibrated on the committed
#: quick sweep's run times (reports/runs.csv, finished_at - started_at, summed per dataset), so that a unit of cost
#: takes about the same time on every dataset (0.27-0.34 s there, two workers on a 2-core machine). The real
#: model's datasets rerun MiniLM's layers at every loss evaluation: at their sizes (d_e = 384, 8 windows of 32
#: tokens, 2 statistics batches) a run costs 30-90 times a quick teacher run, of which the sizes account for 3; the
#: contrastive one also trains 20 warm-up steps. (Factors of 30 and 70 had made the bar show 80 % after 90 of 1076
#: runs.) A dataset not listed
#: costs 1; the progress bar corrects every factor by the runs that finish (:mod:`harness.runner.progress`).
DATASET_COST = {
    "teacher": 1.0,
    "icl-regression": 1.0,
    "digits": 1.0,
    "text": 1.7,
    "minilm-recovery": 11.0,
    "minilm-similarity": 30.0,
    # SmolLM2-135M's tasks: each batch's targets or prefix run the whole decoder, and every loss call reruns four of
    # its 30 layers at d_e = 576 (and the 49 152-word output for the next-token loss). Calibrated on a fresh clone's
    # quick sweep (2026-11-27, two workers on a quiet 2-core machine: 29-32 s a run, 0.2 s per unit on teacher).
    "smollm-recovery": 40.0,
    "smollm-lm": 44.0,
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


def cost_class(config: dict) -> str:
    """The group of runs whose costs the progress bar calibrates together: the dataset's registry name and the width.

    The width too: the prior's scaling with the sizes is rougher than its ratios at one size (a quick sweep
    grows teacher at d_e = 32 in milliseconds and, with the real models' sizes, at 576 in seconds).
    """
    try:
        name = parse_dataset(str(config["dataset"]))[0]
    except (KeyError, ValueError):  # not a sweep's or training's configuration: one group
        return "runs"
    return f"{name} d_e={config['d_e']}" if "d_e" in config else name


#: Relative cost of a training run per dataset at equal sizes. Calibrated on the committed training study
#: (reports/training_summary.csv, median wall_s): quick teacher 2.4 s, text 4.2 s; MiniLM's layer 2 at the real
#: design's sizes 20-50 s (every head grown, the whole model rerun per step).
TRAIN_DATASET_COST = {"teacher": 1.0, "text": 1.75, "minilm-recovery": 10.0, "minilm-similarity": 12.0,
                      # Not measured yet: the decoder design's note says about three minutes a run on one thread.
                      "smollm-lm": 40.0, "smollm-recovery": 40.0}
#: The quick training study's teacher run, which costs 1.
TRAIN_REFERENCE = dict(steps=1200, b=64, d_s=32, d_e=32)


def train_cost(config: dict) -> float:
    """The expected cost of a training run (a :class:`harness.train.TrainConfig` as a dict, or its row).

    Training steps times the batch's tokens times the width, times the dataset's factor
    (:data:`TRAIN_DATASET_COST`); relative to :data:`TRAIN_REFERENCE` on teacher, with a
    floor of a tenth of it for the overhead that does not shrink with the sizes.
    """
    name = parse_dataset(str(config["dataset"]))[0]

    def work(steps: int, b: int, d_s: int, d_e: int) -> float:
        return steps * b * d_s * d_e * (d_e + d_s)

    ratio = work(*(int(config[k]) for k in TRAIN_REFERENCE)) / work(**TRAIN_REFERENCE)
    return TRAIN_DATASET_COST.get(name, 1.0) * (0.1 + 0.9 * ratio)
