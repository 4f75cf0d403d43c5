"""Training sweeps (``growbench train``): presets, resume, one failure recorded and the rest go on.

Each run is trained in a worker (in-process or a joblib process) by
:func:`harness.runner.pool.run_pending` and written by this process only, with its curve,
in one transaction (:mod:`harness.store.training`).
"""

from __future__ import annotations

import itertools

import pandas as pd

from growbench import strategies
from growbench.harness.env import DEFAULT_THREADS, recorded
from growbench.harness.runner.cost import cost_class, train_cost
from growbench.harness.runner.pool import check_run_timeout, run_pending
from growbench.harness.store.training import TrainDB
from growbench.harness.train import FIXED_METHODS, TrainConfig, train_run
from growbench.harness.validate import check_threads, check_train_configs

#: The methods every training design compares: the default growth, each strategy baseline, and the two fixed sizes.
COMPARED_METHODS = ["default", *strategies.baseline_names(), *FIXED_METHODS]


#: Seeds of the quick training study and of the real model's. Target (b) compares final held-out losses seed by seed,
#: and the verdict's paired interval needs seeds to resolve anything: with 3 its t factor is 4.3, and on text the
#: methods' finals differ by less than their spread over seeds (docs/results.md). A MiniLM run costs about 50 s on one
#: thread against 5 s for text, hence fewer there.
QUICK_TRAIN_SEEDS = list(range(8))
REAL_TRAIN_SEEDS = list(range(5))


def _grid(methods: list[str], datasets: list[str], seeds: list[int], **kw) -> list[TrainConfig]:
    return [TrainConfig(method=m, dataset=d, seed=s, **kw) for d, s, m in itertools.product(datasets, seeds, methods)]


#: The real model's training designs: every head of MiniLM's layer 2 narrowed, then distilled to the original
#: model's output (recovery) or fine-tuned on its own contrastive objective (similarity).
REAL_DISTILL = "minilm-recovery:narrow=layer"
REAL_FINETUNE = "minilm-similarity:narrow=layer"
#: Sizes of the real-model design (d_e is the model's width; heads narrowed from 32 to 4, grown to 16).
REAL_SIZES = dict(d_s=32, d_e=384, b=8, d_k0=4, d_k_max=16, p=4, grow_every=30, steps=150, eval_every=15)
#: The same, every head grown to d_k_max in one growth after the first step: the schedule under which the
#: step's advantage survives training on the pretrained model (docs/results.md).
REAL_ONCE = {**REAL_SIZES, "p": REAL_SIZES["d_k_max"] - REAL_SIZES["d_k0"], "grow_every": 1}


#: The decoder's training design: every head of SmolLM2's layer 26 narrowed (its 8 lowest-frequency rotary pairs
#: replaced by the best rank-1 rotation-free factors in its input's metric), then trained on the model's own
#: next-token loss; growth adds 5 rotation-free dimensions per head every 20 steps up to the 16 that replace the pairs
#: exactly. fixed-large starts from the same narrowed heads widened at random (datasets' fixed_large_from_narrowed).
DECODER_LM = "smollm-lm:narrow=layer:layer=26"
DECODER_SIZES = dict(d_s=32, d_e=576, b=8, d_k0=1, d_k_max=16, p=5, grow_every=20, steps=100, eval_every=10)
#: Seeds of the decoder design: a run costs about three minutes on one thread.
DECODER_TRAIN_SEEDS = list(range(4))


def train_presets() -> dict[str, list[TrainConfig]]:
    """Named training sweeps.

    ``smoke`` (seconds): the six methods on teacher and text, tiny sizes, one seed.
    ``quick`` (minutes on 2 CPU cores): teacher (teacher ``d_k`` = 16) and text, student
    from ``d_k`` = 2 to 16 by 2 every 100 steps; the six methods, eight seeds.
    ``variants``: the quick sizes with the design's settings besides the method: the three
    scale policies, the two optimiser-state policies, the bottleneck trigger and a two-head
    block (each head grown, or the budget split), two seeds.
    ``real`` (about 13 minutes on two CPU cores; needs the ``real`` extra): the real
    pretrained model, every head of MiniLM's layer 2 narrowed to ``d_k`` = 4 and grown by 4
    every 30 steps to 16 while distilling to the original model's output; the six methods,
    five seeds. It is not in ``quick``: it would add many minutes and the 90 MB weights.
    ``real-once``: the ``real`` design with every head grown from 4 to 16 in one growth after
    the first training step (about 13 minutes on two CPU cores).
    ``decoder``: the Llama-architecture SmolLM2-135M, every head of layer 26 narrowed and grown
    back during next-token training (:data:`DECODER_SIZES`); the six methods, four seeds (needs
    the decoder's weights, see :mod:`datasets.smollm`).
    ``full``: the quick design and its variants at ``d_e = 64``, longer, three seeds; and the
    real design, twice as long, distilled and fine-tuned, three seeds.
    """
    smoke = dict(d_s=16, d_e=16, b=32, d_k0=2, d_k_max=8, p=2, grow_every=40, steps=200, eval_every=20)
    quick = dict(d_s=32, d_e=32, b=64, d_k0=2, d_k_max=16, p=2, grow_every=100, steps=1200, eval_every=50)
    full = dict(d_s=64, d_e=64, b=128, d_k0=2, d_k_max=16, p=2, grow_every=200, steps=3000, eval_every=100)
    real_full = {**REAL_SIZES, "grow_every": 60, "steps": 300, "eval_every": 30}

    data = ["teacher", "text"]

    def variants(sizes: dict, seeds: list[int]) -> list[TrainConfig]:
        h2 = {**sizes, "d_k_max": sizes["d_k_max"] // 2, "n_heads": 2}
        return [
            *_grid(["default"], data, seeds, **sizes, scale_policy="fixed"),
            *_grid(["default"], data, seeds, **sizes, scale_policy="learnable"),
            *_grid(["fixed-large"], data, seeds, **sizes, scale_policy="fixed"),
            *_grid(["fixed-large"], data, seeds, **sizes, scale_policy="learnable"),
            *_grid(["default"], data, seeds, **sizes, opt_state="reset"),
            *_grid(["default"], data, seeds, **{**sizes, "grow_every": sizes["grow_every"] // 2},
                   trigger="bottleneck"),
            *_grid(["default", "fixed-large", "fixed-small"], data, seeds, **h2),
            *_grid(["default"], data, seeds, **{**h2, "p": 2 * sizes["p"]}, head_split="budget"),
        ]

    return {"smoke": _grid(COMPARED_METHODS, data, [0], **smoke),
            "quick": _grid(COMPARED_METHODS, data, QUICK_TRAIN_SEEDS, **quick),
            "variants": variants(quick, [0, 1]),
            "real": _grid(COMPARED_METHODS, [REAL_DISTILL], REAL_TRAIN_SEEDS, **REAL_SIZES),
            "real-once": _grid(COMPARED_METHODS, [REAL_DISTILL], REAL_TRAIN_SEEDS, **REAL_ONCE),
            "decoder": _grid(COMPARED_METHODS, [DECODER_LM], DECODER_TRAIN_SEEDS, **DECODER_SIZES),
            "full": [*_grid(COMPARED_METHODS, data, [0, 1, 2], **full), *variants(full, [0, 1, 2]),
                     *_grid(COMPARED_METHODS, [REAL_DISTILL, REAL_FINETUNE], [0, 1, 2], **real_full)]}


def run_train_one(config: dict, threads: int | None = None) -> dict:
    """One training run in a worker; never raises: a failure becomes a ``failed`` row."""
    cfg = TrainConfig(**config)
    return recorded(cfg, lambda: train_run(cfg), threads)


def run_train_sweep(configs: list[TrainConfig], db_path: str, *, jobs: int = 1, resume: bool = True,
                    retry_failed: bool = False, progress: bool = True, threads: int = DEFAULT_THREADS,
                    max_memory: float | None = None, run_timeout: float | None = None) -> pd.DataFrame:
    """Run every configuration not already stored (with ``resume``); return this sweep's run rows.

    Every configuration is checked first (:func:`harness.validate.check_train_configs`):
    nothing runs and nothing is written when one cannot run.

    Parameters
    ----------
    configs : list of TrainConfig
    db_path : str
        SQLite file (created if missing).
    jobs : int
        Parallel workers (joblib processes).
    resume, retry_failed : bool
        Skip runs already stored; with ``retry_failed``, run stored failures again.
    progress : bool
        Show a progress bar.
    threads : int
        torch threads per run (in this process with ``jobs == 1``, in each worker otherwise).
    max_memory : float, optional
        Memory limit in GiB for one run (times ``jobs`` on CPU); default a share of the device's memory.
    run_timeout : float, optional
        Seconds a run may take before it is stopped and stored as failed; default no limit
        (:func:`harness.runner.pool.run_pending`).

    Raises
    ------
    harness.validate.ConfigError
        A configuration that cannot run, ``jobs < 1``, ``threads < 1`` or a bad ``run_timeout``.
    """
    check_threads(threads)
    check_run_timeout(run_timeout)
    check_train_configs(configs, jobs=jobs, max_memory=max_memory, strict_devices=False)
    with TrainDB(db_path) as db:
        return run_pending(db, in_train_order(configs), run_train_one, jobs=jobs, threads=threads, resume=resume,
                           retry_failed=retry_failed, progress=progress, what="training runs",
                           run_timeout=run_timeout, cost=train_cost)


def in_train_order(configs: list[TrainConfig]) -> list[TrainConfig]:
    """``configs`` in the order they are run: the datasets in turn, each dataset's costliest runs first.

    Training runs share nothing, so their order changes only the time: the costliest first leaves
    no worker alone on a long run at the end, and the datasets in turn let the progress bar learn
    each dataset's speed from its first runs (:mod:`harness.runner.progress`) rather than guess the
    second dataset's from the first's for half the sweep.
    """
    by_class: dict[str, list[TrainConfig]] = {}
    for c in sorted(configs, key=lambda c: -train_cost(c.as_dict())):  # stable: the preset's order among equals
        by_class.setdefault(cost_class(c.as_dict()), []).append(c)
    return [c for turn in itertools.zip_longest(*by_class.values()) for c in turn if c is not None]


def train_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per dataset and variant: final held-out loss, wall time, FLOPs, failures."""
    if runs.empty:
        return runs
    runs = runs.copy()
    runs["variant"] = variant_names(runs)
    ok = runs[runs.status == "ok"]
    g = ok.groupby(["dataset", "variant"], sort=True)
    out = g[["final_heldout", "best_heldout", "wall_s", "total_flops", "growth_flops"]].median()
    out["seeds"] = g.size()
    every = runs.groupby(["dataset", "variant"], sort=True).size().index
    out = out.reindex(every)
    out["failed"] = runs[runs.status != "ok"].groupby(["dataset", "variant"]).size().reindex(every).fillna(0)
    out["failed"] = out["failed"].astype(int)
    return out.reset_index()


def variant_names(runs: pd.DataFrame) -> pd.Series:
    """A readable name per run: the method plus every setting that differs from the quick design's."""
    defaults = {"n_heads": 1, "head_split": "each", "trigger": "schedule", "scale_policy": "rescale",
                "opt_state": "pad"}

    def name(r) -> str:
        parts = [r["method"]]
        if r.get("n_heads", 1) != 1:
            parts.append(f"h={int(r['n_heads'])}")
        for k in ("head_split", "trigger", "scale_policy", "opt_state"):
            if k in r and r[k] != defaults[k]:
                parts.append(str(r[k]))
        return " ".join(parts)

    return runs.apply(name, axis=1)
