"""Heads of a pretrained Llama-style decoder, made growable with forward hooks on transformers' own modules.

A Llama-style attention head ``h`` of layer ``l`` (rotary positions, grouped key/value heads,
a causal mask) scores

    S = c · RoPE(Xa W_q,h) RoPE(Xa W_k,g)ᵀ,   g = h // (n_heads / n_kv_heads)  (b, d_s, d_s)

with ``X`` the normalised input of the layer's attention and ``c = d_head^-1/2``. A site keeps
``rotary`` of the head's ``d_head / 2`` frequency pairs (the highest-frequency ones, which carry
the positions) as transformers computes them, and adds query/key dimensions that carry no
rotation (the partial-rotary layout of GPT-NeoX and Phi, DeepSeek's decoupled dimensions):

    S = c · Σ_{d kept} q̃_d k̃_d  +  c · (Xa W_Q)(Xa W_K)ᵀ

``W_Q``, ``W_K`` (d_in, d_k) are the site's parameters, the factors a growth enlarges; the
first term is fixed. The strategies see only the second term: its scores are what
``captured(h).S`` holds and ``loss_of_scores`` takes, and ``G = ∂L/∂S`` is the same for both
terms, so every strategy applies unchanged. ``Xa = [X | 1]`` when the model's query projection
has a bias (Qwen2's), else ``X`` (Llama's, SmolLM2's).

The model stays the ecosystem's module: ``model(input_ids)`` is transformers' own forward (its
embedding, rotary tables, causal mask, grouped key/value heads, MLPs and norms). The hooks
change only what growth changes: a pre-hook on the layer's output projection ``o_proj``
replaces each grown head's slice of its input by ``softmax(S) V_g``, where the head's rotated
query and key and the group's values are the module's own ``q_proj``, ``k_proj`` and ``v_proj``
outputs (kept by forward hooks) rotated by the model's own ``apply_rotary_pos_emb``, and the
causal mask is applied to ``S`` as the strategies' bool mask (:meth:`DecoderHeads.mask`).

The new key dimensions belong to the query head that grows, not to its key/value group: each
grown head has its own ``W_K``. Sharing them across the group's query heads would make the
growths of those heads one problem (one ``W_K`` for several ``W_Q``, a joint low-rank fit of
their directions side by side), which no strategy of this suite solves; per head, a growth by
``p`` costs ``p`` key columns per query head instead of per group (docs/mathematics.md §10.1).

Inputs never carry padding: an attention mask that masks more than the causal triangle is
refused (:func:`check_causal`).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import itertools
import sys
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor, nn

from growbench.models.block import Captured, CaptureSwitch, GrowsHeads, HookedHeads, check_new_factors
from growbench.models.pretrained_head import KeptScale

#: The keyword arguments of a decoder layer that a rerun from it needs (the same for every layer of a forward).
LAYER_KWARGS = ("attention_mask", "position_embeddings", "position_ids")
#: Batches whose input to the first grown layer :meth:`DecoderHeads.last_hidden` keeps.
PREFIX_CACHE = 64


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM or its base model (``model.model.layers`` or ``model.layers``).

    Raises
    ------
    ValueError
        Not a Llama-style decoder: no ``layers`` whose ``self_attn`` has ``q_proj``, ``k_proj``, ``v_proj``,
        ``o_proj`` and passes rotary tables as ``position_embeddings`` (transformers >= 4.48).
    """
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(model).__name__}: not a Llama-style decoder (no `layers` of decoder layers)")
    attention = getattr(layers[0], "self_attn", None)
    if attention is None or not all(hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        raise ValueError(f"{type(model).__name__}: its layers' self_attn lacks q_proj, k_proj, v_proj or o_proj")
    if "position_embeddings" not in inspect.signature(attention.forward).parameters:
        raise ValueError(f"{type(attention).__name__}: computes its rotary tables inside; growing its heads needs "
                         "transformers >= 4.48, which passes them as position_embeddings")
    return layers


def base_model(model: nn.Module) -> nn.Module:
    """The base model (``LlamaModel``) of a causal LM, or the model itself."""
    decoder_layers(model)
    return getattr(model, "model", model)


def head_shape(attention: nn.Module) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, d_head)`` of a Llama-style attention module."""
    d_head = attention.head_dim
    n_heads = attention.q_proj.out_features // d_head
    return n_heads, attention.k_proj.out_features // d_head, d_head


def rotary_factors(attention: nn.Module, head: int) -> tuple[Tensor, Tensor, float]:
    """Head ``head``'s query and key factors before rotation, each (d_in, d_head), and its scale ``c``.

    The key factor is the head's key/value group's. With biases (``q_proj.bias``), the last row holds
    them, as for :func:`models.pretrained_head.head_factors`.
    """
    n_heads, n_kv, d_head = head_shape(attention)
    group = head // (n_heads // n_kv)

    def factor(lin: nn.Linear, index: int) -> Tensor:
        rows = slice(index * d_head, (index + 1) * d_head)
        W = lin.weight[rows].T
        if lin.bias is not None:
            W = torch.cat([W, lin.bias[rows].unsqueeze(0)])
        return W.detach().clone()

    return factor(attention.q_proj, head), factor(attention.k_proj, group), float(attention.scaling)


def rotated_dims(d_head: int, rotary: int) -> Tensor:
    """Bool (d_head,): the dimensions of the ``rotary`` highest-frequency pairs, in transformers' ``rotate_half``
    layout (pair ``i`` is dimensions ``i`` and ``i + d_head/2``, frequency ``θ^(-2i/d_head)``)."""
    half = d_head // 2
    if not 0 <= rotary <= half:
        raise ValueError(f"rotary must be in 0..{half} (the head's frequency pairs), got {rotary}")
    pair = torch.arange(d_head) % half
    return pair < rotary


def check_causal(mask: Tensor | None, d_s: int) -> None:
    """Refuse an attention mask that masks more than the causal triangle (padding): the grown heads apply only that.

    ``None`` is transformers' causal fast path (SDPA's ``is_causal``). A float mask is additive (negative where
    masked), a bool one true where attended; either of shape (b, 1, d_s, d_s) or broadcastable to it.
    """
    if mask is None:
        return
    blocked = mask < 0 if mask.is_floating_point() else ~mask
    causal = torch.ones(d_s, d_s, dtype=torch.bool, device=mask.device).tril()
    if not bool((blocked[..., -d_s:, -d_s:] == ~causal).all()):
        raise ValueError("DecoderHeads needs unpadded inputs: the attention mask masks more than the causal "
                         "triangle (padding?)")


class DecoderSite(nn.Module):
    """The growable part of one head: factors ``W_Q``, ``W_K`` (d_in, d_k), where it sits and what it keeps."""

    def __init__(self, layer: int, head: int, group: int, W_Q: Tensor, W_K: Tensor, kept: Tensor) -> None:
        super().__init__()
        self.layer, self.head, self.group = layer, head, group
        self.W_Q = nn.Parameter(W_Q.detach().clone())
        self.W_K = nn.Parameter(W_K.detach().clone())
        self.register_buffer("kept", kept, persistent=False)


class DecoderHeads(HookedHeads, GrowsHeads, KeptScale, CaptureSwitch, nn.Module):
    """Heads ``(layer, head)`` of a Llama-style decoder with growable rotation-free query/key dimensions.

    Parameters
    ----------
    model : nn.Module
        A transformers causal LM (``LlamaForCausalLM``) or its base model; changed in place (hooks), so
        pass a copy where the original must stay as it is.
    factors : dict
        ``(layer, head) -> (W_Q, W_K)``, each (d_in, d_k): the rotation-free factors each head starts
        with (``d_k = 0`` for none: the head as pretrained).
    rotary : int, optional
        Frequency pairs of each head kept rotated (the highest-frequency ones); default every pair, the
        head as pretrained plus the new dimensions.

    Notes
    -----
    The model is a plain attribute, not a submodule: its weights stay frozen and ``parameters()`` holds only
    the sites' factors (what a warm-up or training optimises and a cache stores). The interface is
    :class:`~models.block.GrowableAttention`'s over heads ``0..n_heads-1`` ordered by ``(layer, head)``.
    """

    causal = True

    def __init__(self, model: nn.Module, factors: dict[tuple[int, int], tuple[Tensor, Tensor]],
                 rotary: int | None = None) -> None:
        super().__init__()
        layers = decoder_layers(model)
        object.__setattr__(self, "model", model)  # not a submodule: see Notes
        object.__setattr__(self, "base", base_model(model))
        attention = layers[0].self_attn
        n_heads, n_kv, d_head = head_shape(attention)
        sites = sorted(factors)
        if not sites:
            raise ValueError("no head to grow: give at least one (layer, head)")
        for layer, head in sites:
            if not 0 <= layer < len(layers):
                raise ValueError(f"layer {layer} out of range; valid layers: 0..{len(layers) - 1}")
            if not 0 <= head < n_heads:
                raise ValueError(f"head {head} out of range; valid heads: 0..{n_heads - 1}")
        kept = rotated_dims(d_head, d_head // 2 if rotary is None else rotary)
        self.rotary = int(kept.sum()) // 2
        self.heads = nn.ModuleList(DecoderSite(layer, head, head // (n_heads // n_kv), *factors[layer, head], kept)
                                   for layer, head in sites)
        self.n_heads = len(sites)
        self.d_e = attention.q_proj.in_features
        self.bias = attention.q_proj.bias is not None
        self.d_in = self.d_e + self.bias
        self.d_head = d_head
        self.layers = sorted({layer for layer, _ in sites})
        self.inputs_per_head = len(self.layers) > 1
        self._by_layer = {layer: [i for i, (lay, _) in enumerate(sites) if lay == layer] for layer in self.layers}
        self._c = float(attention.scaling)
        self._rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb  # the model's own RoPE
        self._override: dict[int, Tensor] = {}
        self._seen: dict[int, dict[str, Tensor]] = {}  # layer -> this forward's X, rotary tables, q, k, v
        self._inputs: dict[int, tuple[Tensor, Tensor, dict]] = {}  # layer -> captured (X, Xa, layer kwargs)
        self._layer_in: dict[int, Tensor] = {}  # layer -> captured input of the decoder layer (for run_from)
        self._cap: dict[int, dict[str, Tensor]] = {}  # head -> captured S and G
        self._cap_id = 0
        # Batch -> input of the first grown layer and its keyword arguments (see last_hidden).
        self._prefix: OrderedDict[tuple, tuple[Tensor, dict]] = OrderedDict()
        self._pending: tuple | None = None
        for W in factors.values():
            check_new_factors(*W, self.d_in, 0)
        self._handles = []
        self._attach()

    @property
    def encoder(self) -> nn.Module:
        """The base model (``LlamaModel``): ``encoder(input_ids).last_hidden_state`` is the hooked forward."""
        return self.base

    def _attach(self) -> None:
        layers = decoder_layers(self.model)
        for layer in self.layers:
            attn = layers[layer].self_attn
            self._handles += [
                layers[layer].register_forward_pre_hook(self._keep_layer_input(layer), with_kwargs=True),
                attn.register_forward_pre_hook(self._keep_attention_input(layer), with_kwargs=True),
                *(getattr(attn, name).register_forward_hook(self._keep_projection(layer, name))
                  for name in ("q_proj", "k_proj", "v_proj")),
                attn.o_proj.register_forward_pre_hook(self._replace_heads(layer)),
            ]

    def remove(self) -> None:
        """Take the hooks off the model: it computes its pretrained heads again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __deepcopy__(self, memo: dict) -> DecoderHeads:
        # A copy needs its own modules with hooks bound to the copy: copied with this site's hooks on, the
        # model would call back into this site. The frozen weights are shared (see datasets.smollm.shared_copy),
        # unless they need grad.
        memo.update({id(t): t for t in itertools.chain(self.model.parameters(), self.model.buffers())
                     if not t.requires_grad})
        self.remove()
        try:
            model = copy.deepcopy(self.model, memo)
        finally:
            self._attach()
        factors = {(site.layer, site.head): (site.W_Q, site.W_K) for site in self.heads}
        twin = DecoderHeads(model, factors, rotary=self.rotary)
        twin._prefix = OrderedDict(self._prefix)  # inputs of layers no growth reaches: the same for the copy
        return twin

    # ------------------------------------------------------------------ the hooks
    def augment(self, X: Tensor) -> Tensor:
        """``[X | 1]`` with a bias, else ``X``; (b, d_s, d_in)."""
        return torch.cat([X, X.new_ones(*X.shape[:-1], 1)], dim=-1) if self.bias else X

    def mask(self, d_s: int, device: torch.device | None = None) -> Tensor:
        """The causal mask, bool (d_s, d_s), true where attended."""
        return torch.ones(d_s, d_s, dtype=torch.bool, device=device).tril()

    def _keep_layer_input(self, layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._capturing and (self._pending is None or layer != self.layers[0]):
                return
            h = (args[0] if args else kwargs["hidden_states"]).detach()
            layer_kwargs = {k: kwargs.get(k) for k in LAYER_KWARGS}
            if self._capturing:
                self._layer_in[layer] = h
                self._inputs[layer] = (*self._inputs.get(layer, (None, None))[:2], layer_kwargs)
            if self._pending is not None and layer == self.layers[0]:
                self._prefix[self._pending] = (h, layer_kwargs)
                while len(self._prefix) > PREFIX_CACHE:
                    self._prefix.popitem(last=False)

        return hook

    def _keep_attention_input(self, layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            X = args[0] if args else kwargs["hidden_states"]
            check_causal(kwargs.get("attention_mask"), X.shape[1])
            self._seen[layer] = {"X": X, "rope": kwargs["position_embeddings"]}

        return hook

    def _keep_projection(self, layer: int, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            self._seen[layer][name] = output  # (b, d_s, heads·d_head): read by the o_proj hook

        return hook

    def _replace_heads(self, layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple:
            seen = self._seen.pop(layer)
            X = seen["X"]
            Xa = self.augment(X)
            if self._capturing:
                self._inputs[layer] = (X.detach(), Xa.detach(), self._inputs[layer][2])
            mask = self.mask(X.shape[1], X.device)
            dh = self.d_head
            pieces = list(args[0].split(dh, dim=-1))
            for i in self._by_layer[layer]:
                site = self.heads[i]
                S = self._override.get(i)
                if S is None:
                    S = self._c * (Xa @ site.W_Q) @ (Xa @ site.W_K).mT
                    if self._capturing:
                        self._record(i, S)
                q = seen["q_proj"][..., site.head * dh:(site.head + 1) * dh]
                k = seen["k_proj"][..., site.group * dh:(site.group + 1) * dh]
                q, k = self._rotate(q.unsqueeze(1), k.unsqueeze(1), *seen["rope"])  # (b, 1, d_s, d_head)
                S_total = S + self._c * (q[:, 0] * site.kept) @ k[:, 0].mT
                A = torch.softmax(S_total.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32)
                V = seen["v_proj"][..., site.group * dh:(site.group + 1) * dh]
                pieces[site.head] = (A.to(V.dtype) @ V).to(args[0].dtype)
            return (torch.cat(pieces, dim=-1),)

        return hook

    # ------------------------------------------------ GrowableAttention's interface (the rest: HookedHeads)
    def captured(self, head: int = 0) -> Captured:
        """The last captured pass as ``head`` saw it: its layer's normalised input ``X`` and its rotation-free
        scores ``S`` and their ``G``; needs a backward after the forward."""
        site = self._site(head)
        cap = self._cap.get(head, {})
        if "S" not in cap or site.layer not in self._inputs or self._inputs[site.layer][0] is None:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        if "G" not in cap:
            raise RuntimeError("no gradient captured: call loss.backward() after the captured forward")
        X, Xa, _ = self._inputs[site.layer]
        return Captured(X, Xa, cap["S"], cap["G"], self.mask(X.shape[1], X.device))

    def run_from(self, layer: int, h: Tensor, overrides: dict[int, Tensor] | None = None) -> Tensor:
        """The base model's last hidden state (after its final norm), (b, d_s, d_e), from decoder layer ``layer``'s
        input ``h`` (b, d_s, d_e), with the captured batch's mask and rotary tables.

        ``overrides`` maps head indices of that layer to rotation-free scores (b, d_s, d_s) used instead of their
        factors' (differentiable in the scores).
        """
        if layer not in self._inputs:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        return self._run(layer, h, self._inputs[layer][2], overrides)

    def _run(self, layer: int, h: Tensor, kwargs: dict, overrides: dict[int, Tensor] | None = None) -> Tensor:
        self._override = dict(overrides or {})
        try:
            for block in decoder_layers(self.model)[layer:]:
                h = block(h, **kwargs)
                h = h[0] if isinstance(h, tuple) else h
            return self.base.norm(h)
        finally:
            self._override = {}

    def last_hidden(self, ids: Tensor, **options) -> Tensor:
        """The base model's last hidden state (b, d_s, d_e) of token ids ``ids`` (b, d_s).

        transformers' own forward the first time a batch is seen; after that, for a batch seen among the last
        :data:`PREFIX_CACHE`, the layers from the first grown one on, from that layer's input and keyword
        arguments kept from the first forward. The layers before it never change (no growth reaches them), so
        the result is the same to the bit, and a held-out batch measured before and after a growth, or a
        line search's batch, costs only the layers a growth can change.
        """
        key = (tuple(ids.shape), str(ids.device), hashlib.blake2b(ids.detach().cpu().numpy().tobytes()).digest())
        if key in self._prefix and self.layers[0] > 0:
            self._prefix.move_to_end(key)
            h, kwargs = self._prefix[key]
            return self._run(self.layers[0], h, kwargs)
        self._pending = key
        try:
            return self.base(input_ids=ids, **options).last_hidden_state
        finally:
            self._pending = None

    def loss_of_scores(self, rest: Callable[[Tensor], Tensor], head: int = 0) -> Callable[[Tensor], Tensor]:
        """Loss as a function of ``head``'s rotation-free scores on the last captured batch.

        Parameters
        ----------
        rest : Callable[[Tensor], Tensor]
            Maps the base model's last hidden state (b, d_s, d_e) to a scalar loss.

        Returns
        -------
        Callable[[Tensor], Tensor]
            ``fn(S)``, S (b, d_s, d_s) -> scalar: the layers from ``head``'s on, rerun from its layer's captured
            input with its scores replaced and every other head's current factors.
        """
        layer = self._site(head).layer
        if layer not in self._layer_in:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        h = self._layer_in[layer]
        shape = (h.shape[0], h.shape[1], h.shape[1])

        def fn(S: Tensor) -> Tensor:
            if S.shape != shape:
                raise ValueError(f"scores must have shape {shape}, got {tuple(S.shape)}")
            return rest(self.run_from(layer, h, {head: S}))

        return fn

    def captured_input(self, head: int) -> Tensor:
        """The captured normalised attention input ``X`` (b, d_s, d_e) of ``head``'s layer."""
        layer = self._site(head).layer
        if layer not in self._inputs or self._inputs[layer][0] is None:
            raise RuntimeError("nothing captured: run a forward inside `with site.capture():`")
        return self._inputs[layer][0]


def no_factors(d_in: int, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Empty rotation-free factors (d_in, 0): a head as pretrained, before any growth."""
    empty = torch.zeros(d_in, 0, dtype=dtype, device=device)
    return empty, empty.clone()
