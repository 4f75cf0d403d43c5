"""Many heads of a pretrained BERT-style encoder, narrowed and grown together, through forward hooks.

Training on the real model narrows every head of one or more layers and grows them all
(``growbench train``). :class:`PretrainedHeads` is that growth site: for each layer that
holds a narrowed head, one forward hook on the layer's self-attention module (the
``transformers`` module itself; nothing of BERT is re-implemented) replaces each narrowed
head's slice of the attention output with ``softmax(S_h) V_h``, where

    S_h = c · (Xa W_Q,h)(Xa W_K,h)ᵀ,  Xa = [X | 1]  (b, d_s, d_e + 1)

as in :class:`~models.pretrained_head.PretrainedHead` (the biases are the last rows of the
factors, ``c`` the pretrained ``d_head^-1/2``). ``V_h`` is taken from the module's own value
projection (a hook on it keeps its output), so nothing is computed twice. Where every head
of a layer is narrowed, the layer's fused query and key projections are replaced by a
stand-in returning zeros (:class:`NoProjection`): their output would be thrown away, and
computing it would count full-width FLOPs for narrowed heads.

The site offers :class:`~models.block.GrowableAttention`'s interface over heads
``0..n_heads-1`` ordered by ``(layer, head)``: ``heads[h].W_Q``, ``d_k``, ``scale``,
``new_scale``, ``factors``, ``install``, ``capture``, ``captured``, ``loss_of_scores``.
Heads in different layers see different inputs ``X``: ``captured(h).Xa`` is head ``h``'s own
(``inputs_per_head`` is True when the heads span several layers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from growbench.models.block import Captured, CaptureSwitch, GrowsHeads, HookedHeads
from growbench.models.pretrained_head import KeptScale, PretrainedHead


class HeadFactors(nn.Module):
    """Query/key factors ``W_Q``, ``W_K`` (d_e + 1, d_k) of one narrowed head, and where it sits."""

    def __init__(self, layer: int, head: int, W_Q: Tensor, W_K: Tensor) -> None:
        super().__init__()
        self.layer, self.head = layer, head
        self.W_Q = nn.Parameter(W_Q.detach().clone())
        self.W_K = nn.Parameter(W_K.detach().clone())


class NoProjection(nn.Module):
    """Stands in for a fused query or key projection none of whose heads is used: zeros, no product.

    Parameters
    ----------
    out_features : int
        Width of the replaced ``nn.Linear``'s output.
    """

    def __init__(self, out_features: int) -> None:
        super().__init__()
        self.out_features = out_features

    def forward(self, X: Tensor) -> Tensor:
        """Zeros (b, d_s, out_features) like ``X`` (b, d_s, d_e)."""
        return X.new_zeros(*X.shape[:-1], self.out_features)


def check_sites(encoder: nn.Module, sites: list[tuple[int, int]]) -> None:
    """Refuse an empty, repeated or out-of-range ``(layer, head)``; the message lists the valid ones.

    Raises
    ------
    ValueError
    """
    n_layers = len(encoder.encoder.layer)
    n_heads = encoder.config.num_attention_heads
    if not sites:
        raise ValueError("no head to narrow: give at least one (layer, head)")
    if len(set(sites)) != len(sites):
        raise ValueError(f"a head is named twice in {sites}")
    for layer, head in sites:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range; valid layers: 0..{n_layers - 1}")
        if not 0 <= head < n_heads:
            raise ValueError(f"head {head} out of range; valid heads: 0..{n_heads - 1}")


class PretrainedHeads(HookedHeads, GrowsHeads, KeptScale, CaptureSwitch, nn.Module):
    """Heads ``sites`` of ``encoder`` with query/key factors of any width, each grown on its own.

    Parameters
    ----------
    encoder : nn.Module
        A ``transformers`` BERT-style model (``encoder.encoder.layer[i].attention.self``);
        it is changed in place (hooks, and the stand-in projections of fully narrowed layers),
        so pass a copy.
    factors : dict
        ``(layer, head) -> (W_Q, W_K)``, each (d_e + 1, d_k) with the bias as the last row.

    Notes
    -----
    The encoder is a plain attribute, not a submodule: its weights stay frozen and
    ``parameters()`` holds only the narrowed heads' factors (what training optimises).
    """

    causal = False

    def __init__(self, encoder: nn.Module, factors: dict[tuple[int, int], tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        sites = sorted(factors)
        check_sites(encoder, sites)
        object.__setattr__(self, "encoder", encoder)  # not a submodule: see Notes
        self.heads = nn.ModuleList(HeadFactors(layer, head, *factors[layer, head]) for layer, head in sites)
        self.n_heads = len(sites)
        self.d_e = encoder.config.hidden_size
        self.d_in = self.d_e + 1
        self.layers = sorted({layer for layer, _ in sites})
        self.inputs_per_head = len(self.layers) > 1
        self._by_layer = {layer: [i for i, (lay, _) in enumerate(sites) if lay == layer] for layer in self.layers}
        self._c = 1.0 / math.sqrt(encoder.config.hidden_size // encoder.config.num_attention_heads)
        self._override: dict[int, Tensor] = {}
        self._values: dict[int, Tensor] = {}
        self._inputs: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> captured (X, Xa)
        self._cap: dict[int, dict[str, Tensor]] = {}  # head -> captured S and G
        self._cap_id = 0
        for layer in self.layers:
            attention = encoder.encoder.layer[layer].attention.self
            if len(self._by_layer[layer]) == attention.num_attention_heads:
                attention.query = NoProjection(attention.query.out_features)
                attention.key = NoProjection(attention.key.out_features)
            attention.value.register_forward_hook(self._keep_values(layer))
            attention.register_forward_hook(self._hook(layer), with_kwargs=True)

    # ------------------------------------------------------------------ the hooks
    def _keep_values(self, layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            self._values[layer] = output  # (b, d_s, d_e): every head's V, read by the attention hook

        return hook

    def _hook(self, layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: tuple | Tensor) -> tuple | Tensor:
            X = args[0] if args else kwargs["hidden_states"]
            PretrainedHead.check_unmasked(kwargs)
            Xa = torch.cat([X, X.new_ones(*X.shape[:-1], 1)], dim=-1)
            V = self._values.pop(layer)
            attn = output[0] if isinstance(output, tuple) else output
            dh = module.attention_head_size
            pieces = list(attn.split(dh, dim=-1))
            if self._capturing:
                self._inputs[layer] = (X.detach(), Xa.detach())
            for i in self._by_layer[layer]:
                site = self.heads[i]
                S = self._override.get(i)
                if S is None:
                    S = self._c * (Xa @ site.W_Q) @ (Xa @ site.W_K).mT
                    if self._capturing:
                        self._record(i, S)
                rows = slice(site.head * dh, (site.head + 1) * dh)
                pieces[site.head] = (torch.softmax(S, dim=-1) @ V[..., rows]).to(attn.dtype)
            new = torch.cat(pieces, dim=-1)
            return (new, *output[1:]) if isinstance(output, tuple) else new

        return hook

    # ------------------------------------------------ GrowableAttention's interface (the rest: HookedHeads)
    def captured(self, head: int = 0) -> Captured:
        """The last captured pass as ``head`` saw it (its own layer's ``X``); needs a backward after the forward."""
        site = self._site(head)
        cap = self._cap.get(head, {})
        if "S" not in cap or site.layer not in self._inputs:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        if "G" not in cap:
            raise RuntimeError("no gradient captured: call loss.backward() after the captured forward")
        X, Xa = self._inputs[site.layer]
        return Captured(X, Xa, cap["S"], cap["G"], None)

    def run_from(self, layer: int, X: Tensor, overrides: dict[int, Tensor] | None = None) -> Tensor:
        """The encoder's last hidden state (b, d_s, d_e) from layer ``layer``'s input ``X`` (b, d_s, d_e).

        ``overrides`` maps head indices of that layer to scores (b, d_s, d_s) used instead of
        their factors' (differentiable in the scores).
        """
        self._override = dict(overrides or {})
        try:
            h = X
            for block in self.encoder.encoder.layer[layer:]:
                h = block(h)
                h = h[0] if isinstance(h, tuple) else h  # transformers < 5 returns a tuple
            return h
        finally:
            self._override = {}

    def loss_of_scores(self, rest: Callable[[Tensor], Tensor], head: int = 0) -> Callable[[Tensor], Tensor]:
        """Loss as a function of ``head``'s scores on the last captured batch.

        Parameters
        ----------
        rest : Callable[[Tensor], Tensor]
            Maps the encoder's last hidden state (b, d_s, d_e) to a scalar loss.

        Returns
        -------
        Callable[[Tensor], Tensor]
            ``fn(S)``, S (b, d_s, d_s) -> scalar: the layers from ``head``'s on, rerun from
            its captured input with its scores replaced and every other head's current factors.
        """
        X = self.captured_input(head)

        def fn(S: Tensor) -> Tensor:
            if S.shape != (X.shape[0], X.shape[1], X.shape[1]):
                raise ValueError(f"scores must have shape {(X.shape[0], X.shape[1], X.shape[1])}, "
                                 f"got {tuple(S.shape)}")
            return rest(self.run_from(self.heads[head].layer, X, {head: S}))

        return fn

    def captured_input(self, head: int) -> Tensor:
        """The captured input ``X`` (b, d_s, d_e) of ``head``'s layer."""
        layer = self._site(head).layer
        if layer not in self._inputs:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        return self._inputs[layer][0]
