"""Issue 31, item 6: the rest of Transformers' model contract, as MarianMTModel meets it, for every variant: embeddings
tied or untied save and reload, and a checkpoint without them reports them missing; `generate()` without a source
answers as Marian's; attentions and hidden states come one tensor per layer (plus the embeddings) in Marian's tuple
positions, DHICM's extra outputs after them; assisted and prompt-lookup decoding run (stateless variants) or are
refused before decoding (stateful ones, and the LSTM); generation continues from a returned cache."""

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MarianConfig, MarianMTModel

from hf_headattn import HeadAttnForConditionalGeneration, HeadAttnRNNConfig
from hf_headattn.runtime.attention_base import CROSS_ATTENTION, DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION
from hf_headattn.runtime.attention_registry import get_attention_variant
from hf_headattn.runtime.transformers_compat import CACHE_NAME

from helpers import VARIANT_CONFIGS, random_model, random_rnn_model, rnn_config, source_batch, tiny_config


DECODER_INPUT_IDS = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 10], [0, 11, 12, 13]])
def stateful(config) -> bool:
    """Whether a variant of the model keeps per-step state (`stateful`), at any site and layer."""
    return any(get_attention_variant(config.attention_variant(site, layer)[0]).stateful
               for site in (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION)
               for layer in range(config.encoder_layers if site == ENCODER_SELF_ATTENTION else config.decoder_layers))


@pytest.fixture(scope="module", params=sorted(VARIANT_CONFIGS))
def variant(request):
    return request.param, random_model(tiny_config(**VARIANT_CONFIGS[request.param]))


def marian_like(model):
    """A MarianMTModel of the same sizes: the reference for tuple positions and shapes."""
    config = model.config
    return MarianMTModel(MarianConfig(
        vocab_size=config.vocab_size, d_model=config.d_model, encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers, encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads, encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim, max_position_embeddings=config.max_position_embeddings,
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id, attn_implementation="eager")).eval()  # weights: eager


# ------------------------------------------------------------------------------------------------ embeddings
@pytest.mark.parametrize("share, tie", [(True, True), (True, False), (False, True), (False, False)])
def test_tied_and_untied_embeddings_save_reload_and_report_missing(share, tie, tmp_path):
    separate_vocabulary = {} if share else {"decoder_vocab_size": 50}
    model = random_model(tiny_config(share_encoder_decoder_embeddings=share, tie_word_embeddings=tie,
                                     **separate_vocabulary))
    assert model.model.encoder.embed_tokens is not model.model.decoder.embed_tokens or (share and not tie)
    input_ids, attention_mask = source_batch()
    model.save_pretrained(tmp_path)
    loaded, info = HeadAttnForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.eval()(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS).logits,
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS).logits)
    assert (loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight) == tie
    state = load_file(tmp_path / "model.safetensors")
    save_file({key: value for key, value in state.items() if "embed_tokens" not in key and "shared" not in key},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = HeadAttnForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"} <= set(info["missing_keys"])
    assert not any(parameter.is_meta for parameter in loaded.parameters())
    assert torch.isfinite(loaded.model.encoder.embed_tokens.weight).all()


def _every_model_class_untied():
    """(class, config) for every model class of both families, built with tie_word_embeddings=False; the Transformer
    with source and target embeddings shared and separate."""
    from hf_headattn.auto_classes import FAMILIES

    for config_class, model_classes in FAMILIES.items():
        for model_class in model_classes:
            if config_class is HeadAttnRNNConfig:
                yield pytest.param(model_class, rnn_config(tie_word_embeddings=False), id=model_class.__name__)
                continue
            for share in (True, False):
                separate_vocabulary = {} if share else {"decoder_vocab_size": 50}
                yield pytest.param(model_class, tiny_config(tie_word_embeddings=False,
                                                            share_encoder_decoder_embeddings=share,
                                                            **separate_vocabulary),
                                   id=f"{model_class.__name__}-{'shared' if share else 'separate'}")


@pytest.mark.parametrize("model_class, config", list(_every_model_class_untied()))
def test_every_model_class_untied_saves_and_reloads_the_same_weights(model_class, config, tmp_path):
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(tmp_path)
    loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    saved, reloaded = model.state_dict(), loaded.state_dict()
    assert set(reloaded) == set(saved)
    for key, value in saved.items():
        assert torch.equal(reloaded[key], value), f"{model_class.__name__}: {key} differs after reloading"
    shares = getattr(config, "share_encoder_decoder_embeddings", False)
    encoder, decoder = loaded.get_encoder().embed_tokens.weight, loaded.get_decoder().embed_tokens.weight
    assert (encoder is decoder) == shares  # one embedding for source and target, as saved
    if loaded.get_output_embeddings() is not None:
        assert loaded.get_output_embeddings().weight is not decoder  # untied: its own output projection


# ------------------------------------------------------------------------------------------------ generate
def test_generate_without_a_source_answers_as_marian():
    model = random_model(tiny_config())
    marian = model.to_marian()
    for reference in (marian, model):
        with pytest.raises(ValueError, match="`bos_token_id` has to be defined when no `input_ids` are provided"):
            reference.generate(max_new_tokens=3)
    # with a BOS id, both translate a source of that one token
    expected = marian.generate(bos_token_id=2, max_new_tokens=4, do_sample=False)
    assert torch.equal(model.generate(bos_token_id=2, max_new_tokens=4, do_sample=False), expected)
    assert torch.equal(model.generate(torch.tensor([[2]]), max_new_tokens=4, do_sample=False), expected)


# ------------------------------------------------------------------------------------------------ outputs
def _structure(value):
    """Nested tuples of shapes."""
    if isinstance(value, tuple):
        return tuple(_structure(item) for item in value)
    if torch.is_tensor(value):
        return tuple(value.shape)
    return type(value).__name__


def _kept_heads(model, site):
    config = model.config
    layers = config.encoder_layers if site == ENCODER_SELF_ATTENTION else config.decoder_layers
    return [len(config.kept_heads(site, layer)) for layer in range(layers)]


def test_attentions_and_hidden_states_sit_where_marians_do(variant):
    name, model = variant
    marian = marian_like(model)
    input_ids, attention_mask = source_batch()
    labels = DECODER_INPUT_IDS[:, 1:].contiguous()
    flags = dict(output_attentions=True, output_hidden_states=True, return_dict=False)
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False, **flags)
        theirs = marian(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False, **flags)
    # loss, logits, decoder hidden states, decoder attentions, cross attentions, encoder output, encoder hidden
    # states, encoder attentions, then this package's additions (ce_loss, and aux_loss/head_kl for variants with them)
    assert len(theirs) == 8 and len(ours) >= 9
    expected = list(_structure(theirs))
    heads = {3: _kept_heads(model, DECODER_SELF_ATTENTION), 4: _kept_heads(model, CROSS_ATTENTION),
             7: _kept_heads(model, ENCODER_SELF_ATTENTION)}
    for position, per_layer in heads.items():  # pruned modules return their kept heads only
        expected[position] = tuple((shape[0], kept, *shape[2:]) for shape, kept in zip(expected[position], per_layer))
    assert list(_structure(ours[:8])) == expected, name
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True,
                    output_hidden_states=True)
    torch.testing.assert_close(ours[8], outputs.ce_loss)  # the additions come after Marian's fields
    assert len(outputs.encoder_hidden_states) == model.config.encoder_layers + 1  # embeddings + every layer
    assert len(outputs.decoder_hidden_states) == model.config.decoder_layers + 1


def test_generate_returns_one_tensor_per_layer_at_every_step(variant):
    name, model = variant
    input_ids, attention_mask = source_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3, min_new_tokens=3,
                         num_beams=2, output_attentions=True, output_hidden_states=True, return_dict_in_generate=True)
    layers = model.config.decoder_layers
    assert len(out.encoder_attentions) == model.config.encoder_layers
    assert len(out.encoder_hidden_states) == model.config.encoder_layers + 1
    assert len(out.decoder_attentions) == len(out.cross_attentions) == len(out.decoder_hidden_states) == 3
    for step in range(3):
        assert len(out.decoder_attentions[step]) == len(out.cross_attentions[step]) == layers, name
        assert len(out.decoder_hidden_states[step]) == layers + 1
        for weights in out.cross_attentions[step]:
            assert weights.shape[0] == input_ids.shape[0] * 2 and weights.shape[-1] == input_ids.shape[1]


def test_the_lstm_returns_one_attention_per_attention_module():
    """The LSTM has one source attention, after its top layer (input feeding): one tensor, whatever the layers."""
    model = random_rnn_model(rnn_config(encoder_layers=2, decoder_layers=3, num_heads=2, num_hops=2))
    input_ids, attention_mask = source_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                output_attentions=True, output_hidden_states=True)
    assert len(out.cross_attentions) == 1 and out.cross_attentions[0].shape == (3, 2, 4, input_ids.shape[1])
    assert out.encoder_attentions is None and out.decoder_attentions is None  # no self-attention
    assert len(out.decoder_hidden_states) == 4 and len(out.encoder_hidden_states) == 3


# ------------------------------------------------------------------------------------------------ candidates
GENERATION = dict(max_new_tokens=6, do_sample=False, no_repeat_ngram_size=1)


@pytest.mark.parametrize("mode", ["assistant_model", "prompt_lookup_num_tokens"])
def test_assisted_and_prompt_lookup_decoding_run_or_are_refused_up_front(variant, mode, monkeypatch):
    _, model = variant
    input_ids, attention_mask = source_batch()
    one = dict(input_ids=input_ids[:1, :7], attention_mask=attention_mask[:1, :7])  # assisted decoding: batch 1
    candidates = {"assistant_model": copy.deepcopy(model)} if mode == "assistant_model" else {mode: 2}
    if not stateful(model.config):
        assert torch.equal(model.generate(**one, **candidates, **GENERATION), model.generate(**one, **GENERATION))
        return
    forwards = []
    monkeypatch.setattr(type(model), "forward", lambda *args, **kwargs: forwards.append(1))
    with pytest.raises(ValueError, match=r"Assisted and prompt-lookup decoding are not available.*"
                                         r"`cross_attention` of layers 0, 1 \((running_sum|csoftmax|csparsemax)\) keep "
                                         r"per-step state"):
        model.generate(**one, **candidates, **GENERATION)
    assert not forwards  # refused before any decoding


def test_beam_search_with_draft_settings_is_beam_search_for_stateful_variants():
    """Transformers ignores draft settings under beam search (and says so); so does the refusal."""
    model = random_model(tiny_config(**VARIANT_CONFIGS["running_sum"]))
    input_ids, attention_mask = source_batch()
    one = dict(input_ids=input_ids[:1], attention_mask=attention_mask[:1], num_beams=2, max_new_tokens=5)
    assert torch.equal(model.generate(**one, prompt_lookup_num_tokens=2), model.generate(**one))


def test_the_lstm_refuses_assisted_decoding_up_front():
    model = random_rnn_model(rnn_config())
    input_ids, attention_mask = source_batch()
    forwards = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(model), "forward", lambda *args, **kwargs: forwards.append(1))
        with pytest.raises(ValueError, match="Assisted and prompt-lookup decoding are not available.*the decoder's "
                                             "recurrent states and attention history keep per-step state"):
            model.generate(input_ids=input_ids[:1], attention_mask=attention_mask[:1], prompt_lookup_num_tokens=2,
                           **GENERATION)
    assert not forwards  # refused before any decoding, on every Transformers release


# ------------------------------------------------------------------------------------------------ continuing
def _continuation_scores(model, input_ids, attention_mask):
    """Scores of 4 greedy steps continued from the cache `generate` returned after 4 steps, and of steps 5-8 of one
    8-step run. The continuation passes the decoder mask over the whole sequence, which tells Transformers that the
    decoder ids include the cached positions (its rule for restarting from a cache)."""
    settings = dict(do_sample=False, return_dict_in_generate=True, output_scores=True)
    full = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, min_new_tokens=8,
                          **settings)
    first = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, min_new_tokens=4,
                           **settings)
    cache = first[CACHE_NAME]
    assert cache is not None and cache.get_seq_length() == 4
    continued = model.generate(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=first.sequences,
                               decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=4,
                               min_new_tokens=4, **{CACHE_NAME: cache}, **settings)
    assert torch.equal(continued.sequences, full.sequences)
    return torch.stack(continued.scores), torch.stack(full.scores[4:])


def test_generation_continues_from_a_returned_cache(variant):
    name, model = variant
    input_ids, attention_mask = source_batch()
    continued, full = _continuation_scores(model, input_ids, attention_mask)
    finite = torch.isfinite(full)
    assert torch.equal(torch.isfinite(continued), finite)
    torch.testing.assert_close(continued[finite], full[finite], atol=1e-5, rtol=1e-5, msg=name)


def test_the_lstm_continues_from_a_returned_cache():
    input_ids, attention_mask = source_batch()
    continued, full = _continuation_scores(random_rnn_model(rnn_config()), input_ids, attention_mask)
    finite = torch.isfinite(full)
    torch.testing.assert_close(continued[finite], full[finite], atol=1e-5, rtol=1e-5)
