"""Degenerate numerical input to the strategies (issue 29, "Tracebacks for input a user can give").

Every spec, baselines and ``default`` included, meets ``X = 0``, ``X ≈ 1e20`` (its squares overflow
float32), ``X ≈ 1e-42`` (subnormal in float32) and ``G = 0`` with either a step or the zero step with
its reason recorded: never ``torch.linalg.LinAlgError``, never a NaN or Inf weight. 1920 growth specs
are too many to grow four times each here, so the specs are a covering set drawn from the registry:
every pair of values of two axes (averaging, inverse, truncation, metric, line search, its flags,
method) is in at least one of them, so each value meets each input at least once.

Tensors on the meta device, of an integer, complex or float8 dtype, a mask on another device, a
loss that is complex or has no derivative: one ``ValueError`` naming the argument before any work,
or (a loss without derivatives under the Newton search) the search the loss allows, recorded.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import anisotropic_X, factors, gen

from growbench import strategies
from growbench.strategies._checks import check_mask

B, D_S, D_E, D_K, P = 4, 8, 6, 2, 2
C = 1 / math.sqrt(D_K)
#: ``X · 2^66 ≈ X · 7e19``, factors · 2^-66: the same scores, bit for bit (powers of two), squares beyond float32.
BIG = 2.0**66
#: ``X · 1e-42``: subnormal in float32 (3 significant digits); a step of one logit needs factors beyond float32.
TINY = 1e-42


def covering_specs() -> list[str]:
    """Growth specs of the registry's grid covering every pair of values of two axes (greedy, deterministic)."""
    grid = [s for s in strategies.Spec.grid() if not s.is_baseline]

    def pairs(spec: strategies.Spec) -> frozenset:
        return frozenset(itertools.combinations([(a, getattr(spec, a)) for a in strategies.Spec.AXES], 2))

    candidates = [(str(s), pairs(s)) for s in grid]
    todo = set().union(*(p for _, p in candidates))
    chosen = []
    while todo:
        spec, covered = max(candidates, key=lambda c: len(c[1] & todo))
        chosen.append(spec)
        todo -= covered
    return chosen


COVER = covering_specs()
SPECS = [*COVER, *strategies.baseline_names(), "default"]


def attention_loss(V: torch.Tensor, T: torch.Tensor):
    """Softmax attention over values ``V``, MSE to ``T``, in ``V``'s dtype (whatever the scores' dtype)."""

    def loss(S: torch.Tensor) -> torch.Tensor:
        return ((torch.softmax(S.to(V.dtype), dim=-1) @ V - T) ** 2).mean()

    return loss


def problem() -> dict:
    """A float32 problem: inputs, factors, the loss and ``G`` at the current scores."""
    X = anisotropic_X(B, D_S, D_E, cond=10.0, seed=0).float()
    W_Q, W_K = (w.float() for w in factors(D_E, D_K, seed=1))
    g = gen(2)
    V, T = torch.randn(B, D_S, 3, generator=g), torch.randn(B, D_S, 3, generator=g)
    loss = attention_loss(V, T)
    S = (C * (X @ W_Q) @ (X @ W_K).mT).requires_grad_(True)
    (G,) = torch.autograd.grad(loss(S), S)
    return {"X": X, "G": G, "W_Q": W_Q, "W_K": W_K, "loss": loss}


PR = problem()
#: The degenerate inputs: name -> the problem's entries it replaces.
DEGENERATE = {
    "X=0": {"X": PR["X"] * 0},
    "X*1e20": {"X": PR["X"] * BIG, "W_Q": PR["W_Q"] / BIG, "W_K": PR["W_K"] / BIG},
    "X*1e-42": {"X": PR["X"] * TINY},
    "G=0": {"G": PR["G"] * 0},
}


class Counted:
    """A loss that counts its calls."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, S: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fn(S)


def grow(spec: str, pr: dict, loss=None, **kw) -> strategies.GrowthResult:
    return strategies.make(spec).grow(pr["W_Q"], pr["W_K"], pr["X"], pr["G"], p=P,
                                      loss_of_scores=pr["loss"] if loss is None else loss, scale=C, **kw)


def refuses(fn, *names: str) -> ValueError:
    """``fn()`` raises one ``ValueError`` of one line naming one of ``names``; anything else fails the test."""
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert any(n in message for n in names), (names, message)
    return info.value


_PLAIN: dict[str, strategies.GrowthResult] = {}


def plain(spec: str) -> strategies.GrowthResult:
    """The growth of the undegenerate problem (cached: several tests compare with it)."""
    if spec not in _PLAIN:
        _PLAIN[spec] = grow(spec, PR)
    return _PLAIN[spec]


def product(W_Q: torch.Tensor, W_K: torch.Tensor, c: float = C) -> torch.Tensor:
    """``c W_Q W_Kᵀ`` in float64: the block's function (scores are ``X Z Xᵀ``)."""
    return c * W_Q.double() @ W_K.double().T


def assert_sound(r: strategies.GrowthResult, pr: dict) -> None:
    """Finite weights of the input's dtype and shape, a finite loss; λ = 0 keeps the block's function (but for
    ``random``, whose new columns change it by design)."""
    for W in (r.W_Q, r.W_K, r.dZ):
        assert W.dtype == pr["X"].dtype and torch.isfinite(W).all()
    assert r.W_Q.shape == r.W_K.shape == (D_E, D_K + P)
    assert r.loss_after_finite and math.isfinite(r.loss_before)
    if r.lam == 0 and r.spec != "random":
        Z0 = product(pr["W_Q"], pr["W_K"])
        err = float((product(r.W_Q, r.W_K) - Z0).abs().max())
        assert err <= 1e-5 * float(Z0.abs().max()), (err, r.fallback)


def new_reasons(r: strategies.GrowthResult, spec: str) -> set[str]:
    """Fallbacks of ``r`` that the plain problem's growth does not have (``default`` always records its choice)."""
    return set(r.fallback) - set(plain(spec).fallback)


# ------------------------------------------------------------------ the covering set itself
def test_covering_set_meets_every_value_of_every_axis():
    """Each registered component, flag and method is in the covering set (pairs of them, even)."""
    for axis in strategies.Spec.AXES:
        values = {getattr(s, axis) for s in strategies.Spec.grid() if not s.is_baseline}
        assert values == {getattr(strategies.Spec.parse(s), axis) for s in COVER}, axis
    assert len(COVER) < 40


# ------------------------------------------------------------------ X = 0, G = 0: the zero step, with its reason
@pytest.mark.parametrize("case", ["X=0", "G=0"])
@pytest.mark.parametrize("spec", SPECS)
def test_nothing_reachable_gives_the_zero_step_with_its_reason(spec, case):
    """``X = 0`` or ``G = 0``: no change of ``Z`` can decrease the loss. Every growth spec keeps the block's
    function and says why (the baselines draw their columns as always, and keep the loss)."""
    pr = {**PR, **DEGENERATE[case]}
    r = grow(spec, pr)
    assert_sound(r, pr)
    if spec != "random":
        assert r.loss_after == pytest.approx(r.loss_before, rel=1e-6)
    if spec not in strategies.baseline_names():
        assert r.lam == 0.0
        assert new_reasons(r, spec), r.fallback


# ------------------------------------------------------------------ X whose squares overflow float32
@pytest.mark.parametrize("spec", SPECS)
def test_huge_X_grows_as_its_exact_float64_problem(spec):
    """``X · 2^66`` with factors ``· 2^-66`` (the same scores): ``E[XᵀX]`` overflows float32, which made
    ``eigh`` raise. Computed in float64, the growth is that of the same numbers in float64: the same λ and
    loss after, new factors back in float32."""
    pr = {**PR, **DEGENERATE["X*1e20"]}
    r = grow(spec, pr)
    assert_sound(r, pr)
    wide = {**PR, **{k: PR[k].double() for k in ("X", "G", "W_Q", "W_K")}}
    ref = grow(spec, wide)
    assert r.lam == pytest.approx(ref.lam, rel=1e-3, abs=1e-9)
    assert r.loss_after == pytest.approx(ref.loss_after, rel=1e-4)
    # The new factors are the reference's scaled back by 2^-66 (rounded to float32).
    Z_ref = product(ref.W_Q, ref.W_K)
    assert float((product(r.W_Q, r.W_K) * BIG**2 - Z_ref).abs().max()) <= 1e-4 * float(Z_ref.abs().max())


@pytest.mark.parametrize("spec", [*COVER[:4], *strategies.baseline_names(), "default"])
def test_huge_X_with_scores_beyond_float32_is_refused_in_one_line(spec):
    """``X · 2^66`` with the factors as they were: the current scores (~1e40) are not float32 numbers, so no
    loss can be measured. One ValueError naming the inputs, not a NaN loss."""
    pr = {**PR, "X": PR["X"] * BIG}
    refuses(lambda: grow(spec, pr), "X")


@pytest.mark.parametrize("spec", ["formula2", "joint", "zero", "default"])
def test_X_beyond_float64_is_refused_before_any_work(spec):
    """float64 ``X · 1e250``: its squares overflow even float64. One ValueError naming X; the loss never runs."""
    pr = {**PR, **{k: PR[k].double() for k in ("X", "G", "W_Q", "W_K")}}
    pr["X"] = pr["X"] * 1e250
    loss = Counted(PR["loss"])
    refuses(lambda: grow(spec, pr, loss), "X")
    assert loss.calls == 0


# ------------------------------------------------------------------ subnormal X
@pytest.mark.parametrize("spec", SPECS)
def test_subnormal_X_keeps_the_function(spec):
    """``X · 1e-42`` (subnormal in float32): a step of one logit would need factors of ~1e42, beyond
    float32. No step is returned (λ = 0, the function kept), never an Inf weight or a LinAlgError."""
    pr = {**PR, **DEGENERATE["X*1e-42"]}
    r = grow(spec, pr)
    assert_sound(r, pr)
    if spec not in strategies.baseline_names():
        assert r.lam == 0.0, r.fallback


@pytest.mark.parametrize("case", list(DEGENERATE))
@pytest.mark.parametrize("spec", sorted({s.split("/")[0] + "/" + s.split("/")[1] for s in COVER}))
def test_direction_of_degenerate_input_is_finite(spec, case):
    """``direction`` of every averaging × inverse on each input is finite (zero where nothing is reachable)."""
    pr = {**PR, **DEGENERATE[case]}
    P_dir = strategies.make(f"{spec}/full/normal:grid").direction(pr["X"], pr["G"])
    assert P_dir.shape == (D_E, D_E) and torch.isfinite(P_dir).all()
    if case in ("X=0", "G=0"):
        assert not P_dir.any()


# ------------------------------------------------------------------ statistics of batches of far different sizes
def test_a_refused_batch_leaves_the_statistics_as_they_were():
    """Per-sample statistics begun in float32 cannot factorise a batch ``· 1e25`` (its Gram matrices overflow):
    one ValueError naming X, and every sum as before; the statistics still grow as if it never came."""
    s = strategies.make("per-sample/solve/full/normal:grid")
    st = s.new_statistics().update(PR["X"], PR["G"])
    before = {k: v.clone() for k, v in vars(st).items() if torch.is_tensor(v)}
    refuses(lambda: st.update(PR["X"] * 1e25, PR["G"]), "X")
    assert st.n == B and st.n_batches == 1
    assert before and all(torch.equal(getattr(st, k), v) for k, v in before.items())
    r = grow("per-sample/solve/full/normal:grid", PR, stats=st)
    assert r.lam == plain("per-sample/solve/full/normal:grid").lam


def test_a_batch_of_another_length_leaves_joint_statistics_as_they_were():
    """joint refuses a batch of another ``d_s``; the Gram sums it had already added are not left behind."""
    st = strategies.make("joint").new_statistics().update(PR["X"], PR["G"])
    sum_A = st.sum_A.clone()
    refuses(lambda: st.update(PR["X"][:, :5], PR["G"][:, :5, :5]), "d_s")
    assert torch.equal(st.sum_A, sum_A) and st.n == B and len(st.Xs) == 1


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("per-sample")])
def test_statistics_that_overflow_give_a_sound_growth(spec):
    """float32 statistics with a batch ``· 1e25`` among others: their sums overflow. A growth from them keeps
    to finite weights (the zero step, recorded, where the factorisation fails), never a LinAlgError."""
    s = strategies.make(spec)
    st = s.new_statistics().update(PR["X"], PR["G"]).update(PR["X"] * 1e25, PR["G"]).update(PR["X"], PR["G"])
    r = grow(spec, PR, stats=st)  # PR["X"] is the last batch: a +holdout spec takes it out
    assert_sound(r, PR)


# ------------------------------------------------------------------ wrong device or dtype: one ValueError naming it
ARGS = ("X", "G", "W_Q", "W_K")


def _with(name: str, value: torch.Tensor) -> dict:
    return {**PR, name: value}


@pytest.mark.parametrize("spec", ["default", "formula1", "joint", "zero"])
@pytest.mark.parametrize("name", [*ARGS, "mask"])
def test_meta_tensors_are_refused_before_any_work(name, spec):
    """A tensor on the meta device (a shape without data) cannot be read: one ValueError naming it, and the
    loss never runs."""
    mask = torch.ones(D_S, D_S, dtype=torch.bool).tril()
    pr = _with(name, PR[name].to("meta")) if name != "mask" else PR
    loss = Counted(PR["loss"])
    refuses(lambda: grow(spec, pr, loss, mask=mask.to("meta") if name == "mask" else mask), name)
    assert loss.calls == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64, torch.float8_e4m3fn, torch.bool, torch.float64])
@pytest.mark.parametrize("name", ARGS)
def test_tensors_of_a_wrong_dtype_are_refused(name, dtype):
    """Integer, complex, float8 or bool inputs, or one float64 among float32 ones: one ValueError naming the
    argument, before the loss runs."""
    loss = Counted(PR["loss"])
    refuses(lambda: grow("default", _with(name, PR[name].to(dtype)), loss), name)
    assert loss.calls == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_mask_that_is_not_bool_is_refused(dtype):
    mask = torch.ones(D_S, D_S, dtype=dtype).tril()
    refuses(lambda: grow("default", PR, mask=mask), "mask")


def test_a_mask_on_another_device_is_refused():
    """The mask is checked against X's device (here a CUDA X, checked without a GPU): not moved silently."""
    mask = torch.ones(D_S, D_S, dtype=torch.bool).tril()
    refuses(lambda: check_mask(mask, B, D_S, torch.device("cuda", 0)), "mask")
    assert check_mask(mask, B, D_S, torch.device("cpu")) is mask


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", [*ARGS, "mask"])
def test_one_argument_on_another_device_is_refused(name):
    """X on the GPU and one other argument on the CPU: one ValueError naming the pair, before the loss runs."""
    cuda = {k: PR[k].cuda() for k in ARGS}
    mask = torch.ones(D_S, D_S, dtype=torch.bool, device="cuda").tril()
    if name == "mask":
        mask = mask.cpu()
    else:
        cuda[name] = cuda[name].cpu()
    loss = Counted(lambda S: PR["loss"](S.cpu()))
    refuses(lambda: grow("default", {**PR, **cuda}, loss, mask=mask), name)
    assert loss.calls == 0


# ------------------------------------------------------------------ losses a line search cannot use
NEWTON = sorted({str(strategies.Spec.parse(s).replace(method="newton")) for s in COVER})


def _holds_out(spec: str) -> bool:
    return strategies.make(spec).holds_out


@pytest.mark.parametrize("detach", [lambda v: v.detach(), lambda v: torch.tensor(float(v.detach()))],
                         ids=["detached", "rewrapped"])
@pytest.mark.parametrize("spec", NEWTON)
def test_newton_with_a_loss_without_derivatives_searches_without_them(spec, detach):
    """A loss outside autograd's graph (``.detach()``, a float wrapped back into a tensor) has no derivative
    along λ: the Newton search says so and takes the bounded search's λ, instead of autograd's traceback."""
    pr = {**PR, "loss": lambda S: detach(PR["loss"](S))}
    r = grow(spec, pr)
    assert_sound(r, pr)
    assert any(m.startswith("newton:") for m in new_reasons(r, spec)), r.fallback
    bounded = grow(str(strategies.Spec.parse(spec).replace(method="bounded")), PR)
    assert r.lam == pytest.approx(bounded.lam, rel=1e-9, abs=1e-12)
    assert r.loss_after <= r.loss_before or _holds_out(spec)


@pytest.mark.parametrize("spec", [NEWTON[0], "formula1", "zero", "default"])
@pytest.mark.parametrize("kind", ["complex", "meta"])
def test_a_loss_that_is_not_a_real_number_is_refused(spec, kind):
    """A complex loss, or one on the meta device: one ValueError naming ``loss_of_scores`` at its first call."""
    make = {"complex": lambda v: v.to(torch.complex64), "meta": lambda v: torch.zeros((), device="meta")}[kind]
    loss = Counted(lambda S: make(PR["loss"](S)))
    refuses(lambda: grow(spec, PR, loss), "loss_of_scores")
    assert loss.calls == 1


def test_no_linalg_error_escapes_a_growth_whose_factorisation_fails(monkeypatch):
    """Whatever a factorisation raises inside the step (an eigensolver that does not converge), the growth keeps
    the function and records why."""

    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge\n(error code: 5).")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    spec = "gram/pinv/full+metric/fast:newton"
    r = grow(spec, PR)
    assert_sound(r, PR)
    assert r.lam == 0 and any("LinAlgError" in m for m in r.fallback), r.fallback
    refuses(lambda: strategies.make(spec).direction(PR["X"], PR["G"]), "LinAlgError")

