"""A single self-attention layer whose per-head query/key width d_k can grow.

Notation follows docs/mathematics.md §1: ``S_i = c_i (Xa W_Q_i)(Xa W_K_i)^T``,
``A_i = softmax_row(S_i)``, ``Y = concat_i(A_i Xa W_V_i) W_O (+ b_O) + X``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

SCALE_POLICIES = ("rescale", "fixed", "learnable")
#: Bytes of scores :meth:`HeadLoss.attend_factors` forms at a time on the CPU: a core's L2 cache on current x86
#: server CPUs (1-2 MiB). At the reference sizes (d_s = 128, float32) 16 samples: of groups of 4 to 64 samples,
#: the fastest or within 5% of it (a trial's products and softmax over 128 and 256 samples, CPU, one thread).
SCORE_CHUNK_BYTES = 2**20


@dataclass(frozen=True)
class Captured:
    """What one head saw in the last captured forward/backward pass.

    Attributes
    ----------
    X : Tensor, (b, d_s, d_e)
        Raw block input.
    Xa : Tensor, (b, d_s, d_in)
        Input as the projections see it (``[X | 1]`` when ``bias``).
    S : Tensor, (b, d_s, d_s)
        Un-masked scores ``c Q K^T``.
    G : Tensor, (b, d_s, d_s)
        ``dL/dS``; exactly zero at masked entries.
    mask : Tensor or None, (d_s, d_s) bool
        True where attended (lower triangle incl. diagonal); None if not causal.
    """

    X: Tensor
    Xa: Tensor
    S: Tensor
    G: Tensor
    mask: Tensor | None


def check_new_factors(W_Q: Tensor, W_K: Tensor, d_in: int, d_k: int) -> None:
    """Refuse factors that cannot replace a head of input width ``d_in`` and query/key width ``d_k``.

    Raises
    ------
    ValueError
        Not 2-D, wrong ``d_in``, fewer than ``d_k`` columns (shrinking), non-finite
        entries, or ``W_Q`` and ``W_K`` of different shapes.
    """
    for name, W in (("W_Q", W_Q), ("W_K", W_K)):
        if not isinstance(W, Tensor) or W.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor (d_in, d_k')")
        if W.shape[0] != d_in:
            raise ValueError(f"{name} has d_in={W.shape[0]}, block expects {d_in}")
        if W.shape[1] < d_k:
            raise ValueError(f"{name} has d_k'={W.shape[1]} < current d_k={d_k}: shrinking is not supported")
        if not torch.isfinite(W).all():
            raise ValueError(f"{name} contains non-finite values")
    if W_Q.shape != W_K.shape:
        raise ValueError(f"W_Q {tuple(W_Q.shape)} and W_K {tuple(W_K.shape)} differ in shape")


def install_factors(holder: Any, W_Q: Tensor, W_K: Tensor, d_in: int, d_k: int) -> None:
    """Replace ``holder.W_Q`` and ``holder.W_K`` by copies of ``(W_Q, W_K)`` (d_in, d_k'), cast to the current
    factors' dtype and device, after :func:`check_new_factors` (which leaves ``holder`` unchanged on refusal)."""
    check_new_factors(W_Q, W_K, d_in, d_k)
    like = holder.W_Q
    holder.W_Q = nn.Parameter(W_Q.detach().to(dtype=like.dtype, device=like.device).clone())
    holder.W_K = nn.Parameter(W_K.detach().to(dtype=like.dtype, device=like.device).clone())


class CaptureSwitch:
    """The ``capture()`` context of a growth site: within it, a forward records ``X``, ``Xa``, ``S``
    and hooks ``G = ∂L/∂S`` (the forward reads ``self._capturing``)."""

    _capturing: bool = False

    @contextmanager
    def capture(self) -> Iterator[CaptureSwitch]:
        """Within this context, forwards are recorded; ``captured()`` reads the last one after a backward."""
        self._capturing = True
        try:
            yield self
        finally:
            self._capturing = False


class HookedHeads:
    """What the hooked heads of a real model share, whatever its architecture (BERT's
    :class:`~models.pretrained_heads.PretrainedHeads`, Llama's :class:`~models.decoder_heads.DecoderHeads`).

    A site provides ``heads`` (modules with ``layer``, ``head``, ``W_Q`` and ``W_K`` (d_in, d_k)),
    ``n_heads``, ``d_in``, the pretrained score scale ``_c``, and the capture state ``_cap``
    (head -> captured ``S``, ``G``) and ``_cap_id``.
    """

    def _record(self, i: int, S: Tensor) -> None:
        self._cap_id += 1
        self._cap[i] = {"S": S.detach()}
        if S.requires_grad:
            cap_id = self._cap_id

            def hook(g: Tensor) -> None:
                if self._cap.get(i, {}).get("id") == cap_id:  # an older graph's backward must not pair with newer X
                    self._cap[i]["G"] = g.detach()

            self._cap[i]["id"] = cap_id
            S.register_hook(hook)

    def _site(self, head: int) -> nn.Module:
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head {head} out of range; valid heads: 0..{self.n_heads - 1}")
        return self.heads[head]

    def where(self, head: int) -> tuple[int, int]:
        """``(layer, head)`` of the model that head index ``head`` stands for."""
        site = self._site(head)
        return site.layer, site.head

    def growth_order(self) -> list[int]:
        """Head indices, deepest layer first.

        Growing a layer changes the input of every later layer, never of an earlier one:
        grown deepest first, each head's captured input is still its input when its turn
        comes, and its line search (``loss_of_scores``) sees every head grown before it.
        """
        return sorted(range(self.n_heads), key=lambda i: (-self.heads[i].layer, self.heads[i].head))

    def d_k(self, head: int = 0) -> int:
        """Current query/key width of ``head`` (the grown factors': a decoder head's rotation-free width)."""
        return self._site(head).W_Q.shape[1]

    def scale(self, head: int = 0) -> float:
        """Score scale ``c``: the pretrained ``d_head^-1/2``, kept when the head grows."""
        self._site(head)
        return self._c

    def factors(self, head: int = 0) -> tuple[Tensor, Tensor]:
        """Detached clones of ``head``'s ``(W_Q, W_K)``, each (d_in, d_k)."""
        site = self._site(head)
        return site.W_Q.detach().clone(), site.W_K.detach().clone()

    def install(self, head: int, W_Q: Tensor, W_K: Tensor) -> None:
        """Replace ``head``'s factors by ``(W_Q, W_K)``, each (d_in, d_k') with ``d_k' >= d_k``.

        Raises
        ------
        ValueError
            Wrong shape, shrinking, or non-finite entries; the site is left unchanged.
        """
        install_factors(self._site(head), W_Q, W_K, self.d_in, self.d_k(head))


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts the keyword argument ``name`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: pass only what every strategy takes
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class GrowsHeads:
    """``grow``, shared by every growth site: a head grown from the last captured pass, its new factors installed.

    A site provides ``captured``, ``factors``, ``loss_of_scores``, ``scale``, ``new_scale``, ``d_k`` and
    ``install`` (the interface of :class:`GrowableAttention`).
    """

    def grow(self, head: int, strategy: Any, p: int, rest: Callable[[Tensor], Tensor], stats: Any = None,
             loss_before: float | Tensor | None = None) -> Any:
        """Grow ``head`` by ``p`` with ``strategy`` from the last captured pass.

        Parameters
        ----------
        head : int
            Head to grow; needs a captured forward and backward.
        strategy : object
            Has ``grow(W_Q, W_K, Xa, G, *, p, loss_of_scores, scale, new_scale,
            mask, stats)`` (and ``scores``, the captured ones, where it takes them)
            returning an object with ``W_Q``, ``W_K`` of shape (d_in, d_k + p).
        p : int
            Number of query/key columns to add.
        rest : Callable[[Tensor], Tensor]
            Maps the site's output (a block's ``Y`` (b, d_s, d_e); a pretrained model's last hidden
            state) to the scalar loss of the captured batch (see ``loss_of_scores``).
        stats : object, optional
            Passed through to the strategy (e.g. accumulated statistics).
        loss_before : float or Tensor, optional
            ``rest``'s loss of the captured batch as the model stands (the captured forward's, where ``rest`` is
            that loss; the last growth's ``loss_after``, where it grew another head on the same batch): passed
            through to a strategy that takes it, which then does not evaluate it.

        Returns
        -------
        object
            The strategy's result, after its factors have been installed.
        """
        cap = self.captured(head)
        W_Q, W_K = self.factors(head)
        # The captured scores too, to a strategy that takes them: the forward made them, and a growth need not
        # form them again.
        given = {"scores": cap.S} if _takes(strategy.grow, "scores") else {}
        if loss_before is not None:
            if not _takes(strategy.grow, "loss_before"):
                raise ValueError(f"loss_before: {type(strategy).__name__}.grow does not take it")
            given["loss_before"] = loss_before
        r = strategy.grow(W_Q, W_K, cap.Xa, cap.G, p=p, loss_of_scores=self.loss_of_scores(rest, head),
                          scale=self.scale(head), new_scale=self.new_scale(head, p), mask=cap.mask, stats=stats,
                          **given)
        d_new = self.d_k(head) + p
        if r.W_Q.shape[-1] != d_new or r.W_K.shape[-1] != d_new:
            raise ValueError(f"strategy returned d_k'={r.W_Q.shape[-1]}/{r.W_K.shape[-1]}, expected d_k + p = {d_new}")
        self.install(head, r.W_Q, r.W_K)
        return r


class Head(nn.Module):
    """Parameters of one head: ``W_Q``, ``W_K`` (d_in, d_k), ``W_V`` (d_in, d_v)."""

    def __init__(self, W_Q: Tensor, W_K: Tensor, W_V: Tensor, policy: str) -> None:
        super().__init__()
        self.W_Q = nn.Parameter(W_Q)
        self.W_K = nn.Parameter(W_K)
        self.W_V = nn.Parameter(W_V)
        c0 = torch.tensor(
            1.0 / math.sqrt(W_Q.shape[1]), dtype=W_Q.dtype, device=W_Q.device
        )
        if policy == "learnable":
            self.tau = nn.Parameter(c0)
        elif policy == "fixed":
            # A buffer so .to(dtype/device) and state_dict carry it.
            self.register_buffer("c0", c0)


class HeadLoss:
    """The loss as a function of one head's scores on a captured batch, everything else held as it was.

    ``loss(S)`` is ``rest(base + softmax(S) V W_O)`` (the mask applied to ``S``); the two stages are offered apart
    as well (the protocol :class:`growbench.strategies.scores_loss.AttentionSplit`), so that a growth whose line
    search moves some samples recomputes the softmax and the product for those alone.

    Parameters
    ----------
    rest : Callable[[Tensor], Tensor]
        Maps the block output (b, d_s, d_e) to a scalar loss.
    base : Tensor
        The block output without this head's term, (b, d_s, d_e).
    V : Tensor
        This head's values, (b, d_s, d_v), or with ``W_O`` folded in, (b, d_s, d_e).
    W_O : Tensor or None
        This head's rows of the output projection, (d_v, d_e); None where folded into ``V``.
    mask : Tensor or None
        Bool (d_s, d_s), True where attended.
    shape : torch.Size
        The captured batch's (b, d_s, d_e).
    """

    def __init__(self, rest: Callable[[Tensor], Tensor], base: Tensor, V: Tensor, W_O: Tensor | None,
                 mask: Tensor | None, shape: torch.Size) -> None:
        self.rest, self.base, self.V, self.W_O, self.mask = rest, base, V, W_O, mask
        self.b, self.d_s = shape[0], shape[1]

    def __call__(self, S_new: Tensor) -> Tensor:
        """The loss at the head's scores ``S_new`` (b, d_s, d_s), pre-mask: a scalar."""
        return self.from_attention(self.attend(S_new, slice(None)))

    def attend(self, S: Tensor, samples: slice) -> Tensor:
        """The block output (n, d_s, d_e) on the ``n`` samples ``samples`` with this head at their scores ``S``: the
        rest of the block's output is added here, row by row, so that a search moving some samples adds it to
        those alone."""
        n = len(range(self.b)[samples])
        if S.shape != (n, self.d_s, self.d_s):
            raise ValueError(f"scores must have shape {(n, self.d_s, self.d_s)}, got {tuple(S.shape)}")
        return self._output(self._attention(S) @ self.V[samples], samples)

    def attend_factors(self, L: Tensor, R: Tensor, samples: slice) -> Tensor:
        """:meth:`attend` at the scores ``L Rᵀ``, ``L, R`` (n, d_s, r), bit for bit.

        On the CPU the scores, their softmax and its product with the values are formed
        :data:`SCORE_CHUNK_BYTES` of scores at a time, while they are in cache (each sample's products are its
        own, so the numbers are the same). Where one sample's scores are larger than that, at once: the scale
        set's d_s = 1024 (4 MiB a sample) gained nothing.
        """
        n = len(range(self.b)[samples])
        if L.shape[:2] != (n, self.d_s) or R.shape != L.shape:
            raise ValueError(f"score factors must have shape {(n, self.d_s, 'r')}, got {tuple(L.shape)} and "
                             f"{tuple(R.shape)}")
        chunk = SCORE_CHUNK_BYTES // (self.d_s * self.d_s * L.element_size())
        if L.device.type != "cpu" or chunk < 1:  # a GPU's kernels want the whole batch at once
            return self.attend(L @ R.mT, samples)
        V = self.V[samples]
        # Written through out= into one buffer of the batch's shape, each group's product takes the kernel the
        # whole batch's takes (a new tensor per group did not, at some sizes, and rounded otherwise).
        values = torch.empty(n, self.d_s, V.shape[-1], dtype=torch.result_type(L, V), device=L.device)
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            torch.matmul(self._attention(L[rows] @ R[rows].mT), V[rows], out=values[rows])
        return self._output(values, samples)

    def _attention(self, S: Tensor) -> Tensor:
        """The softmax of the scores ``S`` (n, d_s, d_s), the mask applied."""
        if self.mask is not None:
            S = S.masked_fill(~self.mask, float("-inf"))
        return torch.softmax(S, dim=-1)

    def _output(self, values: Tensor, samples: slice) -> Tensor:
        """The block output on the samples ``samples`` given this head's attention times its values there."""
        return self.base[samples] + (values if self.W_O is None else values @ self.W_O)

    def from_attention(self, out: Tensor) -> Tensor:
        """The loss given the block output on every sample, (b, d_s, d_e): a scalar."""
        return self.rest(out)


class GrowableAttention(GrowsHeads, CaptureSwitch, nn.Module):
    """Residual self-attention block with h heads, each with its own growable d_k.

    Parameters
    ----------
    d_e : int
        Embedding width.
    d_k : int
        Initial query/key width of every head.
    d_v : int, optional
        Value width per head; defaults to ``max(1, d_e // n_heads)``.
    n_heads : int
        Number of heads h >= 1.
    bias : bool
        Append a ones column to the input of Q, K, V (so d_in = d_e + 1) and give
        W_O a bias vector.
    causal : bool
        Mask scores above the diagonal.
    scale_policy : {"rescale", "fixed", "learnable"}
        How the score scale c behaves as d_k grows (docs/mathematics.md §6).
    generator : torch.Generator, optional
        Source of the deterministic initialisation.
    """

    def __init__(
        self,
        d_e: int,
        d_k: int,
        d_v: int | None = None,
        n_heads: int = 1,
        bias: bool = False,
        causal: bool = False,
        scale_policy: str = "rescale",
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if scale_policy not in SCALE_POLICIES:
            raise ValueError(
                f"scale_policy must be one of {SCALE_POLICIES}, got {scale_policy!r}"
            )
        if min(d_e, d_k, n_heads) < 1:
            raise ValueError(
                f"d_e, d_k, n_heads must be >= 1, got {d_e}, {d_k}, {n_heads}"
            )
        self.d_e, self.n_heads, self.bias, self.causal = d_e, n_heads, bias, causal
        self.scale_policy = scale_policy
        self.d_in = d_e + int(bias)
        self.d_v = d_v if d_v is not None else max(1, d_e // n_heads)

        # Draw on the generator's own device so a CPU generator works for any target.
        gen_device = generator.device if generator is not None else device

        def randn(rows: int, cols: int, std: float) -> Tensor:
            w = torch.randn(
                rows, cols, generator=generator, dtype=dtype, device=gen_device
            )
            return (w * std).to(device=device)

        std = 1.0 / math.sqrt(self.d_in)
        self.heads = nn.ModuleList(
            Head(
                randn(self.d_in, d_k, std),
                randn(self.d_in, d_k, std),
                randn(self.d_in, self.d_v, std),
                scale_policy,
            )
            for _ in range(n_heads)
        )
        self.W_O = nn.Parameter(
            randn(n_heads * self.d_v, d_e, 1.0 / math.sqrt(n_heads * self.d_v))
        )
        self.b_O = (
            nn.Parameter(torch.zeros(d_e, dtype=dtype, device=device)) if bias else None
        )

        self._cap_id = 0
        self._cap_X: Tensor | None = None
        self._cap_Xa: Tensor | None = None
        self._cap_S: dict[int, Tensor] = {}
        self._cap_G: dict[int, Tensor] = {}

    # ------------------------------------------------------------------ scale
    def _check_head(self, head: int) -> Head:
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head must be in [0, {self.n_heads}), got {head}")
        return self.heads[head]

    def d_k(self, head: int = 0) -> int:
        """Current query/key width of ``head``."""
        return self._check_head(head).W_Q.shape[1]

    def _c(self, head: int) -> Tensor | float:
        # Tensor for fixed/learnable so tau receives gradients and c0 follows .to().
        h = self.heads[head]
        if self.scale_policy == "learnable":
            return h.tau
        if self.scale_policy == "fixed":
            return h.c0
        return 1.0 / math.sqrt(h.W_Q.shape[1])

    def scale(self, head: int = 0) -> float:
        """Current score scale c of ``head``."""
        self._check_head(head)
        c = self._c(head)
        return float(c.detach()) if isinstance(c, Tensor) else c

    def new_scale(self, head: int, p: int) -> float:
        """Scale c' of ``head`` after growing its d_k by ``p`` (>= 0)."""
        if p < 0:
            raise ValueError(f"p must be >= 0, got {p}")
        if self.scale_policy == "rescale":
            return 1.0 / math.sqrt(self.d_k(head) + p)
        return self.scale(head)

    # ---------------------------------------------------------------- forward
    def _augment(self, X: Tensor) -> Tensor:
        if X.dim() != 3 or X.shape[-1] != self.d_e:
            raise ValueError(
                f"X must have shape (b, d_s, {self.d_e}), got {tuple(X.shape)}"
            )
        if not self.bias:
            return X
        return torch.cat([X, X.new_ones(*X.shape[:-1], 1)], dim=-1)

    def mask(self, d_s: int, device: torch.device | None = None) -> Tensor | None:
        """Bool (d_s, d_s) mask, True = attended; None when not causal."""
        if not self.causal:
            return None
        return torch.ones(d_s, d_s, dtype=torch.bool, device=device).tril()

    def _forward(self, X: Tensor, scores: dict[int, Tensor], capture: bool) -> Tensor:
        Xa = self._augment(X)
        d_s = X.shape[1]
        mask = self.mask(d_s, X.device)
        if capture:
            self._cap_id += 1
            self._cap_X, self._cap_Xa = X.detach(), Xa.detach()
            self._cap_S.clear()
            self._cap_G.clear()
        outs = []
        for i, h in enumerate(self.heads):
            if i in scores:
                S = scores[i]
                if S.shape != (X.shape[0], d_s, d_s):
                    raise ValueError(
                        f"scores[{i}] must have shape {(X.shape[0], d_s, d_s)}, "
                        f"got {tuple(S.shape)}"
                    )
            else:
                S = self._c(i) * (Xa @ h.W_Q) @ (Xa @ h.W_K).transpose(-1, -2)
                if capture:
                    self._cap_S[i] = S.detach()
                    if S.requires_grad:
                        # Hook on the pre-mask S: masked_fill routes zero gradient
                        # to masked entries, so G is exactly 0 there.
                        S.register_hook(self._make_hook(i))
            if mask is not None:
                S = S.masked_fill(~mask, float("-inf"))
            outs.append(torch.softmax(S, dim=-1) @ (Xa @ h.W_V))
        Y = torch.cat(outs, dim=-1) @ self.W_O + X
        return Y + self.b_O if self.b_O is not None else Y

    def _make_hook(self, i: int) -> Callable[[Tensor], None]:
        cap_id = self._cap_id

        def hook(g: Tensor) -> None:
            # A backward through an older captured graph must not pair its G
            # with the newer X and S.
            if cap_id == self._cap_id:
                self._cap_G[i] = g.detach()

        return hook

    def forward(self, X: Tensor) -> Tensor:
        """Apply the block.

        Parameters
        ----------
        X : Tensor, (b, d_s, d_e)

        Returns
        -------
        Tensor, (b, d_s, d_e)
            ``concat_i(H_i) W_O (+ b_O) + X``.
        """
        return self._forward(X, {}, self._capturing)

    def forward_from_scores(self, X: Tensor, scores: dict[int, Tensor]) -> Tensor:
        """Forward with some heads' pre-mask scores given instead of computed.

        Differentiable w.r.t. every given score tensor (plain ops, no hooks, no
        in-place ops on them); never captures. The causal mask is still applied.

        Parameters
        ----------
        X : Tensor, (b, d_s, d_e)
            Raw block input.
        scores : dict[int, Tensor]
            Head index -> un-masked scores S of shape (b, d_s, d_s).

        Returns
        -------
        Tensor, (b, d_s, d_e)
            Block output Y.
        """
        for i in scores:
            self._check_head(i)
        return self._forward(X, scores, capture=False)

    # ---------------------------------------------------------------- capture
    def captured(self, head: int = 0) -> Captured:
        """The last captured pass for ``head``; needs a backward after the forward.

        Only the most recent captured forward counts: a later one replaces it and
        gradients from older graphs are ignored.
        """
        self._check_head(head)
        if self._cap_X is None or head not in self._cap_S:
            raise RuntimeError(
                "nothing captured: run forward inside `with block.capture():`"
            )
        if head not in self._cap_G:
            raise RuntimeError(
                f"no gradient captured for head {head}: call loss.backward() "
                "after the captured forward (with parameters requiring grad)"
            )
        return Captured(
            self._cap_X,
            self._cap_Xa,
            self._cap_S[head],
            self._cap_G[head],
            self.mask(self._cap_X.shape[1], self._cap_X.device),
        )

    def loss_of_scores(
        self, rest: Callable[[Tensor], Tensor], head: int = 0
    ) -> HeadLoss:
        """Loss as a function of ``head``'s scores on the last captured batch.

        Parameters
        ----------
        rest : Callable[[Tensor], Tensor]
            Maps the block output Y (b, d_s, d_e) to a scalar loss.
        head : int
            Head whose scores are replaced.

        Returns
        -------
        HeadLoss
            ``fn(S_new)``, S_new (b, d_s, d_s) pre-mask -> scalar. Built from
            plain ops so ``torch.autograd.grad`` and ``torch.func`` transforms
            (e.g. ``jvp(grad(fn))``) apply. Also offers the block output and
            the loss given it apart (``fn.attend``, ``fn.from_attention``).

        Notes
        -----
        A growth evaluates ``fn`` several times with only ``head``'s scores
        changing, so everything else in the block is computed once, here, from
        the captured X and the parameters as they are now (detached): the other
        heads' outputs, the residual and ``head``'s values times its rows of
        ``W_O``. One call is then a softmax, one batched product and ``rest``
        (which uses its parameters as they are when ``fn`` runs).
        """
        h = self._check_head(head)
        if self._cap_X is None:
            raise RuntimeError(
                "nothing captured: run forward inside `with block.capture():`"
            )
        X, Xa = self._cap_X, self._cap_Xa  # snapshot: later captures must not change this closure
        mask = self.mask(X.shape[1], X.device)
        rows = slice(head * self.d_v, (head + 1) * self.d_v)
        with torch.no_grad():
            base = X if self.b_O is None else X + self.b_O
            for i, other in enumerate(self.heads):
                if i != head:
                    S = self._c(i) * (Xa @ other.W_Q) @ (Xa @ other.W_K).mT
                    if mask is not None:
                        S = S.masked_fill(~mask, float("-inf"))
                    out = torch.softmax(S, dim=-1) @ (Xa @ other.W_V)
                    base = base + out @ self.W_O[i * self.d_v:(i + 1) * self.d_v]
            V = Xa @ h.W_V
            W_O = self.W_O[rows].detach()
            # Fold W_O into the values when that is cheaper per call: A (V W_O) costs
            # d_s·d_e per row against d_s·d_v + d_v·d_e for (A V) W_O.
            fold = X.shape[1] * self.d_e <= X.shape[1] * self.d_v + self.d_v * self.d_e
            if fold:
                V = V @ W_O

        return HeadLoss(rest, base, V, None if fold else W_O, mask, X.shape)

    # ----------------------------------------------------------------- growth
    def factors(self, head: int = 0) -> tuple[Tensor, Tensor]:
        """Detached clones of ``(W_Q, W_K)``, each (d_in, d_k)."""
        h = self._check_head(head)
        return h.W_Q.detach().clone(), h.W_K.detach().clone()

    def install(self, head: int, W_Q: Tensor, W_K: Tensor) -> None:
        """Replace ``head``'s query/key factors; other heads are untouched.

        Parameters
        ----------
        head : int
            Head index.
        W_Q, W_K : Tensor, (d_in, d_k') with d_k' >= current d_k
            New factors; copied and cast to the block's dtype/device. Under
            ``rescale`` the head's c becomes 1/sqrt(d_k').

        Raises
        ------
        ValueError
            Wrong rank or d_in, W_Q/W_K shapes differ, d_k would shrink, or
            non-finite entries. The block is left unchanged.
        """
        install_factors(self._check_head(head), W_Q, W_K, self.d_in, self.d_k(head))
