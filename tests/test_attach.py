"""Growing a head of one's own transformers model in place (models/attach.py), BERT-style and Llama-style."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from growbench import strategies  # noqa: E402
from growbench.models.attach import growable_heads  # noqa: E402

VOCAB = 60


def tiny_bert():
    config = transformers.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                     vocab_size=VOCAB, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def tiny_llama():
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def last_hidden(model, ids):
    if hasattr(model, "lm_head"):  # a causal LM: its base model's output, before the vocabulary
        return model.model(input_ids=ids, use_cache=False).last_hidden_state
    return model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("make", [tiny_bert, tiny_llama])
def test_attaching_keeps_the_models_function(make):
    model = make()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    site = growable_heads(model, [(2, 1), (0, 3)])
    assert site.n_heads == 2 and site.where(0) == (0, 3)
    with torch.no_grad():
        torch.testing.assert_close(last_hidden(model, ids), last_hidden(reference, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [tiny_bert, tiny_llama])
def test_a_default_growth_from_the_users_batches_and_loss_lowers_that_loss(make):
    model = make()
    site = growable_heads(model, [(1, 2)])
    target = torch.randn(4, 12, 32, generator=torch.Generator().manual_seed(2))
    strategy = strategies.make("gram/solve/full/normal:bracket")
    stats = strategy.new_statistics()
    for seed in range(3):
        ids = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(seed))
        with site.capture():
            ((last_hidden(model, ids) - target) ** 2).mean().backward()
        cap = site.captured(0)
        stats.update(cap.Xa, cap.G, cap.mask)
    d_k = site.d_k(0)
    r = site.grow(0, strategy, 3, lambda H: ((H - target) ** 2).mean(), stats=stats)
    assert site.d_k(0) == d_k + 3 and r.loss_after < r.loss_before
    with torch.no_grad():
        assert float(((last_hidden(model, ids) - target) ** 2).mean()) == pytest.approx(r.loss_after, rel=1e-5)


def test_a_model_of_neither_kind_and_a_head_out_of_range_are_refused():
    with pytest.raises(ValueError, match="neither a BERT-style encoder nor a Llama-style decoder"):
        growable_heads(torch.nn.Linear(3, 3), [(0, 0)])
    with pytest.raises(ValueError, match="head 4 out of range"):
        growable_heads(tiny_bert(), [(0, 4)])
    with pytest.raises(ValueError, match="layer 3 out of range"):
        growable_heads(tiny_llama(), [(3, 0)])
