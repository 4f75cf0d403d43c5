"""Growth during training: optimiser surgery, function preservation, budget split, resume."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from helpers import kill_cli_after_rows

from growbench import strategies
from growbench.datasets.registry import make_dataset
from growbench.harness.capture import capture
from growbench.harness.env import code_version
from growbench.harness.optim_state import align_to_old, replace_parameter
from growbench.harness.runner.train_sweep import run_train_sweep, train_presets
from growbench.harness.store.training import TrainDB
from growbench.harness.train import (
    TrainConfig,
    factor_gradients,
    grow_heads,
    growth_batches,
    split_budget,
    starved,
    train_run,
)

TINY = dict(dataset="teacher", d_s=8, d_e=8, b=8, d_k0=2, d_k_max=6, p=2, grow_every=10, steps=40, eval_every=10)


def _model(n_heads: int = 1, scale_policy: str = "rescale", dataset: str = "teacher", d_k: int = 2, seed: int = 0):
    ds = make_dataset(dataset, 8, 8, seed)
    model = ds.build_model(d_k, n_heads=n_heads, scale_policy=scale_policy, dtype=torch.float64)
    return ds, model


def _train_some(model, ds, opt, steps: int = 5) -> None:
    for s in range(steps):
        x, y = ds.batch(8, "train", s)
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()


def _optimizer_consistent(model, opt) -> None:
    held = [p for g in opt.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in model.parameters()}
    assert len(held) == len(list(model.parameters()))
    for p in held:
        for name, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v) and v.dim() > 0:
                assert v.shape == p.shape, name


# ------------------------------------------------------------------ optimiser state
@pytest.mark.parametrize("policy", ["pad", "reset"])
def test_replace_parameter_moves_adam_state(policy):
    old = torch.nn.Parameter(torch.randn(5, 2, dtype=torch.float64))
    opt = torch.optim.Adam([old], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        (old**3).sum().backward()
        opt.step()
    state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[old].items()}
    new = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    replace_parameter(opt, old, new, policy, alpha=2.0)
    assert opt.param_groups[0]["params"][0] is new and old not in opt.state
    if policy == "reset":
        assert new not in opt.state
    else:
        st = opt.state[new]
        torch.testing.assert_close(st["exp_avg"][:, :2], state["exp_avg"] / 2.0)
        torch.testing.assert_close(st["exp_avg_sq"][:, :2], state["exp_avg_sq"] / 4.0)
        assert (st["exp_avg"][:, 2:] == 0).all() and (st["exp_avg_sq"][:, 2:] == 0).all()
        assert float(st["step"]) == float(state["step"])
    # Adam runs on the new parameter without complaint and moves it.
    before = new.detach().clone()
    opt.zero_grad()
    (new**2).sum().backward()
    opt.step()
    assert not torch.equal(before, new.detach())


def test_replace_parameter_errors():
    a = torch.nn.Parameter(torch.zeros(2, 1))
    opt = torch.optim.Adam([a])
    with pytest.raises(ValueError, match="does not hold"):
        replace_parameter(opt, torch.nn.Parameter(torch.zeros(2, 1)), a)
    with pytest.raises(ValueError, match="unknown optimiser-state policy 'keep'"):
        replace_parameter(opt, a, torch.nn.Parameter(torch.zeros(2, 2)), "keep")


def test_align_to_old_recovers_a_rotated_padding_and_keeps_the_product():
    gen = torch.Generator().manual_seed(0)
    W_Q, W_K = torch.randn(7, 3, generator=gen, dtype=torch.float64), torch.randn(7, 3, generator=gen,
                                                                                    dtype=torch.float64)
    alpha = 0.8
    pad = torch.zeros(7, 2, dtype=torch.float64)
    R, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    new_Q, new_K = torch.cat([alpha * W_Q, pad], 1) @ R, torch.cat([alpha * W_K, pad], 1) @ R
    A_Q, A_K = align_to_old(new_Q, new_K, W_Q, W_K, alpha)
    torch.testing.assert_close(A_Q @ A_K.mT, new_Q @ new_K.mT)
    torch.testing.assert_close(A_Q[:, :3], alpha * W_Q)
    torch.testing.assert_close(A_K[:, :3], alpha * W_K)


# ------------------------------------------------------------------ growth inside training
def test_factor_gradients_match_autograd():
    ds, model = _model(n_heads=2, scale_policy="learnable")
    caps, *_ = capture(model, ds, 8, growth_batches(0, 1), "cpu")
    x, y = ds.batch(8, "train", 10_000_000)  # the batch capture used
    model.zero_grad()
    model.loss(x, y).backward()
    for h in range(2):
        g_Q, g_K = factor_gradients(model, caps, h)
        torch.testing.assert_close(g_Q, model.block.heads[h].W_Q.grad)
        torch.testing.assert_close(g_K, model.block.heads[h].W_K.grad)


@pytest.mark.parametrize("scale_policy", ["rescale", "fixed", "learnable"])
@pytest.mark.parametrize("method", ["default", "zero"])
def test_grown_multihead_block_keeps_its_function_at_lambda_zero(scale_policy, method):
    ds, model = _model(n_heads=2, scale_policy=scale_policy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train_some(model, ds, opt)
    x_new, _ = ds.batch(8, "test", 3)
    with torch.no_grad():
        before = model(x_new)
    caps, *_ = capture(model, ds, 8, growth_batches(7, 2), "cpu")

    def flat(Y):  # a loss no step can decrease: the line search must settle on λ = 0
        return (Y * 0).sum() + 1.0

    events = grow_heads(model, strategies.make(method), opt, caps, flat, {0: 2, 1: 3}, "pad")
    assert [e["lam"] for e in events] == [0.0, 0.0]
    assert [model.block.d_k(h) for h in range(2)] == [4, 5]
    with torch.no_grad():
        torch.testing.assert_close(model(x_new), before)
    _optimizer_consistent(model, opt)


@pytest.mark.parametrize("policy", ["pad", "reset"])
def test_growth_inside_training_decreases_the_batch_loss_and_keeps_adam_consistent(policy):
    ds, model = _model(n_heads=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train_some(model, ds, opt, 20)
    caps, rest, _ = capture(model, ds, 8, growth_batches(20, 2), "cpu")
    events = grow_heads(model, strategies.make("default"), opt, caps, rest, {0: 2, 1: 2}, policy)
    assert all(e["loss_after"] <= e["loss_before"] for e in events)
    assert any(e["lam"] > 0 and e["loss_after"] < e["loss_before"] for e in events)
    _optimizer_consistent(model, opt)
    _train_some(model, ds, opt, 5)
    _optimizer_consistent(model, opt)
    x, y = ds.batch(8, "test", 0)
    with torch.no_grad():
        assert math.isfinite(float(model.loss(x, y)))


@pytest.mark.parametrize("kw", [
    dict(method="default"),
    dict(method="gradmax"),
    dict(method="random", opt_state="reset"),
    dict(method="default", scale_policy="learnable"),
    dict(method="default", n_heads=2, head_split="budget", p=3),
    dict(method="default", trigger="bottleneck", threshold=1.0),
    dict(method="fixed-large"),
])
def test_train_run_grows_to_d_k_max_with_finite_curves(kw):
    cfg = TrainConfig(**{**TINY, **kw})
    r = train_run(cfg)
    assert r["final_d_k"] == [cfg.d_k_max] * cfg.n_heads
    steps = [c["step"] for c in r["curve"]]
    assert steps == list(range(0, cfg.steps + 1, cfg.eval_every))
    assert all(math.isfinite(c["heldout_loss"]) for c in r["curve"])
    flops = [c["flops"] for c in r["curve"]]
    assert all(b > a for a, b in zip(flops, flops[1:], strict=False))
    assert r["total_flops"] == pytest.approx(r["train_flops"] + r["growth_flops"])
    if cfg.method == "fixed-large":
        assert r["n_growths"] == 0 and r["growth_flops"] == 0
    else:
        assert r["n_growths"] >= 1 and r["growth_flops"] > 0
        assert r["curve"][-1]["d_k"] == r["final_d_k"]


def test_fixed_small_never_grows_and_flops_are_linear_in_steps():
    r = train_run(TrainConfig(method="fixed-small", **TINY))
    assert r["final_d_k"] == [TINY["d_k0"]]
    f = [c["flops"] for c in r["curve"]]
    per = f[1] - f[0]
    assert per > 0 and all(b - a == pytest.approx(per) for a, b in zip(f, f[1:], strict=False))


def test_same_seed_same_curves():
    cfg = TrainConfig(method="default", **TINY)
    a, b = train_run(cfg), train_run(cfg)
    assert [c["heldout_loss"] for c in a["curve"]] == [c["heldout_loss"] for c in b["curve"]]
    assert [e["lam"] for e in a["events"]] == [e["lam"] for e in b["events"]]


def test_split_budget_goes_where_the_gradient_is():
    ds, model = _model(n_heads=2)
    caps, *_ = capture(model, ds, 8, growth_batches(0, 1), "cpu")
    strategy = strategies.make("default")
    Xa, Gs, mask = caps[0]
    stats = {0: strategy.new_statistics().update(Xa, Gs[0], mask),
             1: strategy.new_statistics().update(Xa, torch.zeros_like(Gs[1]), mask)}
    assert split_budget(strategy, stats, {0: 6, 1: 6}, 4) == {0: 4, 1: 0}
    # A head with no room gets nothing, whatever its gradient.
    assert split_budget(strategy, stats, {0: 0, 1: 6}, 4) == {0: 0, 1: 4}
    both = {0: stats[0], 1: strategy.new_statistics().update(Xa, Gs[0], mask)}
    got = split_budget(strategy, both, {0: 6, 1: 6}, 4)
    assert got[0] == got[1] == 2  # identical heads split evenly


def test_starved_is_an_optimality():
    ds, model = _model()
    caps, *_ = capture(model, ds, 8, growth_batches(0, 1), "cpu")
    o = starved(model, caps, 0)
    assert -1.0 <= o <= 1.0


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown training method 'nope'"):
        TrainConfig(method="nope", **{k: v for k, v in TINY.items()})
    with pytest.raises(ValueError, match="d_k_max=9 > d_e=8"):
        TrainConfig(method="default", **{**TINY, "d_k_max": 9})
    with pytest.raises(ValueError, match="unknown trigger 'x'"):
        TrainConfig(method="default", trigger="x", **TINY)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        TrainConfig(method="default", **{**TINY, "lr": float("nan")})
    with pytest.raises(ValueError, match="unknown opt_state"):
        TrainConfig(method="default", opt_state="keep", **TINY)


def test_presets_are_valid_and_distinct():
    presets = train_presets()
    assert set(presets) == {"smoke", "quick", "variants", "real", "real-once", "decoder", "full"}
    for configs in presets.values():
        assert len(set(configs)) == len(configs)
    for name, seeds in (("quick", 8), ("real", 5), ("real-once", 5), ("decoder", 4)):  # every method, the baselines
        assert {c.method for c in presets[name]} == {"default", "random", "zero", "gradmax", "fixed-small",
                                                     "fixed-large"}
        assert {c.seed for c in presets[name]} == set(range(seeds))
        assert len(presets[name]) == 6 * seeds * len({c.dataset for c in presets[name]})
    # real-once: real's runs but for the schedule, one growth from d_k0 to d_k_max after the first step.
    once = {dataclasses.replace(c, p=4, grow_every=30) for c in presets["real-once"]}
    assert once == set(presets["real"]) and {(c.p, c.grow_every) for c in presets["real-once"]} == {(12, 1)}
    # decoder: SmolLM2's next-token loss, every head of one layer grown back to the 16 dimensions that replace its
    # pairs exactly.
    assert {c.dataset for c in presets["decoder"]} == {"smollm-lm:narrow=layer:layer=26"}
    assert {(c.d_k0, c.d_k_max) for c in presets["decoder"]} == {(1, 16)}
    variants = presets["variants"]
    assert {c.scale_policy for c in variants} == {"rescale", "fixed", "learnable"}
    assert {c.n_heads for c in variants} == {1, 2} and {c.trigger for c in variants} == {"schedule", "bottleneck"}


# ------------------------------------------------------------------ database and resume
def test_sweep_records_failures_and_goes_on(tmp_path, monkeypatch):
    from growbench.harness.runner import train_sweep

    # Invalid input is refused before any work (no row), so a genuine failure of a run is injected.
    real = train_sweep.train_run

    def train_run(cfg):
        if cfg.seed == 1:
            raise RuntimeError("injected failure")
        return real(cfg)

    monkeypatch.setattr(train_sweep, "train_run", train_run)
    db = str(tmp_path / "t.sqlite")
    good = TrainConfig(method="default", **TINY)
    bad = TrainConfig(method="default", seed=1, **TINY)
    runs = run_train_sweep([bad, good], db, progress=False)
    assert sorted(runs.status) == ["failed", "ok"]
    assert "injected failure" in runs[runs.status == "failed"].error.iloc[0]
    with TrainDB(db) as d:
        curves = d.curves()
    assert set(curves.key) == {runs[runs.status == "ok"].key.iloc[0]}
    assert len(curves) == TINY["steps"] // TINY["eval_every"] + 1
    assert json.loads(curves.d_k.iloc[-1]) == [TINY["d_k_max"]]


def test_resume_after_killed_training_sweep_has_every_run_exactly_once(tmp_path):
    db = tmp_path / "r.sqlite"
    seeds = list(range(6))
    args = ["train", "--preset", "smoke", "--datasets", "teacher", "--methods", "default,fixed-small",
            "--seeds", ",".join(map(str, seeds)), "--db", str(db), "--no-progress"]
    n_at_kill = kill_cli_after_rows(args, db, "train_runs", 2)
    assert 2 <= n_at_kill < 2 * len(seeds), "the sweep must be killed mid-way for this test to mean anything"
    with TrainDB(db) as d:
        survived, curves = d.frame(), d.curves()
    # Every stored run has its whole curve: nothing partial survives the kill.
    per_key = curves.groupby("key").size()
    assert set(per_key.index) == set(survived.key)
    configs = [c for c in train_presets()["smoke"] if c.dataset == "teacher" and c.method in ("default", "fixed-small")]
    import dataclasses

    configs = [dataclasses.replace(c, seed=s) for s in seeds for c in configs]
    runs = run_train_sweep(configs, str(db), progress=False)
    assert len(runs) == 2 * len(seeds) and set(runs.status) == {"ok"}
    assert set(runs.key) == {c.key(code_version()) for c in configs}
    with TrainDB(db) as d:
        curves = d.curves()
    assert (curves.groupby("key").size() == configs[0].steps // configs[0].eval_every + 1).all()
