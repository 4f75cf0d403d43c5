"""One head of a pretrained BERT-style encoder, made growable with a forward hook.

The encoder is the ecosystem's own module (``transformers``' ``BertModel``); nothing of
its architecture is re-implemented. A forward hook on the chosen layer's self-attention
module takes its input ``X`` (the layer's hidden states) and replaces the chosen head's
slice of the attention output with ``softmax(S) V_h``, where ``S`` comes from our own
factors:

    S = c · (Xa W_Q)(Xa W_K)ᵀ,  Xa = [X | 1]  (b, d_s, d_e + 1)

so the pretrained query/key biases are the last rows of ``W_Q``, ``W_K`` and the head's
width is free (the other heads keep their fused projections). The site offers the
interface of :class:`~models.block.GrowableAttention` for head 0: ``capture``,
``captured``, ``loss_of_scores``, ``factors``, ``scale``, ``new_scale``, ``install``.

Inputs never carry padding (every sequence is a full window of tokens), so no attention
mask reaches the head; :meth:`PretrainedHead.check_unmasked` refuses one that would.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from growbench.models.block import Captured, CaptureSwitch, GrowsHeads, install_factors


def head_factors(attention: nn.Module, head: int) -> tuple[Tensor, Tensor, float]:
    """The pretrained ``(W_Q, W_K)`` of ``head``, each (d_e + 1, d_head), and its score scale.

    Parameters
    ----------
    attention : nn.Module
        A BERT self-attention module (``query``/``key`` ``nn.Linear``, ``attention_head_size``).
    head : int
        Head index.

    Returns
    -------
    tuple[Tensor, Tensor, float]
        Detached float tensors whose last row is the head's bias, and ``c = d_head^-1/2``.
    """
    dh = attention.attention_head_size
    rows = slice(head * dh, (head + 1) * dh)

    def factor(lin: nn.Linear) -> Tensor:
        return torch.cat([lin.weight[rows].T, lin.bias[rows].unsqueeze(0)]).detach().clone()

    return factor(attention.query), factor(attention.key), 1.0 / math.sqrt(dh)


def best_rank_factors(W_Q: Tensor, W_K: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Factors of the best rank-``rank`` approximation (Frobenius, Eckart–Young) of ``W_Q W_Kᵀ``.

    Parameters
    ----------
    W_Q, W_K : Tensor, (d_in, d)
    rank : int
        Kept rank, ``1 <= rank``; columns beyond the product's rank are zero.

    Returns
    -------
    tuple[Tensor, Tensor]
        Each (d_in, rank), ``U √s`` and ``V √s``, in the input dtype.
    """
    # Through the thin QR of each factor: the SVD of a (d, d) core instead of (d_in, d_in).
    Qq, Rq = torch.linalg.qr(W_Q.double())
    Qk, Rk = torch.linalg.qr(W_K.double())
    U, s, Vh = torch.linalg.svd(Rq @ Rk.T)
    k = min(rank, s.shape[0])
    root = s[:k].sqrt()
    A, B = (Qq @ U[:, :k]) * root, (Qk @ Vh[:k].T) * root
    pad = rank - k
    A, B = (nn.functional.pad(M, (0, pad)) for M in (A, B))
    return A.to(W_Q.dtype), B.to(W_K.dtype)


def metric_best_rank_factors(W_Q: Tensor, W_K: Tensor, rank: int, covariance: Tensor) -> tuple[Tensor, Tensor]:
    """Factors of the best rank-``rank`` approximation of ``W_Q W_Kᵀ`` in the metric of the inputs' covariance.

    With ``Σ = L Lᵀ`` the second moment of the inputs ``x`` (plus a ridge of ``1e-6`` of its mean diagonal,
    so that directions the data never takes cost nothing but stay defined), the score error of a change
    ``ΔZ`` between independent tokens is ``E[(x ΔZ yᵀ)²] = ‖Lᵀ ΔZ L‖_F²``: the best rank-``rank`` change is
    the truncated SVD of ``Lᵀ W_Q W_Kᵀ L``, mapped back through ``L⁻ᵀ`` (a triangular solve, no inverse).

    Parameters
    ----------
    W_Q, W_K : Tensor, (d_in, d)
    rank : int
    covariance : Tensor, (d_in, d_in)
        ``E[xᵀx]`` of the inputs the factors act on.

    Returns
    -------
    tuple[Tensor, Tensor]
        Each (d_in, rank), in the input dtype; columns beyond the product's rank are zero.
    """
    C = covariance.double()
    L = torch.linalg.cholesky(C + 1e-6 * C.diagonal().mean() * torch.eye(C.shape[0], dtype=C.dtype))
    A, B = best_rank_factors(L.mT @ W_Q.double(), L.mT @ W_K.double(), rank)
    A, B = (torch.linalg.solve_triangular(L.mT, M, upper=True) for M in (A.double(), B.double()))
    return A.to(W_Q.dtype), B.to(W_K.dtype)


class KeptScale:
    """What every pretrained growable head shares: the pretrained scale is kept, and no mask."""

    def new_scale(self, head: int, p: int) -> float:
        """Scale after growing by ``p``: unchanged, so a growth with zero new columns preserves the function."""
        if p < 0:
            raise ValueError(f"p must be >= 0, got {p}")
        return self.scale(head)

    def mask(self, d_s: int, device: torch.device | None = None) -> None:
        """No mask: the encoder is bidirectional and inputs are unpadded."""
        return None


class PretrainedHead(GrowsHeads, KeptScale, CaptureSwitch, nn.Module):
    """Head ``head`` of layer ``layer`` of ``encoder``, with query/key factors of any width.

    Parameters
    ----------
    encoder : nn.Module
        A ``transformers`` BERT-style model: ``encoder.encoder.layer[i].attention.self``
        is the self-attention module (``query``, ``key``, ``value`` linears).
    layer, head : int
        Where the growable head sits.
    W_Q, W_K : Tensor, (d_e + 1, d_k)
        Initial factors; the last row multiplies the ones column (the biases).

    Notes
    -----
    The encoder is held as a plain attribute, not a submodule: its weights are
    pretrained and frozen, so ``parameters()`` and ``state_dict()`` hold only the
    head's factors (what a warm-up trains and a cache stores).
    """

    def __init__(self, encoder: nn.Module, layer: int, head: int, W_Q: Tensor, W_K: Tensor) -> None:
        super().__init__()
        layers = encoder.encoder.layer
        if not 0 <= layer < len(layers):
            raise ValueError(f"layer {layer} out of range; valid layers: 0..{len(layers) - 1}")
        self.attention = layers[layer].attention.self
        n_heads = self.attention.num_attention_heads
        if not 0 <= head < n_heads:
            raise ValueError(f"head {head} out of range; valid heads: 0..{n_heads - 1}")
        object.__setattr__(self, "encoder", encoder)  # not a submodule: see Notes
        self.layer, self.head = layer, head
        self.d_e = encoder.config.hidden_size
        self.d_in = self.d_e + 1
        self.n_heads = 1
        self.causal = False
        self._c = head_factors(self.attention, head)[2]
        self.W_Q = nn.Parameter(W_Q.detach().clone())
        self.W_K = nn.Parameter(W_K.detach().clone())
        self._override: Tensor | None = None
        self._cap: dict[str, Tensor] = {}
        self._cap_id = 0
        self._handle = self.attention.register_forward_hook(self._hook, with_kwargs=True)

    # ------------------------------------------------------------------ the hook
    def augment(self, X: Tensor) -> Tensor:
        """``[X | 1]``, (b, d_s, d_e + 1)."""
        return torch.cat([X, X.new_ones(*X.shape[:-1], 1)], dim=-1)

    def scores(self, Xa: Tensor) -> Tensor:
        """``c (Xa W_Q)(Xa W_K)ᵀ``, (b, d_s, d_s), from the current factors."""
        return self._c * (Xa @ self.W_Q) @ (Xa @ self.W_K).mT

    @staticmethod
    def check_unmasked(kwargs: dict) -> None:
        """Refuse an attention mask that masks something: the head is computed without one."""
        mask = kwargs.get("attention_mask")
        if mask is None:
            return
        masked = (~mask).any() if mask.dtype == torch.bool else (mask != 0).any()
        if bool(masked):
            raise ValueError("PretrainedHead needs unpadded inputs: an attention mask that masks tokens was passed")

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict, output: tuple | Tensor) -> tuple | Tensor:
        X = args[0] if args else kwargs["hidden_states"]
        self.check_unmasked(kwargs)
        Xa = self.augment(X)
        if self._override is not None:
            S = self._override
        else:
            S = self.scores(Xa)
            if self._capturing:
                self._record(X, Xa, S)
        dh = module.attention_head_size
        rows = slice(self.head * dh, (self.head + 1) * dh)
        V = nn.functional.linear(X, module.value.weight[rows], module.value.bias[rows])  # (b, d_s, d_head)
        out_h = torch.softmax(S, dim=-1) @ V
        attn = output[0] if isinstance(output, tuple) else output
        new = torch.cat([attn[..., : rows.start], out_h.to(attn.dtype), attn[..., rows.stop:]], dim=-1)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    def _record(self, X: Tensor, Xa: Tensor, S: Tensor) -> None:
        self._cap_id += 1
        self._cap = {"X": X.detach(), "Xa": Xa.detach(), "S": S.detach()}
        if S.requires_grad:
            cap_id = self._cap_id

            def hook(g: Tensor) -> None:
                if cap_id == self._cap_id:  # an older graph's backward must not pair with newer X
                    self._cap["G"] = g.detach()

            S.register_hook(hook)

    # ------------------------------------------------ GrowableAttention's interface
    @property
    def heads(self) -> tuple[PretrainedHead]:
        """The one growable head as ``heads[0]``, whose ``W_Q`` and ``W_K`` are the parameters a
        growth replaces (what training's optimiser surgery reads, as on a multi-head block)."""
        return (self,)

    def _check_head(self, head: int) -> None:
        if head != 0:
            raise ValueError(f"a pretrained site has one growable head (0), got {head}")

    def d_k(self, head: int = 0) -> int:
        """Current query/key width of the head."""
        self._check_head(head)
        return self.W_Q.shape[1]

    def scale(self, head: int = 0) -> float:
        """Score scale ``c``: the pretrained ``d_head^-1/2``, kept when the head grows."""
        self._check_head(head)
        return self._c

    def captured(self, head: int = 0) -> Captured:
        """The last captured pass; needs a backward after the forward."""
        self._check_head(head)
        if "S" not in self._cap:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        if "G" not in self._cap:
            raise RuntimeError("no gradient captured: call loss.backward() after the captured forward")
        c = self._cap
        return Captured(c["X"], c["Xa"], c["S"], c["G"], None)

    def run_from(self, X: Tensor, S: Tensor | None = None) -> Tensor:
        """The encoder's last hidden state from this layer's input ``X`` (b, d_s, d_e).

        With ``S`` (b, d_s, d_s) given, the head's scores are ``S`` instead of the
        factors' (differentiable in ``S``).
        """
        self._override = S
        try:
            h = X
            for block in self.encoder.encoder.layer[self.layer:]:
                h = block(h)
                h = h[0] if isinstance(h, tuple) else h  # transformers < 5 returns a tuple
            return h
        finally:
            self._override = None

    def loss_of_scores(self, rest: Callable[[Tensor], Tensor], head: int = 0) -> Callable[[Tensor], Tensor]:
        """Loss as a function of the head's scores on the last captured batch.

        Parameters
        ----------
        rest : Callable[[Tensor], Tensor]
            Maps the encoder's last hidden state (b, d_s, d_e) to a scalar loss.

        Returns
        -------
        Callable[[Tensor], Tensor]
            ``fn(S)``, S (b, d_s, d_s) -> scalar: the layers from this one on, rerun
            from the captured input with the head's scores replaced.
        """
        self._check_head(head)
        if "X" not in self._cap:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        X = self._cap["X"]

        def fn(S: Tensor) -> Tensor:
            if S.shape != (X.shape[0], X.shape[1], X.shape[1]):
                raise ValueError(f"scores must have shape {(X.shape[0], X.shape[1], X.shape[1])}, "
                                 f"got {tuple(S.shape)}")
            return rest(self.run_from(X, S))

        return fn

    def factors(self, head: int = 0) -> tuple[Tensor, Tensor]:
        """Detached clones of ``(W_Q, W_K)``, each (d_e + 1, d_k)."""
        self._check_head(head)
        return self.W_Q.detach().clone(), self.W_K.detach().clone()

    def install(self, head: int, W_Q: Tensor, W_K: Tensor) -> None:
        """Replace the head's factors by ``(W_Q, W_K)``, each (d_e + 1, d_k') with ``d_k' >= d_k``.

        Raises
        ------
        ValueError
            Wrong shape, shrinking, or non-finite entries; the site is left unchanged.
        """
        self._check_head(head)
        install_factors(self, W_Q, W_K, self.d_in, self.d_k())

    def __deepcopy__(self, memo: dict) -> PretrainedHead:
        # A copy needs its own encoder with the hook bound to the copy; deepcopy of the
        # encoder would carry the old hook, so rebuild from a hook-free copy.
        self._handle.remove()
        try:
            encoder = copy.deepcopy(self.encoder, memo)
        finally:
            self._handle = self.attention.register_forward_hook(self._hook, with_kwargs=True)
        return PretrainedHead(encoder, self.layer, self.head, self.W_Q, self.W_K)
