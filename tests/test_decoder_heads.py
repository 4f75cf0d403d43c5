"""A Llama-style decoder's heads made growable (models/decoder_heads.py), checked against transformers' own forward.

A small randomly initialised ``LlamaForCausalLM`` (grouped key/value heads, rotary positions, the causal
mask built by transformers) stands in for the pretrained one: every property here is one of the hooks,
not of the weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growbench import strategies  # noqa: E402
from growbench.models.decoder_heads import (  # noqa: E402
    DecoderHeads,
    decoder_layers,
    head_shape,
    no_factors,
    rotary_factors,
    rotated_dims,
)

try:
    decoder_layers(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=8)))
except ValueError as e:  # transformers < 4.48 computes the rotary tables inside the attention module
    pytest.skip(str(e), allow_module_level=True)

D_E, HEADS, KV, D_HEAD, LAYERS, VOCAB = 48, 4, 2, 12, 3, 50


def tiny_llama(seed: int = 0, bias: bool = False) -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=D_E, intermediate_size=64, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D_HEAD,
                                      vocab_size=VOCAB, max_position_embeddings=64, rope_theta=100.0,
                                      attention_bias=bias, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval().requires_grad_(False)
    # Larger than the default init: a random model's attention is then far from uniform, so a wrong score shows.
    for layer in model.model.layers:
        for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            lin.weight.mul_(8.0)
    return model


def ids(b: int = 3, d_s: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, d_s), generator=torch.Generator().manual_seed(seed))


def hidden(model, x):
    return model.model(input_ids=x, use_cache=False).last_hidden_state


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("where", [[(1, 2)], [(0, 0), (0, 3), (2, 1)]])
def test_the_hooked_model_equals_transformers_forward_with_every_pair_kept_and_no_new_dimension(where, bias):
    model = tiny_llama(bias=bias)
    reference = copy.deepcopy(model)
    d_in = D_E + bias
    site = DecoderHeads(model, {s: no_factors(d_in) for s in where})
    x = ids()
    torch.testing.assert_close(hidden(model, x), hidden(reference, x), rtol=0, atol=2e-6)
    site.remove()
    torch.testing.assert_close(hidden(model, x), hidden(reference, x), rtol=0, atol=0)


@pytest.mark.parametrize("rotary", [0, 2, 5])
def test_dropped_pairs_equal_transformers_forward_with_those_query_dimensions_zeroed(rotary):
    # An independent reference for the kept-pairs term: zeroing head 2's query rows of the dropped pairs in
    # transformers' own q_proj removes exactly those dimensions from its scores (the key rows are shared by
    # the group's other head, so they stay).
    model = tiny_llama()
    reference = copy.deepcopy(model)
    dropped = ~rotated_dims(D_HEAD, rotary)
    reference.model.layers[1].self_attn.q_proj.weight[2 * D_HEAD:3 * D_HEAD][dropped] = 0.0
    DecoderHeads(model, {(1, 2): no_factors(D_E)}, rotary=rotary)
    x = ids()
    torch.testing.assert_close(hidden(model, x), hidden(reference, x), rtol=0, atol=2e-6)


def test_rotation_free_factors_add_c_xwq_xwk_to_the_head_scores():
    # The new dimensions as transformers would compute them: head 1's factors moved into extra query/key
    # rows of a model whose heads are all one dimension wider is not expressible, so compare the scores:
    # S_site - S_kept = c (X W_Q)(X W_K)ᵀ on the captured batch.
    model = tiny_llama()
    g = torch.Generator().manual_seed(3)
    W_Q, W_K = torch.randn(D_E, 3, generator=g), torch.randn(D_E, 3, generator=g)
    site = DecoderHeads(model, {(1, 1): (W_Q, W_K)}, rotary=3)
    with site.capture():
        hidden(model, ids()).sum()
    X = site.captured_input(0)
    c = site.scale(0)
    torch.testing.assert_close(site._cap[0]["S"], c * (X @ W_Q) @ (X @ W_K).mT)
    assert c == pytest.approx(D_HEAD ** -0.5)


def test_rotary_factors_are_the_modules_own_query_and_group_key_rows():
    model = tiny_llama(bias=True)
    attention = model.model.layers[0].self_attn
    assert head_shape(attention) == (HEADS, KV, D_HEAD)
    W_q, W_k, c = rotary_factors(attention, 3)  # group 1 of 2
    X = torch.randn(2, 5, D_E)
    Xa = torch.cat([X, torch.ones(2, 5, 1)], -1)
    torch.testing.assert_close(Xa @ W_q, attention.q_proj(X)[..., 3 * D_HEAD:])
    torch.testing.assert_close(Xa @ W_k, attention.k_proj(X)[..., D_HEAD:])
    assert c == attention.scaling


def captured_site(rotary=3, d_k=2, seed=0):
    model = tiny_llama(seed)
    g = torch.Generator().manual_seed(5)
    site = DecoderHeads(model, {(1, 2): (torch.randn(D_E, d_k, generator=g), torch.randn(D_E, d_k, generator=g))},
                        rotary=rotary)
    x = ids()
    logits_of = model.lm_head

    def rest(H):
        logits = logits_of(H)[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))

    site.requires_grad_(True)
    with site.capture():
        loss = rest(hidden(model, x))
        loss.backward()
    return model, site, x, rest, float(loss.detach())


def test_loss_of_scores_at_the_captured_scores_is_the_models_loss_and_its_gradient_is_G():
    model, site, x, rest, loss = captured_site()
    cap = site.captured(0)
    fn = site.loss_of_scores(rest, 0)
    S = cap.S.clone().requires_grad_(True)
    value = fn(S)
    assert float(value.detach()) == pytest.approx(loss, rel=1e-6)
    (grad,) = torch.autograd.grad(value, S)
    torch.testing.assert_close(grad, cap.G, rtol=1e-5, atol=1e-9)
    # Causal: no gradient above the diagonal.
    assert float(cap.G.masked_select(~cap.mask).abs().max()) == 0.0


def test_the_first_order_decrease_of_a_change_of_z_is_minus_g_dot_its_scores():
    _, site, _, rest, _ = captured_site()
    cap = site.captured(0)
    fn = site.loss_of_scores(rest, 0)
    dZ = torch.randn(D_E, D_E, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    X = cap.Xa.double()
    dS = (X @ dZ @ X.mT).float()
    t = torch.zeros((), requires_grad=True)
    (slope,) = torch.autograd.grad(fn(cap.S + t * dS), t)
    assert float(slope) == pytest.approx(float((cap.G * dS).sum()), rel=1e-4)


def test_a_growth_at_lambda_zero_keeps_the_function_and_a_default_growth_lowers_the_batch_loss():
    model, site, x, rest, loss = captured_site(d_k=0)
    before = hidden(model, x).clone()
    W_Q, W_K = site.factors(0)
    site.install(0, torch.cat([W_Q, torch.zeros(D_E, 4)], 1), torch.cat([W_K, torch.zeros(D_E, 4)], 1))
    torch.testing.assert_close(hidden(model, x), before, rtol=0, atol=0)
    model, site, x, rest, loss = captured_site(d_k=0)
    r = site.grow(0, strategies.make("gram/solve/full/normal:bracket"), 4, rest)
    assert site.d_k(0) == 4 and r.W_Q.shape == (D_E, 4)
    assert r.loss_before == pytest.approx(loss, rel=1e-6)
    assert r.loss_after < r.loss_before
    with torch.no_grad():
        assert float(rest(hidden(model, x))) == pytest.approx(r.loss_after, rel=1e-5)


def test_the_grown_model_stays_causal():
    model, site, x, rest, _ = captured_site()
    site.grow(0, strategies.make("gram/solve/full/normal:bracket"), 2, rest)
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(hidden(model, x)[:, :6], hidden(model, y)[:, :6], rtol=0, atol=0)


def test_a_padded_batch_is_refused_in_one_line():
    model = tiny_llama()
    DecoderHeads(model, {(0, 0): no_factors(D_E)})
    x = ids()
    attention_mask = torch.ones_like(x)
    attention_mask[0, :3] = 0
    with pytest.raises(ValueError, match="unpadded inputs"):
        model(input_ids=x, attention_mask=attention_mask, use_cache=False)


def test_bad_sites_are_refused_naming_the_range():
    model = tiny_llama()
    with pytest.raises(ValueError, match="layer 3 out of range; valid layers: 0..2"):
        DecoderHeads(model, {(3, 0): no_factors(D_E)})
    with pytest.raises(ValueError, match="head 4 out of range; valid heads: 0..3"):
        DecoderHeads(model, {(0, 4): no_factors(D_E)})
    with pytest.raises(ValueError, match="rotary must be in 0..6"):
        DecoderHeads(model, {(0, 0): no_factors(D_E)}, rotary=7)
    with pytest.raises(ValueError, match="not a Llama-style decoder"):
        DecoderHeads(torch.nn.Linear(2, 2), {(0, 0): no_factors(D_E)})


def test_a_batch_seen_before_reruns_only_the_grown_layers_and_gives_the_same_bits():
    model, site, x, rest, _ = captured_site()
    calls = []
    handle = model.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    first = site.last_hidden(x, use_cache=False)
    again = site.last_hidden(x, use_cache=False)
    assert len(calls) == 1  # the layer before the grown one ran once
    handle.remove()
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(first, hidden(model, x), rtol=0, atol=0)
    # After a growth the kept prefix still serves: the result is the grown model's own forward.
    site.grow(0, strategies.make("gram/solve/full/normal:bracket"), 2, rest)
    handle = model.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    grown = site.last_hidden(x, use_cache=False)
    twin = copy.deepcopy(site)
    twin_handle = twin.model.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    twin_grown = twin.last_hidden(x, use_cache=False)  # the copy keeps the prefixes too
    assert len(calls) == 1
    handle.remove()
    twin_handle.remove()
    torch.testing.assert_close(grown, hidden(model, x), rtol=0, atol=0)
    torch.testing.assert_close(twin_grown, grown, rtol=0, atol=0)


def test_a_copy_shares_the_frozen_weights_and_grows_on_its_own():
    model, site, x, rest, _ = captured_site()
    twin = copy.deepcopy(site)
    assert twin.model.model.layers[1].self_attn.q_proj.weight is model.model.layers[1].self_attn.q_proj.weight
    W_Q, W_K = twin.factors(0)
    twin.install(0, torch.cat([W_Q, torch.ones(D_E, 1)], 1), torch.cat([W_K, torch.ones(D_E, 1)], 1))
    assert site.d_k(0) == 2 and twin.d_k(0) == 3
    assert not torch.equal(hidden(twin.model, x), hidden(model, x))
