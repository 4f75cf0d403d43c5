"""Tests for models.block.GrowableAttention against hand-written references."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from growbench.models.block import Captured, GrowableAttention

DT = torch.float64


def make(seed: int = 0, **kw) -> GrowableAttention:
    kw.setdefault("dtype", DT)
    return GrowableAttention(generator=torch.Generator().manual_seed(seed), **kw)


def inputs(b: int = 3, d_s: int = 5, d_e: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(
        b, d_s, d_e, generator=torch.Generator().manual_seed(seed), dtype=DT
    )


def rest(Y: torch.Tensor) -> torch.Tensor:
    # A nonlinear scalar loss so second derivatives are non-trivial.
    return (Y.tanh() ** 2).mean() + Y.sum(dim=1).sin().mean()


def ref_scores(
    block: GrowableAttention, X: torch.Tensor, i: int, c: float
) -> torch.Tensor:
    Xa = (
        torch.cat([X, torch.ones(*X.shape[:2], 1, dtype=X.dtype)], -1)
        if block.bias
        else X
    )
    h = block.heads[i]
    return c * torch.einsum("bsd,dk,btf,fk->bst", Xa, h.W_Q, Xa, h.W_K)


def ref_forward(
    block: GrowableAttention,
    X: torch.Tensor,
    cs: list[float],
    given: dict[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Block output written out: explicit exp/sum softmax, explicit mask."""
    given = given or {}
    b, d_s, _ = X.shape
    Xa = torch.cat([X, torch.ones(b, d_s, 1, dtype=X.dtype)], -1) if block.bias else X
    keep = torch.tril(torch.ones(d_s, d_s, dtype=torch.bool)) if block.causal else None
    Hs = []
    for i, h in enumerate(block.heads):
        S = given[i] if i in given else ref_scores(block, X, i, cs[i])
        E = torch.exp(S - S.detach().amax(-1, keepdim=True))
        if keep is not None:
            E = torch.where(keep, E, torch.zeros_like(E))
        A = E / E.sum(-1, keepdim=True)
        Hs.append(A @ (Xa @ h.W_V))
    Y = torch.cat(Hs, -1) @ block.W_O + X
    return Y + block.b_O if block.bias else Y


def perturb_out_bias(block: GrowableAttention) -> None:
    # b_O starts at zero; make it non-zero so a missing bias would be detected.
    if block.b_O is not None:
        with torch.no_grad():
            block.b_O.normal_(generator=torch.Generator().manual_seed(7))


# --------------------------------------------------------------------- forward
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_forward_matches_reference(bias: bool, causal: bool, n_heads: int) -> None:
    block = make(d_e=6, d_k=3, n_heads=n_heads, bias=bias, causal=causal)
    perturb_out_bias(block)
    X = inputs()
    cs = [1 / math.sqrt(3)] * n_heads
    torch.testing.assert_close(block(X), ref_forward(block, X, cs))
    assert block.d_in == 6 + bias
    assert block.heads[0].W_Q.shape == (6 + bias, 3)
    assert block.heads[0].W_V.shape == (6 + bias, 6 // n_heads)
    assert block.W_O.shape == (6, 6)


def test_forward_unequal_heads_and_dv() -> None:
    block = make(d_e=6, d_k=2, d_v=4, n_heads=2, causal=True)
    X = inputs()
    WQ, WK = block.factors(1)
    g = torch.Generator().manual_seed(3)
    block.install(
        1,
        torch.cat([WQ, torch.randn(6, 3, generator=g, dtype=DT)], 1),
        torch.cat([WK, torch.randn(6, 3, generator=g, dtype=DT)], 1),
    )
    assert (block.d_k(0), block.d_k(1)) == (2, 5)
    assert block.W_O.shape == (8, 6)
    torch.testing.assert_close(
        block(X), ref_forward(block, X, [1 / math.sqrt(2), 1 / math.sqrt(5)])
    )


def test_init_deterministic_and_dtype() -> None:
    a, b = make(seed=4, d_e=5, d_k=2, n_heads=2), make(seed=4, d_e=5, d_k=2, n_heads=2)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.dtype == DT
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    c = make(seed=5, d_e=5, d_k=2, n_heads=2)
    assert not torch.equal(a.heads[0].W_Q, c.heads[0].W_Q)
    assert (
        GrowableAttention(5, 2, generator=torch.Generator().manual_seed(0)).W_O.dtype
        == torch.float32
    )


@pytest.mark.parametrize("policy", ["rescale", "fixed", "learnable"])
def test_scale_policies(policy: str) -> None:
    block = make(d_e=4, d_k=4, scale_policy=policy)
    assert block.scale(0) == pytest.approx(0.5)
    expected = 1 / math.sqrt(7) if policy == "rescale" else 0.5
    assert block.new_scale(0, 3) == pytest.approx(expected)
    names = {n for n, _ in block.named_parameters()}
    assert ("heads.0.tau" in names) == (policy == "learnable")
    assert ("heads.0.c0" in dict(block.named_buffers())) == (policy == "fixed")


def test_learnable_tau_receives_gradient() -> None:
    block = make(d_e=4, d_k=2, scale_policy="learnable")
    rest(block(inputs(d_e=4))).backward()
    assert block.heads[0].tau.grad is not None and block.heads[0].tau.grad.abs() > 0


# --------------------------------------------------------------------- capture
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_captured_G_matches_autograd(causal: bool, bias: bool) -> None:
    block = make(d_e=6, d_k=3, n_heads=2, bias=bias, causal=causal)
    perturb_out_bias(block)
    X = inputs()
    with block.capture():
        loss = rest(block(X))
    loss.backward()
    cs = [block.scale(0), block.scale(1)]
    for i in range(2):
        cap = block.captured(i)
        assert isinstance(cap, Captured)
        torch.testing.assert_close(cap.X, X)
        assert cap.Xa.shape == (3, 5, 6 + bias)
        if bias:
            assert torch.equal(cap.Xa[..., -1], torch.ones(3, 5, dtype=DT))
        S_ref = ref_scores(block, X, i, cs[i]).detach()
        torch.testing.assert_close(cap.S, S_ref)  # un-masked: no -inf anywhere
        assert torch.isfinite(cap.S).all()
        # Independent G: the reference forward with S as a leaf.
        S_leaf = S_ref.clone().requires_grad_(True)
        (G_ref,) = torch.autograd.grad(
            rest(ref_forward(block, X, cs, {i: S_leaf})), S_leaf
        )
        torch.testing.assert_close(cap.G, G_ref)
        # And via forward_from_scores.
        S_leaf2 = S_ref.clone().requires_grad_(True)
        (G_ffs,) = torch.autograd.grad(
            rest(block.forward_from_scores(X, {i: S_leaf2})), S_leaf2
        )
        torch.testing.assert_close(cap.G, G_ffs)
        if causal:
            keep = torch.tril(torch.ones(5, 5, dtype=torch.bool))
            assert torch.equal(cap.mask, keep)
            assert torch.all(cap.G[:, ~keep] == 0)
            assert cap.G[:, keep].abs().sum() > 0
        else:
            assert cap.mask is None


def test_captured_errors_and_no_capture_outside_context() -> None:
    block = make(d_e=4, d_k=2)
    X = inputs(d_e=4)
    with pytest.raises(RuntimeError, match="nothing captured"):
        block.captured(0)
    with pytest.raises(RuntimeError, match="nothing captured"):
        block.loss_of_scores(rest)
    rest(block(X)).backward()  # outside capture: records nothing
    with pytest.raises(RuntimeError, match="nothing captured"):
        block.captured(0)
    with block.capture():
        loss = rest(block(X))
    with pytest.raises(RuntimeError, match="backward"):
        block.captured(0)
    loss.backward()
    assert block.captured(0).G.shape == (3, 5, 5)


# ---------------------------------------------------------------- loss_of_scores
@pytest.mark.parametrize("causal,d_s", [(False, 5), (True, 5), (False, 12)])
def test_loss_of_scores_reproduces_and_differentiates(causal: bool, d_s: int) -> None:
    # d_s = 12 makes (A V) W_O cheaper than A (V W_O): the closure's other branch.
    block = make(d_e=6, d_k=3, n_heads=2, bias=True, causal=causal)
    X = inputs(d_s=d_s)
    with block.capture():
        loss = rest(block(X))
    loss.backward()
    cap = block.captured(1)
    fn = block.loss_of_scores(rest, head=1)
    torch.testing.assert_close(fn(cap.S), loss.detach())
    with pytest.raises(ValueError, match="scores must have shape"):
        fn(cap.S[:, :-1])

    S = cap.S.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(S), S, create_graph=True)
    torch.testing.assert_close(g.detach(), cap.G)

    V = torch.randn(cap.S.shape, generator=torch.Generator().manual_seed(9), dtype=DT)
    g_func, hv = torch.func.jvp(torch.func.grad(fn), (cap.S,), (V,))
    torch.testing.assert_close(g_func, cap.G)
    (hv_ref,) = torch.autograd.grad((g * V).sum(), S)  # double backward as the oracle
    torch.testing.assert_close(hv, hv_ref)
    assert torch.isfinite(hv).all() and hv.abs().sum() > 0
    # Second-order check by central differences along V.
    eps = 1e-5
    fd = (fn(cap.S + eps * V) - 2 * fn(cap.S) + fn(cap.S - eps * V)) / eps**2
    assert (hv * V).sum().item() == pytest.approx(fd.item(), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_s", [5, 12])
def test_the_loss_given_some_samples_attention_is_the_loss_at_their_scores(causal: bool, d_s: int) -> None:
    # fn.attend on a slice of the samples and fn.from_attention: the loss where those samples have new scores and
    # the others their captured ones, against the reference forward with the scores written in.
    block = make(d_e=6, d_k=3, n_heads=2, bias=True, causal=causal)
    X = inputs(b=5, d_s=d_s)
    with block.capture():
        rest(block(X)).backward()
    cap = block.captured(1)
    fn = block.loss_of_scores(rest, head=1)
    odd = slice(1, None, 2)
    S_odd = cap.S[odd] + torch.randn(cap.S[odd].shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    out = fn.attend(cap.S, slice(None))
    out[odd] = fn.attend(S_odd, odd)
    S = cap.S.clone()
    S[odd] = S_odd
    cs = [block.scale(i) for i in range(2)]
    torch.testing.assert_close(fn.from_attention(out), rest(ref_forward(block, X, cs, {1: S})).detach())
    torch.testing.assert_close(fn.from_attention(fn.attend(S, slice(None))), fn(S))
    with pytest.raises(ValueError, match=r"scores must have shape \(2, "):
        fn.attend(cap.S, odd)


# --------------------------------------------------------------------- install
def preserving_factors(block: GrowableAttention, head: int, p: int, seed: int = 11):
    """Hand-built grown factors with c' W_Q' W_K'^T == c W_Q W_K^T."""
    WQ, WK = block.factors(head)
    c, c_new = block.scale(head), block.new_scale(head, p)
    r = math.sqrt(c / c_new)
    new_q = torch.randn(
        WQ.shape[0], p, generator=torch.Generator().manual_seed(seed), dtype=DT
    )
    return (
        torch.cat([WQ, new_q], 1) * r,
        torch.cat([WK, torch.zeros(WK.shape[0], p, dtype=DT)], 1) * r,
    )


@pytest.mark.parametrize("policy", ["rescale", "fixed", "learnable"])
def test_install_preserving_factors_keeps_output(policy: str) -> None:
    block = make(d_e=6, d_k=3, n_heads=2, bias=True, causal=True, scale_policy=policy)
    perturb_out_bias(block)
    X = inputs()
    Y0 = block(X).detach()
    c_new = block.new_scale(1, 4)
    WQ0 = block.heads[0].W_Q.detach().clone()
    block.install(1, *preserving_factors(block, 1, 4))
    assert (block.d_k(0), block.d_k(1)) == (3, 7)
    assert block.scale(1) == pytest.approx(c_new)
    if policy == "rescale":
        assert block.scale(1) == pytest.approx(1 / math.sqrt(7))
    else:
        assert block.scale(1) == pytest.approx(1 / math.sqrt(3))
    assert torch.equal(block.heads[0].W_Q, WQ0)
    torch.testing.assert_close(block(X), Y0)
    # The new factors are trainable parameters of the block.
    ids = {id(q) for q in block.parameters()}
    assert id(block.heads[1].W_Q) in ids and id(block.heads[1].W_K) in ids
    rest(block(X)).backward()
    assert block.heads[1].W_K.grad.shape == (7, 7)


def test_install_converts_dtype_and_copies() -> None:
    block = make(d_e=4, d_k=2)
    WQ, WK = block.factors(0)
    WQ32 = WQ.float()
    block.install(0, WQ32, WK)
    assert block.heads[0].W_Q.dtype == DT
    WK.add_(1.0)  # caller's tensor must not alias the installed parameter
    assert not torch.equal(block.heads[0].W_K, WK)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="rescale.*fixed.*learnable"):
        make(d_e=4, d_k=2, scale_policy="sqrt")
    block = make(d_e=4, d_k=2, bias=True)
    WQ, WK = block.factors(0)
    with pytest.raises(ValueError, match="d_in"):
        block.install(0, WQ[:-1], WK[:-1])
    bad = WQ.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        block.install(0, bad, WK)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        block.install(0, WQ, bad)
    with pytest.raises(ValueError, match="shrink"):
        block.install(0, WQ[:, :1], WK[:, :1])
    with pytest.raises(ValueError, match="differ"):
        block.install(0, torch.cat([WQ, WQ], 1), WK)
    with pytest.raises(ValueError, match="2-D"):
        block.install(0, WQ[None], WK[None])
    with pytest.raises(ValueError, match="head"):
        block.install(1, WQ, WK)
    with pytest.raises(ValueError, match="p must be"):
        block.new_scale(0, -1)
    with pytest.raises(ValueError, match="X must have shape"):
        block(torch.zeros(2, 3, 5, dtype=DT))
    # The block is untouched by the failed installs.
    torch.testing.assert_close(block.factors(0)[0], WQ)


# ------------------------------------------------------------------------ grow
class FakeStrategy:
    """Records its arguments and returns function-preserving grown factors."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def grow(
        self,
        W_Q,
        W_K,
        Xa,
        G,
        *,
        p,
        loss_of_scores,
        scale,
        new_scale,
        mask=None,
        stats=None,
        scores=None,
    ):
        self.calls.append(
            {
                "scores": scores,
                "W_Q": W_Q,
                "W_K": W_K,
                "Xa": Xa,
                "G": G,
                "p": p,
                "loss_of_scores": loss_of_scores,
                "scale": scale,
                "new_scale": new_scale,
                "mask": mask,
                "stats": stats,
            }
        )
        r = math.sqrt(scale / new_scale)
        Q = torch.cat([W_Q, torch.ones(W_Q.shape[0], p, dtype=W_Q.dtype)], 1) * r
        K = torch.cat([W_K, torch.zeros(W_K.shape[0], p, dtype=W_K.dtype)], 1) * r
        return SimpleNamespace(W_Q=Q, W_K=K, tag="fake")


@pytest.mark.parametrize("policy", ["rescale", "fixed", "learnable"])
def test_grow_forwards_arguments_and_installs(policy: str) -> None:
    block = make(d_e=6, d_k=3, n_heads=2, bias=True, causal=True, scale_policy=policy)
    X = inputs()
    with block.capture():
        loss = rest(block(X))
    loss.backward()
    Y0 = block(X).detach()
    cap = block.captured(1)
    WQ, WK = block.factors(1)
    scale, new_scale = block.scale(1), block.new_scale(1, 2)
    strat, stats = FakeStrategy(), object()

    r = block.grow(1, strat, 2, rest, stats=stats)

    (call,) = strat.calls
    assert r.tag == "fake"
    assert call["p"] == 2 and call["stats"] is stats
    assert call["scale"] == pytest.approx(scale) and call["new_scale"] == pytest.approx(
        new_scale
    )
    torch.testing.assert_close(call["W_Q"], WQ)
    torch.testing.assert_close(call["W_K"], WK)
    torch.testing.assert_close(call["Xa"], cap.Xa)
    torch.testing.assert_close(call["G"], cap.G)
    assert torch.equal(call["mask"], torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    torch.testing.assert_close(call["loss_of_scores"](cap.S), loss.detach())
    assert torch.equal(call["scores"], cap.S)  # the forward's scores, not formed again
    assert (block.d_k(0), block.d_k(1)) == (3, 5)
    torch.testing.assert_close(block.factors(1)[0], r.W_Q)
    torch.testing.assert_close(block(X), Y0)


def test_grow_takes_a_strategy_without_the_scores_argument() -> None:
    # A strategy written before grow(..., scores=) still grows the block: the captured scores go only to a grow
    # that takes them.
    block = make(d_e=6, d_k=3, n_heads=2, bias=True, causal=True)
    X = inputs()
    with block.capture():
        rest(block(X)).backward()
    calls = []

    class Older:
        def grow(self, W_Q, W_K, Xa, G, *, p, loss_of_scores, scale, new_scale, mask=None, stats=None):
            calls.append(p)
            return FakeStrategy().grow(W_Q, W_K, Xa, G, p=p, loss_of_scores=loss_of_scores, scale=scale,
                                       new_scale=new_scale, mask=mask, stats=stats)

    block.grow(1, Older(), 2, rest)
    assert calls == [2] and block.d_k(1) == 5


def test_grow_rejects_wrong_width() -> None:
    block = make(d_e=4, d_k=2)
    with block.capture():
        rest(block(inputs(d_e=4))).backward()

    class Wrong(FakeStrategy):
        def grow(self, *a, p, **kw):
            return super().grow(*a, p=p + 1, **kw)

    with pytest.raises(ValueError, match="d_k \\+ p"):
        block.grow(0, Wrong(), 1, rest)
    assert block.d_k(0) == 2


def test_stale_backward_is_ignored_and_scores_not_mutated() -> None:
    block = make(d_e=4, d_k=2, causal=True)
    X1, X2 = inputs(d_e=4, seed=1), inputs(d_e=4, seed=2)
    with block.capture():
        loss1 = rest(block(X1))
        loss2 = rest(block(X2))
    loss1.backward()  # belongs to the replaced capture
    with pytest.raises(RuntimeError, match="backward"):
        block.captured(0)
    loss2.backward()
    cap = block.captured(0)
    torch.testing.assert_close(cap.X, X2)
    # forward_from_scores neither mutates the given S nor re-captures.
    S = cap.S.clone()
    with block.capture():
        block.forward_from_scores(X1, {0: S})
    assert torch.equal(S, cap.S)
    assert block.captured(0).X is cap.X
