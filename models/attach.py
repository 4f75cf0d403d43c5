"""Grow the heads of your own transformers model in place: one call makes them growable.

:func:`growable_heads` takes a BERT-style encoder (``BertModel`` and the models built on it) or a
Llama-style decoder (``LlamaForCausalLM``, and the Mistral, Qwen2, ... families that share its
attention module) and returns a growth site over the chosen ``(layer, head)`` pairs, hooked into the
model's own modules: the model's forward stays transformers' forward, and a head computes what it
computed before until it grows.

- A BERT-style head is taken over whole (:class:`~models.pretrained_heads.PretrainedHeads`): its
  query/key factors start as the pretrained ones (the biases as a last row) and a growth appends
  columns, so the head becomes wider than its neighbours.
- A Llama-style head keeps every rotary dimension as pretrained and grows rotation-free ones
  (:class:`~models.decoder_heads.DecoderHeads`): its factors start empty (d_k = 0).

The site offers :class:`~models.block.GrowableAttention`'s interface: ``capture()``,
``captured(i)``, ``grow(i, strategy, p, rest, stats)`` and ``factors(i)``, with heads indexed
``0..n-1`` in ``(layer, head)`` order, and ``rest`` mapping the base model's last hidden state to
the loss of the captured batch. Call ``site.remove()`` to take the hooks off (Llama-style).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from growbench.models.decoder_heads import DecoderHeads, decoder_layers, no_factors
from growbench.models.pretrained_head import head_factors
from growbench.models.pretrained_heads import PretrainedHeads, check_sites


def _bert_encoder(model: nn.Module) -> nn.Module | None:
    """The ``BertModel``-like module of ``model`` (itself, or its ``bert``/``base_model``), or None."""
    for candidate in (model, getattr(model, "bert", None), getattr(model, "base_model", None)):
        layers = getattr(getattr(candidate, "encoder", None), "layer", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and hasattr(layers[0], "attention"):
            return candidate
    return None


def growable_heads(model: nn.Module, heads: Iterable[tuple[int, int]]) -> PretrainedHeads | DecoderHeads:
    """Make heads ``(layer, head)`` of a transformers model growable, in place.

    Parameters
    ----------
    model : nn.Module
        A BERT-style encoder or a Llama-style decoder (see the module docstring). Its weights are not
        changed; hooks are added to its modules.
    heads : iterable of (int, int)
        The heads, each once.

    Returns
    -------
    PretrainedHeads or DecoderHeads
        The growth site; head ``i`` of the site is the ``i``-th pair in sorted order.

    Raises
    ------
    ValueError
        A model of neither kind, or a head out of range (the message says the valid range).
    """
    sites = sorted(set(heads))
    try:
        layers = decoder_layers(model)
    except ValueError as decoder_error:
        encoder = _bert_encoder(model)
        if encoder is None:
            raise ValueError(f"{type(model).__name__}: neither a BERT-style encoder nor a Llama-style decoder "
                             f"({decoder_error})") from None
        check_sites(encoder, sites)
        layers = encoder.encoder.layer
        factors = {(layer, head): head_factors(layers[layer].attention.self, head)[:2] for layer, head in sites}
        return PretrainedHeads(encoder, factors)
    d_in = layers[0].self_attn.q_proj.in_features + (layers[0].self_attn.q_proj.bias is not None)
    like = layers[0].self_attn.q_proj.weight
    return DecoderHeads(model, {s: no_factors(d_in, like.dtype, like.device) for s in sites})
