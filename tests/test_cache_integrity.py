"""The warm-up cache checks its files for damage and accidents (issue 12, item 3), not for forgery (issue 38).

Each cached model carries a checksum and its check loss. A flipped byte in the tensor
data, zeroed weights, a NaN, weights beyond Adam's reach or weights that do not give the
stored loss must each warn (naming the file and the reason) and give exactly the weights
of a model trained without the cache, after which the rewritten file loads silently.
Tiny sizes keep the file fast.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest
import torch

import growbench.datasets.registry as datasets
from growbench.datasets import cache as cache_mod
from growbench.datasets.cache import CacheWarning

SETTINGS = dict(warmup_steps=20, batch_size=8, lr=1e-2)
D_K = 2


def teacher():
    return datasets.make_dataset("teacher", 8, 8)


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """The weights of the warm-up without any cache: what every rebuild must give."""
    return state(datasets.trained_model(teacher(), D_K, cache_dir=None, **SETTINGS))


def cached(cache_dir: Path, **kw):
    return datasets.trained_model(teacher(), D_K, cache_dir=cache_dir, **{**SETTINGS, **kw})


class CountingWarmUp:
    def __init__(self) -> None:
        self.calls = 0
        self.real = cache_mod.warm_up

    def __call__(self, *args, **kwargs) -> None:
        self.calls += 1
        self.real(*args, **kwargs)


@pytest.fixture
def entry(tmp_path, monkeypatch, reference):
    """A freshly written cache file (path, raw blob) and a counter of warm-ups from now on."""
    cached(tmp_path)
    (path,) = tmp_path.iterdir()
    counter = CountingWarmUp()
    monkeypatch.setattr(cache_mod, "warm_up", counter)
    return path, torch.load(path, weights_only=True), counter


def load_expecting_rebuild(path: Path, counter: CountingWarmUp, reference: dict, match: str) -> None:
    """One load that must warn (file named, reason matched), retrain once and give the reference weights."""
    before = counter.calls
    with pytest.warns(CacheWarning, match=match) as caught:
        got = state(cached(path.parent))
    assert any(str(path) in str(w.message) for w in caught)
    assert counter.calls == before + 1
    assert same_state(got, reference)
    # Overwritten atomically (no temp file left), and the new file is trusted again, silently.
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert same_state(state(cached(path.parent)), reference)
    assert counter.calls == before + 1


def tensor_offset(path: Path, t: torch.Tensor) -> int:
    """Where the raw bytes of ``t`` lie in the saved file (torch stores tensor data uncompressed)."""
    raw = path.read_bytes()
    needle = t.contiguous().numpy().tobytes()
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, "tensor bytes not found once in the file"
    return at


def patch_bytes(path: Path, offset: int, new: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(new)] = new
    path.write_bytes(bytes(raw))


def forge(path: Path, blob: dict, state_dict: dict | None = None, loss: float | None = None) -> None:
    """Rewrite the record with new content *and a matching checksum*: damage the checksum cannot see."""
    sd = blob["state_dict"] if state_dict is None else state_dict
    lo = blob["loss"] if loss is None else loss
    torch.save({"key_json": blob["key_json"], "state_dict": sd, "loss": lo,
                "checksum": cache_mod.checksum(blob["key_json"], lo, sd)}, path)


WEIGHT = "block.heads.0.W_Q"


# ------------------------------------------------------------------ a clean entry
def test_clean_entry_stores_checksum_and_loss_and_loads_silently(entry, reference):
    path, blob, counter = entry
    # Files of version 1 had no checksum; the bumped version gives them other names, never loaded.
    assert datasets.CACHE_VERSION >= 2 and f'"cache_version":{datasets.CACHE_VERSION}' in blob["key_json"]
    assert set(blob) == {"key_json", "state_dict", "loss", "checksum"}
    assert blob["checksum"] == cache_mod.checksum(blob["key_json"], blob["loss"], blob["state_dict"])
    assert same_state(blob["state_dict"], reference)
    # The stored loss is the trained model's loss on the train batch right after the warm-up.
    ds = teacher()
    model = ds.build_model(D_K)
    model.load_state_dict(reference)
    inputs, targets = ds.batch(SETTINGS["batch_size"], "train", SETTINGS["warmup_steps"])
    with torch.no_grad():
        assert blob["loss"] == pytest.approx(float(model.loss(inputs, targets)), rel=1e-6)
    assert blob["loss"] < 0.99 * cache_mod.check_loss(ds.build_model(D_K), ds, warmup_steps=SETTINGS["warmup_steps"],
                                                       batch_size=SETTINGS["batch_size"])  # training lowered it
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert same_state(state(cached(path.parent)), reference)
    assert counter.calls == 0


def test_checksum_covers_every_tensor_byte_and_the_loss(entry):
    _, blob, _ = entry
    key, loss, sd = blob["key_json"], blob["loss"], blob["state_dict"]
    base = cache_mod.checksum(key, loss, sd)
    for name in sd:
        flipped = {k: v.clone() for k, v in sd.items()}
        flipped[name].view(-1).view(torch.int32)[-1] ^= 1  # the lowest mantissa bit of the last entry
        assert cache_mod.checksum(key, loss, flipped) != base, name
    assert cache_mod.checksum(key, loss + 1e-12, sd) != base
    assert cache_mod.checksum(key.replace("teacher", "teacheR"), loss, sd) != base
    assert cache_mod.checksum(key, loss, {k: v.double() for k, v in sd.items()}) != base  # dtype is hashed


# ------------------------------------------------------------------ raw damage to the file
def test_flipped_byte_makes_a_huge_weight_that_torch_loads_silently(entry, reference):
    """The issue's case: one byte of a weight turns it into ~1e37; torch.load does not notice."""
    path, blob, counter = entry
    at = tensor_offset(path, blob["state_dict"][WEIGHT])
    raw = path.read_bytes()
    patch_bytes(path, at + 3, bytes([raw[at + 3] & 0x80 | 0x7D]))  # the exponent byte of the first entry
    damaged = torch.load(path, weights_only=True)["state_dict"][WEIGHT]  # no complaint from torch itself
    assert abs(damaged.view(-1)[0].item()) > 1e30
    load_expecting_rebuild(path, counter, reference, "checksum mismatch")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_single_bit_flip_anywhere_in_the_tensor_data(entry, reference, where):
    path, blob, counter = entry
    t = blob["state_dict"]["block.W_O"]
    at = tensor_offset(path, t)
    n = t.numel() * t.element_size()
    pos = at + {"first": 0, "middle": n // 2, "last": n - 1}[where]
    patch_bytes(path, pos, bytes([path.read_bytes()[pos] ^ 0x01]))
    load_expecting_rebuild(path, counter, reference, "checksum mismatch")


def test_zeroed_tensor_bytes(entry, reference):
    path, blob, counter = entry
    for name in (WEIGHT, "block.W_O"):
        t = blob["state_dict"][name]
        patch_bytes(path, tensor_offset(path, t), bytes(t.numel() * t.element_size()))
    assert not torch.load(path, weights_only=True)["state_dict"][WEIGHT].any()
    load_expecting_rebuild(path, counter, reference, "checksum mismatch")


def test_nan_written_into_the_tensor_data(entry, reference):
    path, blob, counter = entry
    patch_bytes(path, tensor_offset(path, blob["state_dict"][WEIGHT]), struct.pack("<f", float("nan")))
    assert torch.isnan(torch.load(path, weights_only=True)["state_dict"][WEIGHT]).any()
    load_expecting_rebuild(path, counter, reference, "checksum mismatch")


def test_stored_loss_bytes_changed(entry, reference):
    path, blob, counter = entry
    at = path.read_bytes().find(struct.pack("<d", blob["loss"]))
    if at < 0:
        at = path.read_bytes().find(struct.pack(">d", blob["loss"]))  # pickle stores floats big-endian
    assert at >= 0
    patch_bytes(path, at + 7, bytes([path.read_bytes()[at + 7] ^ 0x01]))
    load_expecting_rebuild(path, counter, reference, "checksum mismatch")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_file(entry, reference, damage):
    path, _, counter = entry
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[: len(raw) // 2], "garbage": b"\x00not a torch file" * 20,
                      "empty": b""}[damage])
    load_expecting_rebuild(path, counter, reference, "unreadable")


def test_record_without_checksum(entry, reference):
    """A version-1 style record (weights only), under this version's name: not trusted."""
    path, blob, counter = entry
    torch.save({"key_json": blob["key_json"], "state_dict": blob["state_dict"]}, path)
    load_expecting_rebuild(path, counter, reference, "no checksum")


# ------------------------------------------------------------------ damage with a matching checksum
def test_forged_nan(entry, reference):
    path, blob, counter = entry
    sd = {k: v.clone() for k, v in blob["state_dict"].items()}
    sd[WEIGHT][0, 0] = float("nan")
    forge(path, blob, sd)
    load_expecting_rebuild(path, counter, reference, f"{WEIGHT} has 1 non-finite")


def test_forged_huge_weight_is_beyond_adams_reach(entry, reference):
    path, blob, counter = entry
    sd = {k: v.clone() for k, v in blob["state_dict"].items()}
    sd[WEIGHT][1, 0] = 2.6e37
    forge(path, blob, sd)
    load_expecting_rebuild(path, counter, reference, "implausible.*Adam")


def test_forged_moderate_weight_is_beyond_adams_reach(entry, reference):
    # Reach: 10 × lr × steps = 2.0 here; 5 beyond the initial value cannot come from the warm-up.
    path, blob, counter = entry
    init = teacher().build_model(D_K).state_dict()
    sd = {k: v.clone() for k, v in blob["state_dict"].items()}
    sd["block.W_O"][2, 3] = init["block.W_O"][2, 3] + 5.0
    forge(path, blob, sd)
    load_expecting_rebuild(path, counter, reference, "block.W_O is implausible")


def test_forged_zero_weights(entry, reference):
    path, blob, counter = entry
    forge(path, blob, {k: torch.zeros_like(v) for k, v in blob["state_dict"].items()})
    load_expecting_rebuild(path, counter, reference, "implausible")


def test_forged_untrained_weights_fail_the_loss_check(entry, reference):
    """The initial weights are within any reach; only the recomputed loss shows they are not trained."""
    path, blob, counter = entry
    forge(path, blob, state(teacher().build_model(D_K)))
    load_expecting_rebuild(path, counter, reference, "check loss")


def test_forged_loss_fails_the_loss_check(entry, reference):
    path, blob, counter = entry
    forge(path, blob, loss=blob["loss"] * 1.01)
    load_expecting_rebuild(path, counter, reference, "check loss")


def test_a_file_written_to_pass_every_check_is_trusted(entry, reference):
    """What the checks are not (datasets/cache.py): a defence against a file made on purpose to pass them. Weights
    moved within Adam's reach, saved with their own check loss and checksum, load silently: the folder is trusted."""
    path, blob, counter = entry
    moved = {k: v + 1e-4 for k, v in blob["state_dict"].items()}
    ds = teacher()
    model = ds.build_model(D_K)
    model.load_state_dict(moved)
    forge(path, blob, moved, cache_mod.check_loss(model, ds, warmup_steps=SETTINGS["warmup_steps"],
                                                  batch_size=SETTINGS["batch_size"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert same_state(state(cached(path.parent)), moved)
    assert counter.calls == 0


def test_forged_wrong_shapes(entry, reference):
    path, blob, counter = entry
    forge(path, blob, {k: torch.zeros(1) for k in blob["state_dict"]})
    load_expecting_rebuild(path, counter, reference, "wrong type, shape or dtype")


# ------------------------------------------------------------------ the rules are not too strict
@pytest.mark.parametrize("name, d_e, d_s, lr", [("teacher", 8, 8, 0.1), ("icl-regression", 6, 11, 0.05),
                                                ("digits", 8, 16, 0.05), ("text", 16, 12, 0.05)])
def test_real_warm_ups_pass_every_check(tmp_path, name, d_e, d_s, lr):
    ds = datasets.make_dataset(name, d_e, d_s)
    kw = dict(warmup_steps=15, batch_size=8, lr=lr)
    first = state(datasets.trained_model(ds, 3, cache_dir=tmp_path, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        again = state(datasets.trained_model(datasets.make_dataset(name, d_e, d_s), 3, cache_dir=tmp_path, **kw))
    assert same_state(first, again)


def test_adam_reach_bound_holds_on_adversarial_gradients():
    """ADAM_REACH bounds Adam's per-step move: try gradients that grow, flip sign and spike."""
    gen = torch.Generator().manual_seed(0)
    lr, steps = 1e-2, 200
    w = torch.zeros(64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    worst = 0.0
    for t in range(steps):
        before = w.detach().clone()
        g = torch.randn(64, generator=gen) * 10.0 ** (t % 7 - 3)
        g[: 8] = 1e-8 if t < steps - 1 else 1e3  # tiny for long, then a spike: the largest Adam step
        w.grad = g
        opt.step()
        worst = max(worst, float((w.detach() - before).abs().max()) / lr)
    assert worst < cache_mod.ADAM_REACH
    assert float(w.detach().abs().max()) <= cache_mod.ADAM_REACH * lr * steps


# ------------------------------------------------------------------ a diverged warm-up
def test_diverged_warm_up_is_not_cached(tmp_path, monkeypatch):
    def diverge(model, ds, **kw):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))

    monkeypatch.setattr(cache_mod, "warm_up", diverge)
    with pytest.warns(CacheWarning, match="diverged.*not cached"):
        model = cached(tmp_path)
    assert torch.isnan(model.block.W_O).all() and list(tmp_path.iterdir()) == []
