"""A fresh run reproduces the committed reference (issue 28, item 2).

A small slice of the committed sweep (``reports/runs.csv``: seed 0 of every small-band dataset, three strategies
that step differently) is run again from an empty cache, and its quality columns are compared with the committed
ones: equal to ``RTOL`` relative (``ATOL`` absolute near zero). The committed runs were made with one torch thread
(``threads`` column); so is this one. The real model's runs are left out: they need the ``real`` extra and
minutes.

The committed runs reproduce on a CPU whose torch kernels are those they were made with
(:data:`COMMITTED_KERNELS`); on any CPU, the slice run twice from empty caches is the same bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from growbench import strategies
from growbench.harness.measure import RunConfig, run_one
from growbench.harness.runner.sweep import ABLATION_CENTRE

ROOT = Path(__file__).resolve().parent.parent
#: What a rerun must reproduce: the stated tolerance is well under the rule's (20 % of the best's held-out gain)
#: and under the 1e-4 aimed at for optimality.
QUALITY_COLUMNS = ["optimality", "first_order_decrease", "bottleneck", "loss_before", "loss_after", "heldout_before",
                   "heldout_after", "heldout_decrease", "lam", "path_efficiency"]
RTOL, ATOL = 1e-4, 1e-7
SLICE_STRATEGIES = [strategies.canonical(s) for s in (ABLATION_CENTRE, "joint", "zero")]
#: torch's CPU kernels (``torch.backends.cpu.get_cpu_capability()``) the committed runs were made with, before runs
#: recorded them (the ``cpu_capability`` column). AVX2 kernels sum float32 products in another order: on an AVX2
#: host (2026-11-28) the slice's teacher, text and icl-regression runs agreed to 1e-6, but digits, whose joint solve
#: is ill-conditioned, stepped elsewhere (λ 32 against 17), and the centre's step there, one float32 ulp of the loss
#: deep, has a path efficiency of rounding.
COMMITTED_KERNELS = "AVX512"


@pytest.fixture(scope="module")
def committed() -> pd.DataFrame:
    runs = pd.read_csv(ROOT / "reports" / "runs.csv")
    return runs[runs.status == "ok"]


def _run_slice(picked: pd.DataFrame, cache_dir: Path) -> list[dict]:
    """Each run of ``picked`` made afresh, one thread, with its trained models cached in ``cache_dir``."""
    names = [f.name for f in dataclasses.fields(RunConfig)]
    rows = []
    for _, row in picked.iterrows():
        config = {n: (row[n].item() if hasattr(row[n], "item") else row[n]) for n in names}
        fresh = run_one(config, cache_dir=str(cache_dir), threads=1)
        assert fresh["status"] == "ok", fresh["error"]
        rows.append(fresh)
    return rows


@pytest.fixture(scope="module")
def fresh_slice(committed, tmp_path_factory) -> list[dict]:
    return _run_slice(_slice(committed), tmp_path_factory.mktemp("cache"))


def _slice(runs: pd.DataFrame) -> pd.DataFrame:
    sel = runs[(runs.seed == 0) & (runs.n_batches == 4) & runs.strategy.isin(SLICE_STRATEGIES)
               & ~runs.dataset.str.startswith("minilm")]
    return sel.sort_values(["dataset", "strategy"])


def test_the_slice_covers_every_small_band_dataset(committed):
    picked = _slice(committed)
    assert set(picked.dataset) == {"teacher", "digits", "text", "icl-regression"}
    assert set(picked.strategy) == set(SLICE_STRATEGIES)
    assert (picked.threads == 1).all()


def _committed_kernels(picked: pd.DataFrame) -> str:
    """The CPU kernels the runs ``picked`` were made with: recorded by each, or :data:`COMMITTED_KERNELS` for runs made
    before the column was."""
    recorded = picked.cpu_capability.dropna().unique() if "cpu_capability" in picked else []
    assert len(recorded) <= 1, f"the slice's runs were made with several kernel sets: {sorted(recorded)}"
    return recorded[0] if len(recorded) else COMMITTED_KERNELS


def test_a_fresh_run_reproduces_the_committed_quality_columns(committed, fresh_slice):
    kernels, theirs = torch.backends.cpu.get_cpu_capability(), _committed_kernels(_slice(committed))
    if kernels != theirs:
        pytest.skip(f"the committed runs were made with torch's {theirs} CPU kernels, this CPU takes "
                    f"{kernels}, which round float32 sums otherwise")
    for (_, row), fresh in zip(_slice(committed).iterrows(), fresh_slice, strict=True):
        for column in QUALITY_COLUMNS:
            np.testing.assert_allclose(fresh[column], row[column], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{row.dataset} {row.strategy} {column}")


def test_a_fresh_run_records_the_kernels_it_was_made_with(fresh_slice):
    assert {fresh["cpu_capability"] for fresh in fresh_slice} == {torch.backends.cpu.get_cpu_capability()}


def test_the_slice_run_again_from_an_empty_cache_is_the_same_bit_for_bit(committed, fresh_slice, tmp_path):
    # Same seed, same results on this CPU: the models trained again, the growths and their measures.
    again = _run_slice(_slice(committed), tmp_path / "cache")
    for first, second in zip(fresh_slice, again, strict=True):
        for column in QUALITY_COLUMNS:
            assert np.array_equal(first[column], second[column], equal_nan=True), (first["dataset"], column)


def test_a_step_of_no_size_has_optimality_zero_in_the_reference(committed):
    zero = committed[committed.strategy == strategies.canonical("zero")]
    assert len(zero) > 0 and (zero.optimality == 0.0).all()


def test_quick_preset_decides_every_regime_it_measures_and_thorough_holds_it():
    """The main job's sweep keeps the real models' comparisons the medium band's default is chosen from (the
    encoder's head recovery, the decoder's on both of its tasks); the thorough preset is a superset of it, and holds
    the encoder's contrastive task, which left the main job."""
    from growbench.harness.runner.sweep import expand, sweep_presets

    presets = sweep_presets()
    quick = set(expand(presets["quick"]))
    thorough = set(expand(presets["thorough"]))
    assert quick < thorough
    real = {c for c in quick if c.d_e in (384, 576)}
    assert {c.dataset.split(":")[0] for c in real} == {"minilm-recovery", "smollm-recovery", "smollm-lm"}
    assert len({c.seed for c in real}) >= 3
    assert any(c.dataset.startswith("minilm-similarity") for c in thorough)
    decoder = {c.dataset.split(":", 1)[1] for c in real if c.dataset.startswith("smollm")}
    assert len(decoder) == 1  # one decoder head, on both tasks


def test_a_run_waits_for_the_worker_preparing_its_site(tmp_path):
    """Two workers on one site: the second waits for the first's training and projection instead of paying again,
    then measures the same numbers from the caches."""
    import fcntl
    import threading

    from growbench.harness.measure import site_lock_path

    config = RunConfig(strategy="zero", dataset="digits", d_s=4, d_e=8, b=8, d_k=2, p=2, n_batches=1, repeats=1,
                       warmup_steps=3)
    cache = tmp_path / "cache"
    cache.mkdir()
    rows = []
    with open(site_lock_path(config, str(cache)), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another worker is preparing this site
        worker = threading.Thread(target=lambda: rows.append(run_one(dataclasses.asdict(config), str(cache), 1)))
        worker.start()
        worker.join(timeout=2.0)
        assert worker.is_alive() and not rows  # it waits
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(timeout=120)
    assert rows and rows[0]["status"] == "ok"
    again = run_one(dataclasses.asdict(config), str(cache), 1)
    assert again["optimality"] == rows[0]["optimality"] and again["loss_before"] == rows[0]["loss_before"]


def test_run_order_keeps_every_run_and_puts_the_costliest_sites_first():
    from growbench.harness.runner.cost import sweep_cost
    from growbench.harness.runner.sweep import expand, in_run_order, sweep_presets

    configs = expand(sweep_presets()["quick"])
    costliest = max(sweep_cost(dataclasses.asdict(c)) for c in configs)
    for jobs in (1, 2, 3):
        ordered = in_run_order(configs, jobs)
        assert sorted(map(repr, ordered)) == sorted(map(repr, configs))
        assert sweep_cost(dataclasses.asdict(ordered[0])) == costliest
    # Two workers start two different sites: the first two runs never share one.
    first, second = in_run_order(configs, 2)[:2]
    assert first.seed != second.seed or first.dataset != second.dataset
