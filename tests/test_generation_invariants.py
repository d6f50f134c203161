"""Invariants every attention variant of both families must keep: cache = no cache, padded batch = sentences alone,
step-by-step decoding = one full forward, and beam search reordering every piece of per-step state. The model-level
tests run over every Transformer of `VARIANT_CONFIGS` and every LSTM of `RNN_CONFIGS`."""

import copy

import pytest
import torch

from hf_headattn import HeadAttnCache
from hf_headattn.runtime.transformers_compat import CACHE_NAME, cache_of

from helpers import (RNN_CONFIGS, RNN_EOS_BIAS, VARIANT_CONFIGS, VOCAB, random_model, random_rnn_model, rnn_config,
                     source_batch, tiny_config)


# Random models fall into repeating one token; forbidding repeats makes every step's argmax matter.
GENERATION = dict(max_new_tokens=10, do_sample=False, no_repeat_ngram_size=1)


MODELS = {
    **{f"transformer-{name}": lambda config=config: random_model(tiny_config(**config))
       for name, config in sorted(VARIANT_CONFIGS.items())},
    **{f"lstm-{name}": lambda name=name, config=config: random_rnn_model(
        rnn_config(**config), eos_bias=RNN_EOS_BIAS.get(name, 0.0)) for name, config in RNN_CONFIGS.items()},
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@pytest.mark.parametrize("num_beams", [1, 5])
def test_cache_equals_no_cache(model, num_beams):
    input_ids, attention_mask = source_batch()
    with_cache = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                                use_cache=True, **GENERATION)
    without_cache = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                                   use_cache=False, **GENERATION)
    assert torch.equal(with_cache, without_cache)


@pytest.mark.parametrize("num_beams", [1, 5])
def test_padded_batch_equals_sentences_alone(model, num_beams):
    lengths = (7, 4, 9)
    input_ids, attention_mask = source_batch(lengths)
    batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, **GENERATION)
    for row, length in enumerate(lengths):
        alone = model.generate(input_ids=input_ids[row : row + 1, :length], num_beams=num_beams, **GENERATION)
        width = alone.shape[1]
        assert torch.equal(batched[row, :width], alone[0]), f"sentence {row} differs when batched"
        # Transformers' beam search fills finished rows with `pad_token_id or eos_token_id`: EOS when pad is id 0
        assert set(batched[row, width:].tolist()) <= {model.config.pad_token_id, model.config.eos_token_id}


# The logit-level checks run in float64, where the only differences left are real ones: in float32, rounding
# differs between a full pass and cached steps by ~1e-5 relative once several layers weigh heads (DHICM).
def test_padded_batch_logits_equal_sentences_alone(model):
    model = copy.deepcopy(model).double()
    lengths = (7, 4, 9)
    input_ids, attention_mask = source_batch(lengths)
    decoder_input_ids = torch.randint(2, VOCAB, (3, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        for row, length in enumerate(lengths):
            alone = model(input_ids=input_ids[row : row + 1, :length], decoder_input_ids=decoder_input_ids[row : row + 1])
            torch.testing.assert_close(batched.logits[row], alone.logits[0], atol=1e-10, rtol=1e-10)


def test_step_by_step_decoding_with_cache_equals_full_forward(model):
    model = copy.deepcopy(model).double()
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(2, VOCAB, (3, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                        decoder_input_ids=decoder_input_ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = cache_of(out)
            steps.append(out.logits)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    assert full.dtype == torch.float64
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-10)


def test_the_cache_travels_under_either_name_and_comes_back_under_this_releases_name():
    """Transformers 5.24 renamed the decoding cache `past_key_values` -> `cache`; the models take both (older
    releases' `generate` passes the old name) and return it under the installed release's name."""
    model = random_model(tiny_config())
    input_ids, attention_mask = source_batch()
    first, second = torch.full((3, 1), model.config.decoder_start_token_id), torch.full((3, 1), 5)
    with torch.no_grad():
        step = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=first, use_cache=True)
        assert isinstance(getattr(step, CACHE_NAME), HeadAttnCache)
        after_new_name = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=second,
                               cache=copy.deepcopy(cache_of(step)), use_cache=True)
        after_old_name = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=second,
                               past_key_values=copy.deepcopy(cache_of(step)), use_cache=True)
        assert cache_of(after_old_name).get_seq_length() == 2
        torch.testing.assert_close(after_old_name.logits, after_new_name.logits, atol=0, rtol=0)
        with pytest.raises(ValueError, match="not as both"):
            model(input_ids=input_ids, decoder_input_ids=second, cache=cache_of(step), past_key_values=cache_of(step))


def test_beam_search_depends_on_reordering_the_variant_state(monkeypatch):
    """Proves the cache = no-cache beam test above can fail: skip reordering the per-step state and the
    stateful variant's beam-search output changes."""
    model = random_model(tiny_config(**VARIANT_CONFIGS["running_sum"]))
    input_ids, attention_mask = source_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=5, **GENERATION)
    reference = model.generate(**kwargs, use_cache=False)
    parent_reorder = HeadAttnCache.__mro__[1].reorder_cache
    monkeypatch.setattr(HeadAttnCache, "reorder_cache", lambda self, beam_idx: parent_reorder(self, beam_idx))
    assert not torch.equal(model.generate(**kwargs, use_cache=True), reference)


def test_cache_state_follows_reorder_and_batch_selection():
    cache = HeadAttnCache()
    assert cache.is_croppable  # Transformers asks before rolling steps back (5.24's deferred stop check)
    cache.set_variant_state("cross_attention.0", {"coverage": torch.arange(4.0)[:, None]})
    cache.reorder_cache(torch.tensor([3, 3, 0, 1]))
    assert cache.get_variant_state("cross_attention.0")["coverage"].squeeze(1).tolist() == [3.0, 3.0, 0.0, 1.0]
    cache.batch_repeat_interleave(2)
    assert cache.get_variant_state("cross_attention.0")["coverage"].squeeze(1).tolist() == [3, 3, 3, 3, 0, 0, 1, 1]
    cache.batch_select_indices(torch.tensor([0, 4]))
    assert cache.get_variant_state("cross_attention.0")["coverage"].squeeze(1).tolist() == [3.0, 0.0]
    assert not cache.is_croppable
    with pytest.raises(ValueError, match="cannot crop per-step attention state"):
        cache.crop(1)
    cache.reset()
    assert cache.get_variant_state("cross_attention.0") is None


def test_sampling_with_cache_equals_without(model):
    input_ids, attention_mask = source_batch()
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(11)
        outputs.append(model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=10,
                                      max_new_tokens=8, use_cache=use_cache))
    assert torch.equal(*outputs)


def test_beam_reordering_moves_self_attention_keys_but_not_the_sentence_constant_cross_attention_ones():
    """Beam search permutes each sentence's hypotheses among themselves, whose cross-attention keys/values are
    equal, so reorder_cache leaves them in place (test_cache_equals_no_cache covers the outputs)."""
    cache = HeadAttnCache()
    rows = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 3, 5)
    cache.self_attention_cache.update(rows.clone(), rows.clone(), 0)
    cache.cross_attention_cache.update(rows.clone(), rows.clone(), 0)
    cache.reorder_cache(torch.tensor([1, 1, 2, 3]))
    assert cache.self_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [1.0, 1.0, 2.0, 3.0]
    assert cache.cross_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_self_attention_cache_changes_rows_at_its_next_append_with_dynamic_layers_values():
    """`RowsOnAppendLayer` keeps a reorder or a row selection until the next append (one copy), where Transformers'
    `DynamicLayer` copies at each: the same tensors come out, whether the change is read early or not."""
    from transformers.cache_utils import DynamicLayer

    from hf_headattn.runtime.cache_headattn import RowsOnAppendLayer

    torch.manual_seed(0)
    cached, new = torch.randn(6, 2, 3, 4), torch.randn(4, 2, 1, 4)
    changes = [("reorder_cache", torch.tensor([5, 5, 0, 2, 1, 3])), ("reorder_cache", torch.tensor([1, 0, 0, 4, 3, 2])),
               ("batch_select_indices", torch.tensor([0, 2, 3, 5]))]
    layers = {"eager": DynamicLayer(), "on append": RowsOnAppendLayer(), "read early": RowsOnAppendLayer()}
    for name, layer in layers.items():
        layer.update(cached.clone(), -cached)
        for method, rows in changes:
            getattr(layer, method)(rows)
        if name == "on append":
            assert layer.rows is not None and layer.get_seq_length() == 3  # still waiting: the length needs no copy
        if name == "read early":
            torch.testing.assert_close(layer.keys, layers["eager"].keys, atol=0, rtol=0)
    results = {name: layer.update(new, -new) for name, layer in layers.items()}
    for name in ("on append", "read early"):
        assert layers[name].rows is None
        for got, expected in zip(results[name], results["eager"]):
            torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert results["eager"][0].shape == (4, 2, 4, 4)
    waiting = layers["on append"]
    waiting.reorder_cache(torch.tensor([3, 2, 1, 0]))
    waiting.reset()  # a change still waiting goes with the cache
    assert waiting.rows is None and waiting.get_seq_length() == 0


def test_the_self_attention_cache_appends_into_room_unless_beam_search_reorders_it():
    """Between changes of rows (greedy search), `RowsOnAppendLayer` appends by writing into room kept after the cached
    positions, with `DynamicLayer`'s values: the stored tensor stays the one it was until the room runs out, when the
    cache is copied once into a tensor with room for as many positions again. A row selection is that copy; a layer
    beam search reorders keeps contiguous tensors, without room."""
    from transformers.cache_utils import DynamicLayer

    from hf_headattn.runtime.cache_headattn import RowsOnAppendLayer

    torch.manual_seed(0)
    layer, eager = RowsOnAppendLayer(), DynamicLayer()
    stores = []
    for step in range(6):
        if step == 4:
            layer.batch_select_indices(torch.tensor([0, 2]))
            eager.batch_select_indices(torch.tensor([0, 2]))
        new = torch.randn(eager.keys.shape[0] if step else 3, 2, 1, 4)
        for got, expected in zip(layer.update(new, -new), eager.update(new, -new)):
            assert torch.equal(got, expected)
        stores.append(layer.key_store)
        if layer.key_store is not None:  # keys and values are views of the stores' first positions
            assert layer.keys.data_ptr() == layer.key_store.data_ptr()
            assert layer.values.data_ptr() == layer.value_store.data_ptr()
    # append 1 copies the first tensor into room for 4 positions, 2 and 3 write there; 4 (rows selected) copies the
    # kept rows into room for 10 (5 cached), 5 writes
    assert stores[0] is None and stores[1] is stores[2] is stores[3] and stores[4] is stores[5] is not stores[3]
    assert [store.shape[-2] for store in stores[1:]] == [4, 4, 4, 10, 10]
    assert stores[4].shape[0] == 2
    layer.reorder_cache(torch.tensor([1, 0]))
    eager.reorder_cache(torch.tensor([1, 0]))
    new = torch.randn(2, 2, 1, 4)
    for got, expected in zip(layer.update(new, -new), eager.update(new, -new)):
        assert torch.equal(got, expected) and got.is_contiguous()
    assert layer.key_store is None and layer.value_store is None
    layer.reset()
    assert not layer.reordered

