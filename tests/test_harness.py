"""The sweep harness end to end: database rows, resume after a kill, failures, Dask, determinism, CLI."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from helpers import kill_cli_after_rows

from growbench import strategies
from growbench.harness.cli import main as cli_main
from growbench.harness.env import code_version
from growbench.harness.measure import RunConfig
from growbench.harness.runner.sweep import count_configs, expand, run_sweep, summary, sweep_presets
from growbench.harness.store.results import ResultsDB
from growbench.harness.store.schema import CONFIG_COLUMNS

QUALITY = ["optimality", "first_order_decrease", "loss_before", "loss_after", "heldout_before", "heldout_after",
           "bottleneck", "lam", "n_loss_evals"]


def tiny_grid(**over) -> dict:
    grid = dict(strategies=["formula2", "default"], datasets=["teacher"], d_s=[8], d_e=[8], b=[8], d_k=[2], p=[2],
                seeds=[0], devices=["cpu"], n_batches=2, repeats=1, warmup_steps=5)
    grid.update(over)
    return grid


def test_sweep_end_to_end_writes_complete_rows(tmp_path):
    configs = expand([tiny_grid(datasets=["teacher", "text"])])
    frame = run_sweep(configs, str(tmp_path / "r.sqlite"), cache_dir=str(tmp_path / "c"), progress=False)
    assert len(frame) == 4 and set(frame.status) == {"ok"}
    for col in QUALITY + ["t_statistics", "t_direction", "t_line_search", "t_truncation", "t_total", "t_floor"]:
        assert frame[col].notna().all(), col
    assert ((frame.optimality >= -1 - 1e-9) & (frame.optimality <= 1 + 1e-9)).all()
    assert ((frame.bottleneck >= 0) & (frame.bottleneck <= 1 + 1e-9)).all()
    # Phases are parts of the total, and the heldout columns are consistent.
    assert (frame.t_total >= frame.t_line_search).all()
    assert (frame.heldout_decrease - (frame.heldout_before - frame.heldout_after)).abs().max() < 1e-12
    # The environment is recorded.
    for col in ("torch_version", "device_name", "threads", "git_commit", "code_version", "started_at"):
        assert frame[col].notna().all()
    assert (frame.code_version == code_version()).all()
    s = summary(frame)
    assert set(s.strategy) == set(frame.strategy) and (s.failed == 0).all()


def fail_seed(monkeypatch, seed: int) -> None:
    """Make every run of ``seed`` fail inside its worker, as a genuine failure of a run would.

    Invalid input no longer makes a failed row (it is refused before any work), so a
    failure is injected into the measurement of in-process workers.
    """
    from growbench.harness import measure as measure_module

    real = measure_module.measure

    def measure(cfg, cache_dir):
        if cfg.seed == seed:
            raise RuntimeError(f"injected failure of seed {seed}")
        return real(cfg, cache_dir)

    monkeypatch.setattr(measure_module, "measure", measure)


def test_failing_configuration_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    fail_seed(monkeypatch, 1)
    configs = expand([tiny_grid(seeds=[0, 1])])
    frame = run_sweep(configs, str(tmp_path / "r.sqlite"), cache_dir=str(tmp_path / "c"), progress=False)
    assert len(frame) == 4
    failed = frame[frame.status == "failed"]
    assert len(failed) == 2 and (failed.seed == 1).all()
    assert failed.error.str.contains("injected failure of seed 1").all()
    assert (frame[frame.status == "ok"].seed == 0).all()
    s = summary(frame)
    assert s.failed.sum() == 2


def test_same_seed_same_quality_columns(tmp_path):
    configs = expand([tiny_grid(strategies=["default", "joint", "gram/solve/rsvd+metric/normal:bounded"])])
    a = run_sweep(configs, str(tmp_path / "a.sqlite"), cache_dir=str(tmp_path / "ca"), progress=False)
    b = run_sweep(configs, str(tmp_path / "b.sqlite"), cache_dir=str(tmp_path / "cb"), progress=False)
    a, b = a.sort_values("key").reset_index(drop=True), b.sort_values("key").reset_index(drop=True)
    pd.testing.assert_frame_equal(a[["key", *QUALITY]], b[["key", *QUALITY]])


def test_resume_skips_stored_runs(tmp_path):
    db = str(tmp_path / "r.sqlite")
    first = expand([tiny_grid()])
    run_sweep(first, db, cache_dir=str(tmp_path / "c"), progress=False)
    with ResultsDB(db) as d:
        stamps = dict(d.frame()[["key", "finished_at"]].values)
    more = expand([tiny_grid(seeds=[0, 1])])
    frame = run_sweep(more, db, resume=True, cache_dir=str(tmp_path / "c"), progress=False)
    assert len(frame) == 4
    with ResultsDB(db) as d:
        after = d.frame()
    # The first runs were not redone (same finish stamps), the new ones were added.
    assert all(after.set_index("key").finished_at[k] == v for k, v in stamps.items())
    assert len(after) == 4


def test_resume_after_killed_sweep_has_every_run_exactly_once(tmp_path):
    db, cache = tmp_path / "r.sqlite", tmp_path / "c"
    args = ["run", "--strategies", "formula2,default", "--datasets", "teacher", "--d-s", "8", "--d-e", "8",
            "--b", "8", "--d-k", "2", "--p", "2", "--seeds", "0,1,2,3,4,5,6,7", "--repeats", "40",
            "--n-batches", "2", "--warmup-steps", "5", "--db", str(db), "--cache-dir", str(cache), "--no-progress"]
    n_at_kill = kill_cli_after_rows(args, db, "runs", 2)
    assert 2 <= n_at_kill < 16, "the sweep must be killed mid-way for this test to mean anything"
    with ResultsDB(db) as d:
        survived = d.frame()
    assert set(survived.status) == {"ok"} and len(survived) >= n_at_kill
    configs = expand([dict(strategies=["formula2", "default"], datasets=["teacher"], d_s=[8], d_e=[8], b=[8],
                           d_k=[2], p=[2], seeds=list(range(8)), devices=["cpu"], n_batches=2, repeats=40,
                           warmup_steps=5)])
    frame = run_sweep(configs, str(db), resume=True, cache_dir=str(cache), progress=False)
    assert len(frame) == 16 and set(frame.status) == {"ok"}
    per_config = frame.groupby(list(CONFIG_COLUMNS)).size()
    assert len(per_config) == 16 and (per_config == 1).all()
    assert set(frame.key) == {c.key(code_version()) for c in configs}


def test_joblib_parallel_matches_serial_quality(tmp_path):
    configs = expand([tiny_grid(seeds=[0, 1])])
    serial = run_sweep(configs, str(tmp_path / "s.sqlite"), cache_dir=str(tmp_path / "c"), progress=False)
    par = run_sweep(configs, str(tmp_path / "p.sqlite"), jobs=2, cache_dir=str(tmp_path / "c"), progress=False)
    serial, par = (f.sort_values("key").reset_index(drop=True) for f in (serial, par))
    assert set(par.status) == {"ok"}
    for col in ("optimality", "loss_after", "lam"):
        assert (serial[col] - par[col]).abs().max() <= 1e-5 * max(1.0, serial[col].abs().max())


def test_dask_backend_on_a_local_cluster(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    fail_seed(monkeypatch, 1)  # the cluster's workers are threads of this process: the patch reaches them
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        configs = expand([tiny_grid(seeds=[0, 1])])
        frame = run_sweep(configs, str(tmp_path / "r.sqlite"), backend="dask", scheduler=lc.scheduler_address,
                          cache_dir=str(tmp_path / "c"), progress=False)
    assert len(frame) == 4
    assert (frame.status == "ok").sum() == 2 and (frame.status == "failed").sum() == 2


def test_expand_validates_names_and_deduplicates():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'.*teacher"):
        expand([tiny_grid(datasets=["mnist"])])
    with pytest.raises(ValueError, match="formula1"):
        expand([tiny_grid(strategies=["nope"])])
    configs = expand([tiny_grid(strategies=["formula4", "gram/solve/full/normal:grid"])])
    assert len(configs) == 1  # a preset and its spec are the same run


def test_preset_sizes_are_valid():
    """Every preset's configurations are valid, and ``growbench list`` counts them without building them
    (``count_configs``) as many as ``expand`` builds."""
    for name, grids in sweep_presets().items():
        configs = expand(grids)
        for c in configs:
            assert c.d_k + c.p <= c.d_e, (name, c)
        assert count_configs(grids) == len(configs), name


def test_configs_are_counted_as_expand_builds_them_where_grids_overlap():
    """Two grids that share configurations, one spelling out a default (n_batches = 4), strategies named twice (a
    preset and its spec, ``default`` and the spec it runs): ``count_configs`` counts each configuration once, as
    ``expand`` keeps it, and a scalar that differs makes another configuration."""
    base = {"datasets": ["teacher", "digits"], "d_s": [8], "d_e": [8, 16], "b": [8], "d_k": [2], "p": [2],
            "seeds": [0, 1], "devices": ["cpu"]}
    grids = [base | {"strategies": ["formula2", strategies.canonical("formula2"), "default", "zero"]},
             base | {"strategies": ["default", strategies.default_spec("cpu", 8), "random"], "n_batches": 4},
             base | {"strategies": ["zero"], "n_batches": 2, "d_e": [16]}]
    n = len(expand(grids))
    assert n == 2 * 2 * 2 * 4 + 2 * 2  # formula2, default, zero and random at each point; zero at n_batches 2
    assert count_configs(grids) == n


def test_cli_list_json_and_unknown_names(tmp_path, capsys):
    assert cli_main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"presets", "strategies", "datasets", "sweep_presets"} <= set(data)
    assert set(data["datasets"]) == {"teacher", "icl-regression", "digits", "text", "minilm-recovery",
                                     "minilm-similarity", "smollm-recovery", "smollm-lm"}
    assert set(data["sweep_presets"]) == {"smoke", "quick", "thorough", "objective-tokens", "gpu", "gpu-scale", "full"}
    for bad, valid in ((["--preset", "huge"], "smoke"), (["--datasets", "mnist"], "teacher"),
                       (["--strategies", "fomula1"], "formula1")):
        assert cli_main(["run", *bad, "--db", str(tmp_path / "x.sqlite"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert valid in err, err


def test_cli_run_and_export(tmp_path, capsys):
    db = str(tmp_path / "r.sqlite")
    args = ["run", "--strategies", "default", "--datasets", "digits", "--d-s", "4", "--d-e", "8", "--b", "8",
            "--d-k", "2", "--p", "2", "--repeats", "1", "--n-batches", "1", "--warmup-steps", "3", "--db", db,
            "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    assert cli_main(args) == 0
    assert strategies.default_spec() in capsys.readouterr().out
    assert cli_main(["export", "--format", "csv", "--db", db, "--out", str(tmp_path / "r.csv")]) == 0
    csv = pd.read_csv(tmp_path / "r.csv")
    assert len(csv) == 1 and csv.status[0] == "ok" and math.isfinite(csv.optimality[0])
    assert cli_main(["export", "--format", "parquet", "--db", db, "--out", str(tmp_path / "r.parquet")]) == 0
    assert len(pd.read_parquet(tmp_path / "r.parquet")) == 1
    assert cli_main(["export", "--db", str(tmp_path / "missing.sqlite")]) == 2


def test_run_config_key_depends_on_config_and_code_version():
    a = RunConfig("default", "teacher", 8, 8, 8, 2, 2)
    assert a.key("v1") == RunConfig("default", "teacher", 8, 8, 8, 2, 2).key("v1")
    assert a.key("v1") != a.key("v2")
    assert a.key("v1") != RunConfig("default", "teacher", 8, 8, 8, 2, 2, seed=1).key("v1")


def test_gpu_preset_is_the_quick_ablation_plus_the_scale_set_on_cuda():
    from growbench.harness.runner.sweep import SCALE_SET, expand, sweep_presets

    presets = sweep_presets()
    gpu = expand(presets["gpu"])
    assert gpu and all(c.device == "cuda" for c in gpu)
    quick_cpu_ablation = {(c.strategy, c.dataset, c.d_e, c.seed) for c in expand(presets["quick"][:4])}
    assert quick_cpu_ablation <= {(c.strategy, c.dataset, c.d_e, c.seed) for c in gpu}
    # The scale set's runs: one batch of statistics on a barely trained student (the tokens study's one-batch runs
    # are fully trained).
    widths = {c.d_e: (c.b, c.d_s, c.d_k, c.p) for c in gpu
              if c.dataset.startswith("teacher") and c.n_batches == 1 and c.warmup_steps == 20}
    assert widths == SCALE_SET
    scale = {(c.strategy, c.dataset, c.d_e, c.seed) for c in gpu
             if c.dataset.startswith("teacher") and c.n_batches == 1 and c.warmup_steps == 20}
    assert scale == {(c.strategy, c.dataset, c.d_e, c.seed) for c in expand(presets["gpu-scale"])}


def test_the_scale_set_above_the_cpus_widths_draws_on_the_device_without_the_full_svds_newton():
    from growbench.harness.runner.sweep import (
        CPU_MAX_SCALE,
        SCALE_CANDIDATES,
        SCALE_SET,
        expand,
        scale_candidates,
        scale_dataset,
        sweep_presets,
    )

    newton = "gram/solve/full+metric/normal:newton"
    for d_e in SCALE_SET:
        wide = d_e > CPU_MAX_SCALE
        assert scale_dataset(d_e) == ("teacher:device_draw=true" if wide else "teacher")
        assert (newton in scale_candidates(d_e)) is not wide
        assert set(scale_candidates(d_e)) | {newton} == set(SCALE_CANDIDATES)
    runs = expand(sweep_presets()["gpu-scale"])
    assert {c.seed for c in runs} == {0, 1, 2} and {c.device for c in runs} == {"cuda"}
    assert {(c.d_e, c.dataset) for c in runs} == {(d, scale_dataset(d)) for d in SCALE_SET}
    assert not any(c.strategy == newton and c.d_e > CPU_MAX_SCALE for c in runs)


def test_targets_scale_rows_measure_the_sweeps_scale_set(monkeypatch):
    from growbench.harness import targets
    from growbench.harness.runner.sweep import SCALE_SET, scale_candidates, scale_dataset

    seen = []

    def fake_measure(cfg, cache_dir):
        seen.append(cfg)
        return {k: 1.0 for k in ("t_total", "t_floor", "path_efficiency", "optimality", "heldout_decrease",
                                 "heldout_decrease_at_scan_best", "n_loss_evals", "host_syncs", "peak_mem_bytes")} | {
            "fallback": None}

    monkeypatch.setattr(targets, "measure", fake_measure)
    rows = targets.scale_rows("cuda", 1, None)
    assert list(dict.fromkeys(c.d_e for c in seen)) == list(SCALE_SET)
    for d_e in SCALE_SET:
        at = [c for c in seen if c.d_e == d_e]
        assert {c.dataset for c in at} == {scale_dataset(d_e)}
        assert list(rows[rows.d_e == d_e].name) == scale_candidates(d_e)
