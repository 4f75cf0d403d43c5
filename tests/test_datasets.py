"""Tests of the ``datasets`` package: batches, models, known optima and the warm-up cache."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import torch

import growbench.datasets.registry as datasets
from growbench.datasets import cache as cache_mod
from growbench.datasets import digits as digits_mod
from growbench.datasets import teacher as teacher_mod
from growbench.datasets.base import sinusoidal_encoding
from growbench.datasets.digits import patchify
from growbench.datasets.registry import (
    DATASETS,
    PRETRAINED_DATASETS,
    DigitsDataset,
    ICLRegressionDataset,
    TeacherDataset,
    TextDataset,
    make_dataset,
)

# Small configurations so that the whole file stays fast.
CONFIGS = {
    "teacher": dict(d_e=8, d_s=6),
    "icl-regression": dict(d_e=6, d_s=11),
    "digits": dict(d_e=8, d_s=16),
    "text": dict(d_e=16, d_s=12),
}
WARMUP = dict(warmup_steps=100, batch_size=32, lr=1e-2)


def small(name: str, seed: int = 0, **options):
    return make_dataset(name, seed=seed, **CONFIGS[name], **options)


def expected_shapes(ds, b: int) -> tuple[tuple, tuple]:
    if isinstance(ds, TeacherDataset):
        return (b, ds.d_s, ds.d_e), (b, ds.d_s, ds.d_e)
    if isinstance(ds, ICLRegressionDataset):
        return (b, ds.d_s, ds.d_e), (b,)
    if isinstance(ds, DigitsDataset):
        return (b, ds.d_s, ds.patch_dim), (b,)
    return (b, ds.d_s), (b, ds.d_s)


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ registry
def test_registry_names_and_classes() -> None:
    assert set(DATASETS) == {"teacher", "icl-regression", "digits", "text", *PRETRAINED_DATASETS}
    assert set(PRETRAINED_DATASETS) == {"minilm-recovery", "minilm-similarity", "smollm-recovery", "smollm-lm"}
    for name, cls in DATASETS.items():
        assert cls.name == name
        assert cls.description and "\n" not in cls.description
        if name not in PRETRAINED_DATASETS:  # fixed widths: tests/test_pretrained.py and test_smollm.py build those
            assert isinstance(small(name), cls)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'nope'") as e:
        make_dataset("nope", 8, 8)
    for name in DATASETS:
        assert name in str(e.value)


@pytest.mark.parametrize(
    "name, d_e, d_s, options, match",
    [
        ("digits", 8, 10, {}, r"d_s must be one of 4 .*16 .*64"),
        ("icl-regression", 1, 8, {}, "d_e"),
        ("icl-regression", 4, 1, {}, "d_s"),
        ("icl-regression", 4, 8, {"noise": -1.0}, "noise"),
        ("teacher", 1, 8, {}, "d_e"),
        ("teacher", 8, 8, {"cond": 0.5}, "cond"),
        ("teacher", 8, 8, {"teacher_d_k": 2.5}, "teacher_d_k"),
        ("teacher", 8, 8, {"sharpness": 2.0}, r"unknown option\(s\) sharpness; valid options: .*teacher_sharpness"),
        ("text", 8, 10**6, {}, "d_s"),
        ("text", 0, 8, {}, "d_e"),
    ],
)
def test_bad_arguments_raise_clear_errors(name, d_e, d_s, options, match) -> None:
    with pytest.raises(ValueError, match=match):
        make_dataset(name, d_e, d_s, **options)


def test_numpy_integers_are_accepted(tmp_path) -> None:
    # Sweep tables (pandas) hand out numpy scalars; they must not break cache keys.
    ds = make_dataset("teacher", np.int64(8), np.int64(6), seed=np.int64(2), teacher_d_k=np.int64(4))
    assert type(ds.d_e) is int and type(ds.seed) is int and type(ds.options()["teacher_d_k"]) is int
    ds.batch(np.int64(3), "train", np.int64(1))
    datasets.trained_model(ds, np.int64(3), warmup_steps=np.int64(1), batch_size=np.int64(4), cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1


def test_bad_batch_arguments() -> None:
    ds = small("teacher")
    with pytest.raises(ValueError, match="split"):
        ds.batch(4, "valid")
    with pytest.raises(ValueError, match="index"):
        ds.batch(4, "train", -1)


def test_options_are_json_and_canonical() -> None:
    for name in set(DATASETS) - set(PRETRAINED_DATASETS):
        json.dumps(small(name).options())
    # 100 and 100.0 are the same option, so they must give the same cache key.
    a = make_dataset("teacher", 8, 6, cond=100, teacher_d_k=4.0)
    b = make_dataset("teacher", 8, 6, cond=100.0, teacher_d_k=4)
    assert a.options() == b.options() and json.dumps(a.options()) == json.dumps(b.options())
    assert make_dataset("teacher", 8, 6, causal=True).causal and not a.causal


# ------------------------------------------------------------ every dataset
@pytest.mark.parametrize("name", list(CONFIGS))
def test_shapes_and_embedding(name: str) -> None:
    ds = small(name)
    b = 5
    inputs, targets = ds.batch(b, "train", 3)
    in_shape, tg_shape = expected_shapes(ds, b)
    assert inputs.shape == in_shape and targets.shape == tg_shape
    model = ds.build_model(d_k=3)
    X = model.embed_inputs(inputs)
    assert X.shape == (b, ds.d_s, ds.d_e) and X.dtype == torch.float32
    assert model.block.causal == ds.causal
    assert model.forward(inputs).shape[0] == b


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batches_are_deterministic(name: str) -> None:
    ds, again = small(name), small(name)
    for split in ("train", "test"):
        x1, y1 = ds.batch(7, split, 5)
        x2, y2 = again.batch(7, split, 5)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
        x3, _ = ds.batch(7, split, 6)
        assert not torch.equal(x1, x3)
    assert not torch.equal(ds.batch(7, "train", 0)[0], ds.batch(7, "test", 0)[0])
    assert not torch.equal(ds.batch(7, "train", 0)[0], small(name, seed=1).batch(7, "train", 0)[0])
    # Order of requests does not matter: a batch is a function of its index only.
    assert torch.equal(small(name).batch(7, "train", 5)[0], ds.batch(7, "train", 5)[0])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_global_rng_untouched_and_model_deterministic(name: str) -> None:
    rng = torch.get_rng_state()
    ds = small(name)
    ds.batch(4, "train", 0)
    m1 = ds.build_model(d_k=3)
    assert torch.equal(torch.get_rng_state(), rng)
    m2 = small(name).build_model(d_k=3)
    assert same_state(state(m1), state(m2))
    assert not same_state(state(m1), state(small(name, seed=1).build_model(d_k=3)))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kw", [dict(), dict(n_heads=2, bias=True, scale_policy="learnable", dtype=torch.float64)])
def test_loss_finite_and_capture_works(name: str, kw: dict) -> None:
    ds = small(name)
    model = ds.build_model(d_k=3, **kw)
    inputs, targets = ds.batch(6, "train", 0)
    loss = model.loss(inputs, targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    # rest() is the loss as a function of the block output: the harness's path.
    Y = model.block(model.embed_inputs(inputs))
    assert torch.allclose(model.rest(targets)(Y), loss)
    with model.block.capture():
        model.loss(inputs, targets).backward()
    cap = model.block.captured(0)
    assert cap.G.shape == (6, ds.d_s, ds.d_s) and torch.isfinite(cap.G).all()
    fn = model.block.loss_of_scores(model.rest(targets), 0)
    assert torch.allclose(fn(cap.S), loss)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_warmup_decreases_heldout_loss(name: str) -> None:
    ds = small(name)
    inputs, targets = ds.batch(512, "test", 0)
    fresh, trained = ds.build_model(d_k=3), datasets.trained_model(ds, 3, cache_dir=None, **WARMUP)
    with torch.no_grad():
        before, after = float(fresh.loss(inputs, targets)), float(trained.loss(inputs, targets))
    assert after < 0.9 * before, (before, after)


def test_sinusoidal_encoding_formula() -> None:
    for d_e in (6, 7):
        pe = sinusoidal_encoding(5, d_e, dtype=torch.float64)
        for pos in range(5):
            for j in range(d_e):
                ang = pos / 10000 ** ((j - j % 2) / d_e)
                assert pe[pos, j].item() == pytest.approx(math.sin(ang) if j % 2 == 0 else math.cos(ang), abs=1e-12)


# ------------------------------------------------------------------ teacher
@pytest.mark.parametrize("causal", [False, True])
def test_teacher_optimum_is_reached_by_installing_its_factors(causal: bool) -> None:
    ds = make_dataset("teacher", 10, 7, teacher_d_k=4, causal=causal)
    Z = ds.teacher_Z()
    assert Z.shape == (10, 10)
    assert int(torch.linalg.matrix_rank(Z)) == 4
    inputs, targets = ds.batch(64, "test", 0)
    for kw in (dict(), dict(n_heads=2, bias=True), dict(scale_policy="fixed")):
        model = ds.build_model(d_k=2, dtype=torch.float64, **kw)
        assert model.block.causal == causal
        before = float(model.loss(inputs, targets).detach())
        assert before > 1e-3  # only the scores differ, and they do
        block = model.block
        for h in range(block.n_heads):
            # Under "fixed" the head keeps its scale, so the factors are rescaled to match Z.
            scale = block.scale(h) if block.scale_policy == "fixed" else None
            block.install(h, *ds.teacher_factors(scale=scale, bias=block.bias))
        with torch.no_grad():
            assert float(model.loss(inputs, targets)) < 1e-12 * float((targets.double() ** 2).mean())
    # A float32 student also gets there, up to float32 rounding.
    model = ds.build_model(d_k=2)
    model.block.install(0, *ds.teacher_factors())
    with torch.no_grad():
        assert float(model.loss(inputs, targets)) < 1e-9


def test_teacher_factors_pad_for_a_wider_student() -> None:
    ds = make_dataset("teacher", 10, 7, teacher_d_k=4)
    inputs, targets = ds.batch(16, "test", 0)
    model = ds.build_model(d_k=6, dtype=torch.float64)
    # Under "rescale" a width-6 head gets c = 1/sqrt(6); the factors are scaled to match.
    W_Q, W_K = ds.teacher_factors(scale=1 / math.sqrt(6), width=6)
    assert W_Q.shape == (10, 6) and torch.all(W_Q[:, 4:] == 0)
    model.block.install(0, W_Q, W_K)
    with torch.no_grad():
        assert float(model.loss(inputs, targets)) < 1e-12


def test_teacher_rank_default_and_covariance() -> None:
    ds = make_dataset("teacher", 32, 4)
    assert int(torch.linalg.matrix_rank(ds.teacher_Z())) == 16
    ev = torch.linalg.eigvalsh(ds.covariance)
    assert float(ev.max() / ev.min()) == pytest.approx(100.0, rel=1e-6)
    # Sample covariance of the inputs matches Σ.
    x, _ = ds.batch(4000, "train", 0)
    emp = torch.cov(x.double().reshape(-1, 32).T)
    assert torch.allclose(emp, ds.covariance, atol=0.03)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_computing_on_the_cpu_is_the_plain_batch_bit_for_bit(name: str) -> None:
    ds = small(name)
    assert ds.compute_on("cpu") is ds and ds.compute_device == torch.device("cpu")
    for split, index in (("train", 3), ("test", 0)):
        for got, plain in zip(ds.batch(5, split, index), small(name).batch(5, split, index), strict=True):
            assert got.device.type == "cpu" and torch.equal(got, plain)


@pytest.mark.parametrize("causal", [False, True])
def test_teacher_batches_computed_elsewhere_stay_there(causal: bool) -> None:
    # The meta device holds no values, only placement and shapes: a tensor left on the CPU (a mask,
    # the draw) would raise here as it would on a GPU, which CI does not have.
    ds = make_dataset("teacher", d_e=16, d_s=8, seed=0, causal=causal).compute_on("meta")
    X, Y = ds.batch(3, "test", 2)
    assert X.device.type == Y.device.type == "meta" and X.shape == Y.shape == (3, 8, 16)
    assert X.dtype == Y.dtype == torch.float32
    assert ds._chol.device.type == "cpu" and ds.teacher.W_O.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_teacher_batches_computed_on_cuda_are_the_cpu_batches_up_to_rounding() -> None:
    ds = make_dataset("teacher", d_e=64, d_s=32, seed=2).compute_on("cuda")
    for split, index in (("train", 0), ("test", 4)):
        X, Y = ds.batch(6, split, index)
        X_cpu, Y_cpu = make_dataset("teacher", d_e=64, d_s=32, seed=2).batch(6, split, index)
        assert X.is_cuda and Y.is_cuda
        # The draw is the CPU generator's; only float64 rounding of the product and the teacher differs.
        torch.testing.assert_close(X.cpu(), X_cpu, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(Y.cpu(), Y_cpu, rtol=1e-6, atol=1e-7)
    assert ds.teacher.W_O.device.type == "cpu"  # the original stays: the student copies its values from it


def test_the_teachers_device_draw_changes_nothing_on_the_cpu() -> None:
    plain = make_dataset("teacher", d_e=16, d_s=8, seed=3)
    drawn = make_dataset("teacher:device_draw=true", d_e=16, d_s=8, seed=3).compute_on("cpu")
    assert drawn.options()["device_draw"] is True and plain.options()["device_draw"] is False
    for split, index in (("train", 1), ("test", 5)):
        for got, want in zip(drawn.batch(4, split, index), plain.batch(4, split, index), strict=True):
            assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_teachers_device_draw_is_a_reproducible_draw_of_the_same_distribution() -> None:
    def batch(seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return make_dataset("teacher:device_draw=true", d_e=32, d_s=8, seed=seed).compute_on("cuda").batch(
            2000, "train", index)

    X, Y = batch(1, 0)
    assert X.is_cuda and Y.is_cuda
    for got, again in zip((X, Y), batch(1, 0), strict=True):
        assert torch.equal(got, again)
    assert not torch.equal(X, batch(1, 1)[0]) and not torch.equal(X, batch(2, 0)[0])
    cpu = make_dataset("teacher", d_e=32, d_s=8, seed=1)
    assert not torch.allclose(X.cpu(), cpu.batch(2000, "train", 0)[0])  # the GPU generator's values, not the CPU's
    emp = torch.cov(X.double().reshape(-1, 32).T).cpu()
    torch.testing.assert_close(emp, cpu.covariance, atol=0.03, rtol=0)
    # The draw is the device generator's, seeded like the CPU's for the same batch; the targets are the teacher's
    # outputs on it (computed in float64 before rounding).
    seed = cpu._generator("data", "train", 0).initial_seed()
    X64 = teacher_mod.anisotropic_inputs(2000, 8, cpu._chol.cuda(), torch.Generator(device="cuda").manual_seed(seed))
    assert torch.equal(X, X64.float())
    torch.testing.assert_close(Y.cpu(), cpu.teacher(X64.cpu()).float(), rtol=1e-6, atol=1e-7)


def test_reference_problem_is_the_documented_teacher_student_capture() -> None:
    """Inputs from ``seed``, teacher from ``seed + 1``, the teacher's values and output, and a consistent capture."""
    pb = teacher_mod.reference_problem(b=4, d_s=6, d_e=8, d_k=2, teacher_d_k=3, cond=10.0, causal=True, seed=5,
                                       warmup_steps=0)
    gen = torch.Generator().manual_seed(5)
    chol = torch.linalg.cholesky(teacher_mod.anisotropic_covariance(8, 10.0, gen))
    assert torch.equal(pb.X, teacher_mod.anisotropic_inputs(4, 6, chol, gen).float())
    teacher = teacher_mod.sharpened_teacher(8, 3, 4.0, causal=True, generator=torch.Generator().manual_seed(6),
                                            dtype=torch.float32)
    assert torch.equal(pb.block.heads[0].W_V, teacher.heads[0].W_V) and torch.equal(pb.block.W_O, teacher.W_O)

    S = (pb.X @ (pb.scale * pb.W_Q @ pb.W_K.mT) @ pb.X.mT).requires_grad_(True)
    loss = pb.loss_of_scores(S)
    with torch.no_grad():
        assert float(loss) == pytest.approx(float(torch.nn.functional.mse_loss(pb.block(pb.X), teacher(pb.X))),
                                            rel=1e-5)
    (G,) = torch.autograd.grad(loss, S)
    assert torch.allclose(G, pb.G, rtol=1e-4, atol=1e-9)
    # ``rest`` survives pickling (the asv suites cache the problem through it).
    Y = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pickle.loads(pickle.dumps(pb.rest))(Y), pb.rest(Y))


# ----------------------------------------------------------- icl-regression
def test_icl_batch_structure() -> None:
    ds = make_dataset("icl-regression", 5, 9)
    inputs, targets = ds.batch(16, "train", 0)
    assert torch.all(inputs[:, -1, -1] == 0)  # the query's label slot is empty
    # Noise-free labels are linear in x with one w per sequence (solve from 8 points in 4 dims).
    x, y = inputs[..., :-1].double(), inputs[..., -1].double()
    X_all = torch.cat([x[:, :-1], x[:, -1:]], 1)
    y_all = torch.cat([y[:, :-1], targets.double()[:, None]], 1)
    w = torch.linalg.lstsq(x[:, :-1], y[:, :-1, None]).solution
    assert torch.allclose(X_all @ w, y_all[..., None], atol=1e-4)


def test_icl_linear_attention_implements_gd() -> None:
    ds = make_dataset("icl-regression", 5, 9)
    inputs, _ = ds.batch(8, "train", 0)
    X = inputs.double()
    d_e, N, eta = ds.d_e, ds.n_context, 0.7
    Z = torch.zeros(d_e, d_e, dtype=torch.float64)
    Z[:-1, :-1] = torch.eye(d_e - 1)
    W_VO = torch.zeros(d_e, d_e, dtype=torch.float64)
    W_VO[-1, -1] = eta / N
    Y = (X @ Z @ X.mT) @ X @ W_VO + X  # linear (no softmax) attention, residual
    assert torch.allclose(Y[:, -1, -1], ds.gd_prediction(X, eta), atol=1e-10)


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_icl_one_step_gd_optimum_by_monte_carlo(noise: float) -> None:
    ds = make_dataset("icl-regression", 6, 11, noise=noise)
    eta, loss = ds.optimal_eta_and_loss()
    d, N = 5, 10
    assert eta == pytest.approx(N / (N + d + 1 + noise**2))
    inputs, targets = ds.batch(200_000, "train", 0)
    X, t = inputs.double(), targets.double()

    def mc(e: float) -> float:
        return float(((ds.gd_prediction(X, e) - t) ** 2).mean())

    assert mc(eta) == pytest.approx(loss, rel=0.02)
    assert mc(0.8 * eta) == pytest.approx(ds.gd_expected_loss(0.8 * eta), rel=0.02)
    # A minimum: same samples, so the comparison is much sharper than each estimate.
    assert mc(eta) < mc(0.8 * eta) and mc(eta) < mc(1.2 * eta)
    trivial = d + noise**2
    assert float((t**2).mean()) == pytest.approx(trivial, rel=0.02)
    assert loss < trivial and mc(eta) < float((t**2).mean())


# ------------------------------------------------------------------- digits
def test_digits_split_is_disjoint_and_batches_cycle() -> None:
    ds = make_dataset("digits", 8, 16)
    train, test = set(ds.split_ids("train").tolist()), set(ds.split_ids("test").tolist())
    assert not train & test and len(train) + len(test) == 1797 and len(test) == round(0.2 * 1797)
    # No image (by pixel content) in both splits.
    images = digits_mod._digits()[0].reshape(1797, -1)
    train_px = {tuple(r) for r in images[sorted(train)].tolist()}
    assert not any(tuple(r) in train_px for r in images[sorted(test)].tolist())
    # Consecutive train batches cover every train image exactly once per epoch.
    n = len(train)
    ids = torch.cat([ds.image_ids(n // 4 + 1, "train", i) for i in range(4)])[:n]
    assert sorted(ids.tolist()) == sorted(train)
    assert set(ds.image_ids(100, "test", 7).tolist()) <= test


@pytest.mark.parametrize("d_s, ps", [(4, 4), (16, 2), (64, 1)])
def test_digits_patches_rebuild_the_image(d_s: int, ps: int) -> None:
    ds = make_dataset("digits", 8, d_s)
    inputs, labels = ds.batch(3, "train", 0)
    assert inputs.shape == (3, d_s, ps * ps) and inputs.min() >= 0 and inputs.max() <= 1
    images, all_labels = digits_mod._digits()
    ids = ds.image_ids(3, "train", 0)
    assert torch.equal(labels, all_labels[ids])
    g = 8 // ps
    rebuilt = inputs.reshape(3, g, g, ps, ps).permute(0, 1, 3, 2, 4).reshape(3, 8, 8)
    assert torch.equal(rebuilt, images[ids])
    assert torch.equal(patchify(images[ids], ps), inputs)


# --------------------------------------------------------------------- text
def test_text_windows_respect_split_boundaries() -> None:
    ds = make_dataset("text", 8, 32)
    n = ds._ids.shape[0]
    assert ds.split_range("train") == (0, ds.boundary) and ds.split_range("test") == (ds.boundary, n)
    assert ds.boundary == math.floor(0.9 * n) and n > 400_000
    for split in ("train", "test"):
        lo, hi = ds.split_range(split)
        starts = torch.cat([ds.starts(256, split, i) for i in range(20)])
        assert starts.min() >= lo and starts.max() + ds.d_s + 1 <= hi  # targets included
        inputs, targets = ds.batch(4, split, 0)
        s = ds.starts(4, split, 0)
        for k in range(4):
            assert torch.equal(inputs[k], ds._ids[s[k] : s[k] + ds.d_s])
        assert torch.equal(targets[:, :-1], inputs[:, 1:])
    assert ds.vocab_size <= 97 and ds.vocab[0] == "\x00"
    text = ds.decode(ds.batch(1, "train", 0)[0][0])
    assert len(text) == 32


def test_text_model_is_causal() -> None:
    ds = make_dataset("text", 8, 16)
    model = ds.build_model(d_k=4, dtype=torch.float64)
    inputs, _ = ds.batch(3, "test", 0)
    t = 6
    changed = inputs.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % ds.vocab_size
    with torch.no_grad():
        a, b = model(inputs), model(changed)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-12, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.fixture
def two_threads():
    # The order of a parallel scatter-add depends on thread scheduling; conftest may pin one thread.
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_text_embedding_gradient_is_reproducible(two_threads) -> None:
    # weight[ids] would accumulate its gradient in a thread-dependent order (30 different
    # results in 30 runs at this size); the warm-up cache needs the same bits every time.
    ds = make_dataset("text", 32, 32)
    model = ds.build_model(d_k=4)
    inputs, _ = ds.batch(64, "train", 0)
    up = torch.randn(64, 32, 32, generator=torch.Generator().manual_seed(0))
    grads = set()
    for _ in range(10):
        model.zero_grad()
        (model.embed_inputs(inputs) * up).sum().backward()
        grads.add(model.embed.token_embed.weight.grad.numpy().tobytes())
    assert len(grads) == 1


# -------------------------------------------------------------------- cache
def warm(ds, tmp_path, **kw):
    return datasets.trained_model(ds, 3, cache_dir=tmp_path, **{**WARMUP, "warmup_steps": 5, **kw})


@pytest.mark.parametrize("name", list(CONFIGS))
def test_warmup_is_bitwise_deterministic(name: str, two_threads) -> None:
    # Cached weights stand for a recomputation, so any run must give the same bits (e.g. the
    # text embedding must not use an order-dependent scatter-add in its backward).
    ds = small(name)
    a = datasets.trained_model(ds, 3, cache_dir=None, **{**WARMUP, "warmup_steps": 20, "batch_size": 64})
    b = datasets.trained_model(small(name), 3, cache_dir=None, **{**WARMUP, "warmup_steps": 20, "batch_size": 64})
    assert same_state(state(a), state(b))


def test_warmup_trains_every_parameter() -> None:
    ds = small("digits")
    a = datasets.trained_model(ds, 3, cache_dir=None, **{**WARMUP, "warmup_steps": 5})
    fresh = state(ds.build_model(3))
    trained = state(a)
    assert all(not torch.equal(fresh[k], trained[k]) for k in fresh)  # embed, block and head all moved
    assert all(p.requires_grad for p in a.parameters())


def test_cache_second_call_loads_without_training(tmp_path, monkeypatch) -> None:
    ds = small("teacher")
    first = state(warm(ds, tmp_path))
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"  # no temp file left behind

    def no_training(*args, **kwargs):
        raise AssertionError("retrained although a valid cache entry exists")

    monkeypatch.setattr(cache_mod, "warm_up", no_training)
    assert same_state(state(warm(ds, tmp_path)), first)
    # A setting that changes the weights is a different entry (and would need training).
    with pytest.raises(AssertionError, match="retrained"):
        warm(ds, tmp_path, lr=2e-2)


class CountingWarmUp:
    def __init__(self) -> None:
        self.calls = 0
        self.real = cache_mod.warm_up

    def __call__(self, *args, **kwargs) -> None:
        self.calls += 1
        self.real(*args, **kwargs)


def test_cache_corrupt_file_is_rebuilt(tmp_path, monkeypatch) -> None:
    ds = small("text")
    counter = CountingWarmUp()
    monkeypatch.setattr(cache_mod, "warm_up", counter)
    first = state(warm(ds, tmp_path))
    (path,) = tmp_path.iterdir()
    path.write_bytes(b"\x00garbage, not a torch file" * 10)
    with pytest.warns(cache_mod.CacheWarning, match="unreadable"):  # said once, not left to the console
        again = state(warm(ds, tmp_path))
    assert counter.calls == 2 and same_state(again, first)
    # The rebuilt file is valid again: the next call loads it.
    warm(ds, tmp_path)
    assert counter.calls == 2


def test_cache_stale_or_incompatible_entry_is_rebuilt(tmp_path, monkeypatch) -> None:
    ds = small("icl-regression")
    counter = CountingWarmUp()
    monkeypatch.setattr(cache_mod, "warm_up", counter)
    first = state(warm(ds, tmp_path))
    (path,) = tmp_path.iterdir()
    blob = torch.load(path, weights_only=True)

    # Stale: the stored key differs from the one asked for.
    key = json.loads(blob["key_json"])
    key["cache_version"] = -1
    torch.save({"key_json": json.dumps(key), "state_dict": blob["state_dict"]}, path)
    with pytest.warns(cache_mod.CacheWarning, match="key"):
        assert same_state(state(warm(ds, tmp_path)), first) and counter.calls == 2

    # Right key, wrong tensors: load_state_dict fails, the model is rebuilt from scratch.
    bad = {k: torch.zeros(1) for k in blob["state_dict"]}
    torch.save({"key_json": blob["key_json"], "state_dict": bad}, path)
    with pytest.warns(cache_mod.CacheWarning):
        assert same_state(state(warm(ds, tmp_path)), first) and counter.calls == 3

    # Not even a dict.
    torch.save([1, 2, 3], path)
    with pytest.warns(cache_mod.CacheWarning, match="not a cache record"):
        assert same_state(state(warm(ds, tmp_path)), first) and counter.calls == 4


def test_cache_disabled_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    datasets.trained_model(small("teacher"), 3, cache_dir=None, **{**WARMUP, "warmup_steps": 2})
    assert list(tmp_path.iterdir()) == []


def test_cache_key_covers_settings() -> None:
    ds = small("teacher")
    base = dict(warmup_steps=10, batch_size=8, lr=1e-3, n_heads=1, bias=False, scale_policy="rescale",
                dtype=torch.float32, device="cpu")
    k0 = cache_mod.cache_key(ds, 3, **base)
    assert json.loads(k0)["torch"] == torch.__version__
    variants = [cache_mod.cache_key(ds, 4, **base)]
    for k, v in dict(warmup_steps=11, batch_size=9, lr=2e-3, n_heads=2, bias=True, scale_policy="fixed",
                     dtype=torch.float64).items():
        variants.append(cache_mod.cache_key(ds, 3, **{**base, k: v}))
    variants.append(cache_mod.cache_key(small("teacher", seed=1), 3, **base))
    variants.append(cache_mod.cache_key(small("teacher", cond=10.0), 3, **base))
    variants.append(cache_mod.cache_key(make_dataset("teacher", 8, 7), 3, **base))
    assert len({k0, *variants}) == len(variants) + 1


def test_cache_key_covers_the_cpu_thread_count() -> None:
    """The thread count changes a CPU warm-up's rounding (digits: weights differ by ~5e-7 between 1 and 2 threads),
    so a model warmed up under one count is not served to a run under another."""
    ds = small("teacher")
    base = dict(warmup_steps=10, batch_size=8, lr=1e-3, n_heads=1, bias=False, scale_policy="rescale",
                dtype=torch.float32, device="cpu")
    before = torch.get_num_threads()
    try:
        keys = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            keys[n] = cache_mod.cache_key(ds, 3, **base)
    finally:
        torch.set_num_threads(before)
    assert keys[1] != keys[2]
    assert json.loads(keys[2])["cpu_threads"] == 2


def test_text_options_identify_corpus() -> None:
    opts = small("text").options()
    assert opts["corpus"] == "pydoc_data.topics" and len(opts["corpus_sha256"]) == 16
    assert isinstance(small("text"), TextDataset)


def test_every_dataset_names_its_kind_and_a_pretrained_one_its_task():
    from growbench.datasets.base import KINDS

    assert {cls.kind for cls in DATASETS.values()} <= set(KINDS)
    assert all((cls.task is not None) == (cls.kind == "pretrained") for cls in DATASETS.values())
    assert {DATASETS[name].kind for name in PRETRAINED_DATASETS} == {"pretrained"}
