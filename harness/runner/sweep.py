"""The ablation sweep: strategies × datasets × sizes × seeds × devices, resumable.

Presets and grids, their expansion into configurations, and the sweep itself: each
configuration measured (:func:`harness.measure.run_one`) by :func:`harness.runner.pool.run_pending`,
which writes one committed row per finished run.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import Field, asdict, fields

import pandas as pd

from growbench import strategies
from growbench.datasets.registry import DATASETS, PRETRAINED_DATASETS
from growbench.harness.env import DEFAULT_THREADS
from growbench.harness.measure import HELDOUT_BATCHES, RunConfig, run_one, site_key
from growbench.harness.runner.cost import cost_class, sweep_cost
from growbench.harness.runner.pool import check_run_timeout, run_pending
from growbench.harness.store.results import ResultsDB
from growbench.harness.validate import ConfigError, check_jobs, check_runs, check_threads, dataset_class
from growbench.strategies.line_search import METHODS

DEFAULT_DB = "results/growbench.sqlite"
DEFAULT_CACHE = "results/cache"
SIZE_AXES = ("d_s", "d_e", "b", "d_k", "p")
LIST_AXES = ("strategies", "datasets", *SIZE_AXES, "seeds", "devices")
#: The synthetic datasets, which the size grids below fit; the pretrained ones have a fixed width
#: (d_e = 384) and would be refused at these sizes before any work.
DATASET_NAMES = tuple(name for name in DATASETS if name not in PRETRAINED_DATASETS)

#: The RunConfig field of each sweep axis (ConfigError names fields; the command line maps them to options).
_AXIS_FIELDS = {"strategies": "strategy", "datasets": "dataset", "seeds": "seed", "devices": "device"}

_PRESET_STRATEGIES = ["formula1", "formula2", "formula3", "formula4", "joint", "default", "random", "zero", "gradmax"]


#: The spec whose one-axis neighbourhood the quick, gpu and full ablations run. Fixed, not the current
#: default: were it the default, every new choice would change the preset, whose runs would then no longer
#: be the ones the choice came from, and a choice decided by timing noise would move the next sweep. It is the
#: step that judges itself by data it was not fitted to (docs/mathematics.md §5.4): a ridge chosen by split
#: halves, λ on the loss without its in-sample optimism.
ABLATION_CENTRE = "gram/ridge/full+metric/normal+shrink:bracket"


def _rsvd(spec: str) -> str:
    """``spec`` with the randomised truncation: what the real model's width calls for."""
    return str(strategies.Spec.parse(spec).replace(truncation="rsvd"))


def one_axis_variants(spec: str) -> list[str]:
    """``spec`` with each axis changed to each other value in turn (the ablation neighbourhood)."""
    base = strategies.Spec.parse(spec)
    out = []
    for axis in ("averaging", "inverse", "truncation", "line_search"):
        out += [str(base.replace(**{axis: name})) for name in strategies.REGISTRY[axis] if name != getattr(base, axis)]
    flags = ("metric", *strategies.Spec.LINE_SEARCH_FLAGS)
    out += [str(base.replace(**{flag: not getattr(base, flag)})) for flag in flags]
    out += [str(base.replace(method=m)) for m in METHODS if m != base.method]
    return out


# Sizes per dataset where its warm-up reaches a useful point (icl-regression needs
# N = d_s - 1 well above d_x = d_e - 1, and is rank-starved at d_k = 4 < d_x = 7).
QUICK_SIZES = {
    "teacher": dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
    "icl-regression": dict(d_s=[32], d_e=[8], b=[64], d_k=[4], p=[2]),
    "digits": dict(d_s=[16], d_e=[32], b=[64], d_k=[4], p=[4]),
    "text": dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
}


#: The scale set: d_e -> (b, d_s, d_k, p), the sizes where downstream code grows attention.
SCALE_SET = {64: (256, 128, 8, 8), 256: (64, 256, 16, 16), 768: (32, 512, 32, 32), 1024: (16, 1024, 32, 32),
             4096: (8, 2048, 64, 64)}
#: Largest width of the scale set measured on CPU (4096 needs a GPU to finish in minutes).
CPU_MAX_SCALE = 1024
#: The scale set's one candidate whose every trial takes a full SVD of a ``(d_e, d_e)`` matrix (see
#: :func:`scale_candidates`).
FULL_SVD_NEWTON = "gram/solve/full+metric/normal:newton"
SCALE_CANDIDATES = ["default", "gram/ridge/rsvd+metric/normal+shrink:bracket", "gram/ridge/rsvd+metric/normal:bracket",
                    "gram/solve/rsvd+metric/normal:bracket", "gram/solve/full+metric/fast:quadratic",
                    "gram/solve/rsvd+metric/fast:quadratic", FULL_SVD_NEWTON]

#: Added to the quick, gpu and full ablations beside the centre's one-axis neighbourhood: the earlier defaults (the
#: truncated path's bracket with a plain solve, and the fast path's quadratic), λ on a held-out batch with the
#: plain solve and the ridge, and the ridge's λ damped by a fixed factor, so that each judging component is also
#: seen without the others.
ABLATION_EXTRAS = ["gram/solve/full+metric/normal:bracket", "gram/solve/full+metric/fast:quadratic",
                   "gram/solve/full+metric/normal+holdout:bracket", "gram/ridge/full+metric/normal+holdout:bracket",
                   "gram/solve/full+metric/normal+shrink:bracket", "gram/ridge/full+metric/normal+damp:bracket"]


def scale_dataset(d_e: int) -> str:
    """The scale set's data set at width ``d_e``: the teacher, drawing its inputs on the run's device above
    :data:`CPU_MAX_SCALE` (``device_draw``: a site at d_e = 4096 otherwise spends minutes in the CPU's generator
    before its first growth; no CPU run is planned there, so no CPU run loses its twin)."""
    return "teacher:device_draw=true" if d_e > CPU_MAX_SCALE else "teacher"


def scale_candidates(d_e: int) -> list[str]:
    """The scale set's candidates at width ``d_e``: above :data:`CPU_MAX_SCALE` without the full SVD's Newton
    search, whose trials each take a full SVD of a ``(d_e, d_e)`` matrix (11× its floor at d_e = 1024 on the
    CPU, 2.5 s a growth on an H100): at 4096 one growth would take minutes of a 15-minute lease."""
    if d_e <= CPU_MAX_SCALE:
        return list(SCALE_CANDIDATES)
    return [c for c in SCALE_CANDIDATES if c != FULL_SVD_NEWTON]


def scale_grids(devices: list[str], widths: list[int] | None = None, seeds: list[int] | None = None,
                **kw) -> list[dict]:
    """One grid per width of the scale set (teacher, a barely trained student), for ``devices``."""
    widths = list(SCALE_SET) if widths is None else widths
    return [dict(strategies=scale_candidates(d), datasets=[scale_dataset(d)], d_s=[SCALE_SET[d][1]], d_e=[d],
                 b=[SCALE_SET[d][0]], d_k=[SCALE_SET[d][2]], p=[SCALE_SET[d][3]], seeds=seeds or [0], devices=devices,
                 n_batches=1, warmup_steps=20, **kw) for d in widths]


#: Candidates on the real pretrained model: the scale set's, and the formulas and joint as references.
PRETRAINED_STRATEGIES = [*SCALE_CANDIDATES, "formula1", "formula2", "joint"]
#: The quick sweep's candidates for the default at d_e = 384 (cpu, 128 < d_e ≤ 1024): the ablation's centre, the
#: centre without its shrinkage (what the shrinkage buys), the same with λ on the held-out batch and the direction
#: refitted (the other way to judge λ), and the earlier default (the plain solve). Each run costs seconds there: the
#: main job's 20 minutes allow these four.
_QUICK_RIDGE = strategies.Spec.parse(_rsvd(ABLATION_CENTRE)).replace(shrink=False)
QUICK_PRETRAINED_STRATEGIES = [_rsvd(ABLATION_CENTRE), str(_QUICK_RIDGE), str(_QUICK_RIDGE.replace(holdout=True)),
                               "gram/solve/rsvd+metric/normal:bracket"]
#: The thorough sweep's candidates there: each judging component alone and together, and the earlier default.
THOROUGH_PRETRAINED_STRATEGIES = [*QUICK_PRETRAINED_STRATEGIES, "gram/ridge/rsvd+metric/normal+damp:bracket",
                                  "gram/solve/rsvd+metric/normal+shrink:bracket"]
#: References on the real model, one seed: the formulas the report compares with (thorough sweep).
PRETRAINED_REFERENCES = ["formula1", "formula2"]
#: Seeds of the small band's comparisons (a run costs milliseconds there). Eight seeds give the paired t interval
#: 7 degrees of freedom (t = 2.36 against 4.30 with three): the power estimate in the report says what they resolve.
RULE_SEEDS = list(range(8))
#: Seeds on the real model: three, all the main job's time allows (a run costs seconds).
PRETRAINED_SEEDS = [0, 1, 2]
#: Test batches of the held-out measure per dataset where the default (16) is not enough: in-context regression
#: scores one query per sequence, so its held-out loss needs 64 batches of 64 sequences to resolve a 1 % change.
HELDOUT_BATCHES_FOR = {"icl-regression": 64}
#: The decoder's held-out measure: 8 batches of 8 windows (2048 tokens; its standard error is reported with it).
DECODER_HELDOUT_BATCHES = 8
#: Heads of all-MiniLM-L6-v2 (layer, head) in the quick sweep: a late one, which reruns fewer layers per loss
#: call; the contrastive task uses the last head of the list.
QUICK_HEADS = [(4, 7)]
#: The thorough sweep adds an early head.
THOROUGH_HEADS = [(1, 3), (4, 7)]
#: Every layer, two heads each, for the full and gpu sweeps.
ALL_HEADS = [(layer, head) for layer in range(6) for head in (layer % 12, (layer + 6) % 12)]
#: Heads of SmolLM2-135M (layer, head) in the quick sweep, on both of its tasks: a late one (a loss call reruns four
#: of the 30 layers) whose replaced rotary pairs matter to the next-token loss (replacing them by nothing costs
#: +0.015 nats there, docs/results.md).
QUICK_DECODER_HEADS = [(26, 5)]
#: The thorough sweep adds an early and a middle layer (both tasks at every head).
THOROUGH_DECODER_HEADS = [(12, 0), (20, 4), (26, 5)]
#: Every fifth layer, two heads each (one per key/value group of the first two), for the full sweep.
ALL_DECODER_HEADS = [(layer, head) for layer in range(0, 30, 5) for head in (layer % 3, 3 + layer % 3)]


def pretrained_grids(heads: list[tuple[int, int]], devices: list[str], strategy_list: list[str],
                     seeds: list[int], similarity: bool = True, **kw) -> list[dict]:
    """Head recovery of all-MiniLM-L6-v2 at every ``(layer, head)`` and (with ``similarity``) its contrastive
    objective at the last one.

    Both at d_e = 384 (the model's width), 8 windows of 32 tokens per batch, rank 8 grown by 8.
    Recovery starts from the best rank-8 factors (no warm-up); the contrastive task trains
    the narrowed head for 20 steps first.
    """
    sizes = dict(d_s=[32], d_e=[384], b=[8], d_k=[8], p=[8], seeds=seeds, devices=devices, **{"n_batches": 2, **kw})
    recovery = [f"minilm-recovery:layer={layer}:head={head}" for layer, head in heads]
    grids = [dict(strategies=strategy_list, datasets=recovery, warmup_steps=0, **sizes)]
    if similarity:
        grids.append(dict(strategies=strategy_list, datasets=[f"minilm-similarity:layer={heads[-1][0]}:"
                                                              f"head={heads[-1][1]}"], warmup_steps=20, **sizes))
    return grids


def decoder_grids(heads: list[tuple[int, int]], devices: list[str], strategy_list: list[str], seeds: list[int],
                  **kw) -> list[dict]:
    """Head recovery and the next-token objective of SmolLM2-135M at every ``(layer, head)``.

    Both at d_e = 576 (the model's width), 8 windows of 32 tokens per batch, rank 4 grown by 4 (of the 16
    rotation-free dimensions that replace the head's 8 lowest-frequency rotary pairs), one timed growth (a loss
    call reruns 4 layers and the 49 152-word output: the decoder's runs are the sweep's costliest). Neither has a
    warm-up:
    the narrowed start (the best factors in the metric of the head's input) is already within 0.1 % of the
    pretrained model's next-token loss, so the warm-up would train nothing; growth then asks what the new
    dimensions can add on the objective.
    """
    sizes = dict(d_s=[32], d_e=[576], b=[8], d_k=[4], p=[4], seeds=seeds, devices=devices, warmup_steps=0,
                 **{"n_batches": 2, "heldout_batches": DECODER_HELDOUT_BATCHES, **kw})
    tasks = [f"{task}:layer={layer}:head={head}" for task in ("smollm-recovery", "smollm-lm") for layer, head in heads]
    return [dict(strategies=strategy_list, datasets=tasks, **sizes)]


#: What the statistics-tokens study grows with: the ablation's centre, with λ also on a held-out batch, and the
#: earlier default beside them (each shipped default is one of these: the study answers for it).
TOKENS_STRATEGIES = [ABLATION_CENTRE, str(strategies.Spec.parse(ABLATION_CENTRE).replace(holdout=True)),
                     "gram/solve/full+metric/normal:bracket"]


def statistics_tokens_grids(devices: list[str], n_batches: list[int], seeds: list[int],
                            pretrained_n_batches: list[int], pretrained_seeds: list[int], **kw) -> list[dict]:
    """Held-out gain against the number of statistics tokens (``n_batches · b · d_s``) on every quick dataset
    (docs/mathematics.md §7.2): the small band's at ``n_batches``, the real model's at ``pretrained_n_batches``."""
    small = [dict(strategies=TOKENS_STRATEGIES, datasets=[name], **sizes, seeds=seeds, devices=devices, n_batches=n,
                  repeats=1, warmup_steps=300, heldout_batches=HELDOUT_BATCHES_FOR.get(name, HELDOUT_BATCHES), **kw)
             for name, sizes in QUICK_SIZES.items() for n in n_batches]
    real = [g for n in pretrained_n_batches
            for g in pretrained_grids(QUICK_HEADS, devices, [_rsvd(ABLATION_CENTRE)], pretrained_seeds, repeats=1,
                                      n_batches=n, **kw)]
    return small + real


#: What the statistics-tokens study of the real models' own objectives grows with: the ablation's centre at the
#: real model's width, and the shipped choice of the medium band beside it.
OBJECTIVE_TOKENS_STRATEGIES = [_rsvd(ABLATION_CENTRE), str(_QUICK_RIDGE.replace(holdout=True))]
#: Statistics batches of that study: 256 tokens each, up to 16384 tokens (0.05 per entry of SmolLM2's P).
OBJECTIVE_TOKENS_BATCHES = [1, 4, 16, 64]


def objective_tokens_grids(devices: list[str], n_batches: list[int], seeds: list[int], **kw) -> list[dict]:
    """Held-out gain against statistics tokens on each real model's own objective: all-MiniLM-L6-v2's contrastive
    loss and SmolLM2's next-token loss, at the quick sweep's heads (how many tokens does growth need there?)."""
    return [g for n in n_batches for g in (
        pretrained_grids(QUICK_HEADS, devices, OBJECTIVE_TOKENS_STRATEGIES, seeds, repeats=1, n_batches=n, **kw)[1:]
        + [{**grid, "datasets": [d for d in grid["datasets"] if d.startswith("smollm-lm")]}
           for grid in decoder_grids(QUICK_DECODER_HEADS, devices, OBJECTIVE_TOKENS_STRATEGIES, seeds, repeats=1,
                                     n_batches=n, **kw)])]


def sweep_presets() -> dict[str, list[dict]]:
    """Named sweeps: each a list of grids (dicts of lists) whose products are unioned."""
    # The centre itself is listed: "default" resolves to a strategy of this set whatever default.json says,
    # so the set of runs does not depend on it.
    ablation = list(dict.fromkeys(_PRESET_STRATEGIES + [ABLATION_CENTRE] + one_axis_variants(ABLATION_CENTRE)
                                  + ABLATION_EXTRAS))
    scaling = ["formula1", "formula2", "joint", ABLATION_CENTRE]

    def scaling_grids(base: dict, axes: dict, **kw) -> list[dict]:
        return [dict(strategies=scaling, datasets=["teacher"], **{**base, axis: values}, **kw)
                for axis, values in axes.items()]

    quick = [dict(strategies=ablation, datasets=[name], **sizes, seeds=RULE_SEEDS, devices=["cpu"], n_batches=4,
                  repeats=3, warmup_steps=300, heldout_batches=HELDOUT_BATCHES_FOR.get(name, HELDOUT_BATCHES))
             for name, sizes in QUICK_SIZES.items()]
    def small_scaling(top: list[int]) -> list[dict]:
        # Each axis at three values or more around the centre (d_e = d_s = 32, b = 64): what a slope needs.
        return scaling_grids(dict(d_s=[32], d_e=[32], b=[64], d_k=[4], p=[4]),
                             {"d_e": [16, 32, 64, *top], "d_s": [8, 32, 64, *top],
                              "b": [16, 64, 128, *(2 * t for t in top)]},
                             seeds=[0], devices=["cpu"], n_batches=2, repeats=3, warmup_steps=300)

    return {
        "smoke": [dict(strategies=_PRESET_STRATEGIES, datasets=list(DATASET_NAMES), d_s=[16], d_e=[16], b=[16],
                       d_k=[2], p=[2], seeds=[0], devices=["cpu"], n_batches=2, repeats=1, warmup_steps=30)],
        # The quick ablation on one GPU, plus the scale set up to d_e = 4096.
        "gpu": [*({**g, "devices": ["cuda"]} for g in quick), *scale_grids(["cuda"], seeds=[0, 1, 2], repeats=5),
                *pretrained_grids(ALL_HEADS, ["cuda"], PRETRAINED_STRATEGIES, [0], repeats=5),
                *decoder_grids(THOROUGH_DECODER_HEADS, ["cuda"], PRETRAINED_STRATEGIES, [0], repeats=5),
                *statistics_tokens_grids(["cuda"], [1, 16, 64], RULE_SEEDS, [1, 8, 32], PRETRAINED_SEEDS)],
        # The scale set alone on one GPU, three seeds: the evidence of cuda's medium and large bands, costliest first.
        "gpu-scale": scale_grids(["cuda"], seeds=[0, 1, 2], repeats=5),
        # Fits the main job's 20 minutes on a busy 2-core machine (docs/results.md): the statistics-tokens study at
        # one and two batches on four seeds (the ablation has four batches), the scaling up to 64.
        "quick": [
            *quick,
            *small_scaling([]),
            *pretrained_grids(QUICK_HEADS, ["cpu"], QUICK_PRETRAINED_STRATEGIES, PRETRAINED_SEEDS, similarity=False,
                              repeats=3),
            *decoder_grids(QUICK_DECODER_HEADS, ["cpu"], QUICK_PRETRAINED_STRATEGIES, PRETRAINED_SEEDS, repeats=1),
            *statistics_tokens_grids(["cpu"], [1, 2], RULE_SEEDS[:4], [], []),
        ],
        # The quick sweep widened: an early head of the real model, each judging component alone there, the
        # formulas as references, the statistics-tokens study at 16 batches and on the real model, the scaling to
        # 128 (about 30 minutes on 2 cores).
        "thorough": [
            *quick,
            *small_scaling([128]),
            *pretrained_grids(THOROUGH_HEADS, ["cpu"], THOROUGH_PRETRAINED_STRATEGIES, PRETRAINED_SEEDS, repeats=3),
            *pretrained_grids(THOROUGH_HEADS, ["cpu"], PRETRAINED_REFERENCES, [0], repeats=3),
            *decoder_grids(THOROUGH_DECODER_HEADS, ["cpu"], THOROUGH_PRETRAINED_STRATEGIES, PRETRAINED_SEEDS,
                           repeats=1),
            *decoder_grids(THOROUGH_DECODER_HEADS, ["cpu"], PRETRAINED_REFERENCES, [0], repeats=1),
            *statistics_tokens_grids(["cpu"], [1, 2, 16], RULE_SEEDS, [1, 4], [0, 1]),
            *objective_tokens_grids(["cpu"], OBJECTIVE_TOKENS_BATCHES, PRETRAINED_SEEDS),
        ],
        # How many statistics tokens the real models' own objectives need (about an hour on 2 cores).
        "objective-tokens": objective_tokens_grids(["cpu"], OBJECTIVE_TOKENS_BATCHES, PRETRAINED_SEEDS),
        "full": [
            dict(strategies=strategies.specs(), datasets=list(DATASET_NAMES), d_s=[64], d_e=[64], b=[256], d_k=[8],
                 p=[8], seeds=RULE_SEEDS, devices=["cpu", "cuda"], n_batches=4, repeats=5, warmup_steps=1000),
            *scaling_grids(dict(d_s=[128], d_e=[64], b=[256], d_k=[8], p=[8]),
                           {"d_e": [32, 128, 256, 512], "d_s": [32, 256, 512], "b": [64, 512, 1024]},
                           seeds=[0, 1, 2], devices=["cpu", "cuda"], n_batches=4, repeats=5, warmup_steps=1000),
            *pretrained_grids(ALL_HEADS, ["cpu", "cuda"], ablation, [0, 1, 2, 3, 4], repeats=5),
            *decoder_grids(ALL_DECODER_HEADS, ["cpu", "cuda"], ablation, [0, 1, 2, 3, 4], repeats=5),
            *statistics_tokens_grids(["cpu", "cuda"], [1, 16, 64], RULE_SEEDS, [1, 8, 32], [0, 1, 2, 3, 4]),
        ],
    }


def in_run_order(configs: list[RunConfig], jobs: int) -> list[RunConfig]:
    """``configs`` in the order a sweep runs them: one site of each dataset first, then the costliest sites first, and
    with ``jobs`` workers, the runs of ``jobs`` sites interleaved.

    A site (:func:`harness.measure.site_key`) is trained, captured and projected by its first run
    and read from the caches by the others. Two workers starting the same site at once would both pay for it
    (on the real model's contrastive task, 115 s of a first run against 25 s of a later one, 2 workers on a busy
    2-core machine); interleaving sites gives each its first run alone. The costliest sites go first, so that no
    worker is left alone on a long one at the end. Before them, the costliest site of each dataset: the progress
    bar learns each dataset's seconds per unit of cost from its runs (:mod:`harness.runner.progress`), and would
    otherwise guess the cheap datasets' from the costly ones' for most of the sweep.
    """
    sites: dict[tuple, list[RunConfig]] = {}
    for c in configs:
        sites.setdefault(tuple(site_key(c).values()), []).append(c)
    by_cost = sorted(sites.values(), key=lambda g: -sweep_cost(asdict(g[0])))
    first: dict[str, list[RunConfig]] = {}
    for g in by_cost:
        first.setdefault(cost_class(asdict(g[0])), g)
    sampled = {id(g) for g in first.values()}
    groups = [*first.values(), *(g for g in by_cost if id(g) not in sampled)]
    if jobs == 1:
        return [c for g in groups for c in g]
    out = []
    for i in range(0, len(groups), jobs):
        chunk = groups[i:i + jobs]
        out += [c for layer in itertools.zip_longest(*chunk) for c in layer if c is not None]
    return out


def runs_outside(frame: pd.DataFrame, configs: list[RunConfig]) -> pd.DataFrame:
    """The stored runs (of any code version) whose configuration is none of ``configs``."""
    names = [f.name for f in fields(RunConfig) if f.name in frame.columns]
    if frame.empty or not names:
        return frame
    mine = {tuple(str(getattr(c, n)) for n in names) for c in configs}
    theirs = [tuple(t) for t in frame[names].astype(str).itertuples(index=False, name=None)]
    return frame[[t not in mine for t in theirs]]


def presets_holding(runs: pd.DataFrame) -> list[str]:
    """The sweep presets (but ``full``, days long) with a configuration among ``runs``: whose runs they are."""
    out = []
    for name, grids in sweep_presets().items():
        if name != "full" and len(runs) > len(runs_outside(runs, expand(grids))):
            out.append(name)
    return out


def run_spec(name: str, device: str, d_e: int) -> str:
    """The canonical spec a run of ``name`` measures: ``default`` is the choice of the run's regime."""
    if isinstance(name, str) and name.strip().lower() == "default":
        return strategies.default_spec(device, d_e)
    return strategies.canonical(name)


def expand(grids: Iterable[dict]) -> list[RunConfig]:
    """Configurations of the union of the grids' products, without duplicates, in a stable order
    (:func:`iter_configs`'s, each kept where it first comes).

    Strategy names are canonicalised (presets become their specs, ``default`` the choice of
    each configuration's regime: :func:`run_spec`) and validated;
    unknown datasets are rejected with the valid list, and every configuration is
    checked on construction (:func:`harness.validate.check_run_config`).

    Raises
    ------
    harness.validate.ConfigError
        An unknown key, a missing or empty axis, an unknown strategy or dataset, or a
        configuration that cannot run; the field at fault is its ``field``.
    """
    return list(dict.fromkeys(iter_configs(grids)))


def iter_configs(grids: Iterable[dict]) -> Iterator[RunConfig]:
    """:func:`expand`'s configurations one at a time, a configuration again where two grids share it: for a
    caller that may stop early (the ``full`` preset holds some 260 000, seconds to build).

    Each grid is checked before its first configuration comes; raises as :func:`expand` does.
    """
    scalar_fields = {f.name for f in _scalar_fields()}
    for grid in grids:
        unknown = set(grid) - set(LIST_AXES) - scalar_fields
        if unknown:
            raise ValueError(f"unknown sweep keys {sorted(unknown)}; valid: {sorted(set(LIST_AXES) | scalar_fields)}")
        for axis in LIST_AXES:
            if not grid.get(axis):  # an empty axis would make an empty product: a sweep of nothing
                raise ConfigError(_AXIS_FIELDS.get(axis, axis), f"the sweep's {axis} list is empty or missing")
        for d in grid["datasets"]:
            dataset_class(d)
        for s in grid["strategies"]:
            try:
                strategies.canonical(s)
            except ValueError as e:
                raise ConfigError("strategy", str(e)) from None
        scalars = {k: grid[k] for k in scalar_fields if k in grid}
        for dataset, d_s, d_e, b, d_k, p, seed, device, name in _grid_points(grid):
            yield RunConfig(strategy=run_spec(name, device, d_e), dataset=dataset, d_s=d_s, d_e=d_e, b=b, d_k=d_k,
                            p=p, seed=seed, device=device, **scalars)


def count_configs(grids: Iterable[dict]) -> int:
    """``len(expand(grids))`` for grids :func:`expand` accepts, without building or checking a configuration: what
    ``growbench list`` shows (building the ``full`` preset's some 260 000 took seconds)."""
    spec = functools.cache(run_spec)
    scalar_fields = _scalar_fields()
    distinct = set()
    for grid in grids:
        # Every field's value, a default as well, so that two grids that differ only in spelling one out agree.
        scalars = tuple(grid.get(f.name, f.default) for f in scalar_fields)
        distinct.update((spec(name, device, d_e), dataset, d_s, d_e, b, d_k, p, seed, device, scalars)
                        for dataset, d_s, d_e, b, d_k, p, seed, device, name in _grid_points(grid))
    return len(distinct)


def _scalar_fields() -> list[Field]:
    """The fields of a configuration that a grid gives one value (or none: the default) rather than a list."""
    listed = {"strategy", "dataset", *SIZE_AXES, "seed", "device"}
    return [f for f in fields(RunConfig) if f.name not in listed]


def _grid_points(grid: dict) -> Iterator[tuple]:
    """The product of a grid's list axes: ``(dataset, d_s, d_e, b, d_k, p, seed, device, strategy name)``."""
    return itertools.product(grid["datasets"], grid["d_s"], grid["d_e"], grid["b"], grid["d_k"], grid["p"],
                             grid["seeds"], grid["devices"], grid["strategies"])


def run_sweep(
    configs: list[RunConfig],
    db_path: str = DEFAULT_DB,
    *,
    jobs: int = 1,
    backend: str = "joblib",
    scheduler: str | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    cache_dir: str | None = DEFAULT_CACHE,
    progress: bool = True,
    threads: int = DEFAULT_THREADS,
    max_memory: float | None = None,
    run_timeout: float | None = None,
) -> pd.DataFrame:
    """Run every configuration not already stored; return the rows of this sweep's configurations.

    Every configuration is checked first (:func:`harness.validate.check_runs`): nothing
    runs and nothing is written when one cannot run. Runs on a device that is not
    present are skipped with a message (:func:`harness.runner.pool.pending`), unless no run is left.

    Parameters
    ----------
    configs : list of RunConfig
    db_path : str
        SQLite file (created if missing).
    jobs : int
        Parallel workers for the joblib backend.
    backend : {"joblib", "dask"}
    scheduler : str, optional
        Address of an existing Dask scheduler (``tcp://host:8786``); default a local in-process cluster.
    resume : bool
        Skip configurations whose key (configuration + code version) is already stored.
    retry_failed : bool
        With ``resume``, run stored failures again.
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
    check_jobs(jobs)
    check_threads(threads)
    check_run_timeout(run_timeout, backend)
    check_runs(configs, jobs=jobs, max_memory=max_memory, strict_devices=False)
    with ResultsDB(db_path) as db:
        return run_pending(db, in_run_order(configs, jobs), functools.partial(run_one, cache_dir=cache_dir),
                           jobs=jobs, threads=threads,
                           resume=resume, retry_failed=retry_failed, progress=progress, backend=backend,
                           scheduler=scheduler, run_timeout=run_timeout, cost=sweep_cost, group=site_of)


def site_of(config: dict) -> str:
    """The site of a run given as a dict (:func:`harness.measure.site_key`): its configuration but its strategy and
    repeats, as JSON. Its first run trains the model and solves the projection the others read from the caches."""
    return json.dumps({k: v for k, v in config.items() if k not in ("strategy", "repeats")}, sort_keys=True)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per dataset × device × strategy: median time per phase (ms), quality, failures."""
    if frame.empty:
        return frame
    keys = ["dataset", "device", "strategy"]
    ok = frame[frame.status == "ok"].copy()
    ok["x_floor"] = ok.t_total / ok.t_floor
    cols = ["t_statistics", "t_direction", "t_truncation", "t_line_search", "t_total", "t_floor"]
    g = ok.groupby(keys, sort=True)
    out = (g[cols].median() * 1e3).rename(columns=lambda c: c[2:] + "_ms")
    for col in ("x_floor", "optimality", "heldout_decrease", "n_loss_evals"):
        out[col] = g[col].median()
    out["runs"] = g.size()
    # Strategies whose runs all failed still get a line.
    every = frame.groupby(keys, sort=True).size().index
    out = out.reindex(every)
    out["runs"] = out["runs"].fillna(0).astype(int)
    out["failed"] = frame[frame.status != "ok"].groupby(keys).size().reindex(every).fillna(0).astype(int)
    return out.reset_index()
