"""What Transformers' common model tests expect of a model, checked on both families: missing tied weights are
reported and initialised as `MarianMTModel` does, `get_encoder(modality=...)` follows `PreTrainedModel`'s contract,
returned attentions and hidden states are the tensors the forward pass used (so `retain_grad()` sees gradients),
the LSTM returns embeddings + one hidden state per layer, and constant fertility works from `inputs_embeds`."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MarianConfig, MarianMTModel
from transformers.exporters.utils import is_multimodal

from hf_headattn import HeadAttnForConditionalGeneration, HeadAttnModel
from hf_headattn.runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration, HeadAttnRNNModel

from helpers import PAD, TRANSFORMER_VARIANTS, random_model, random_rnn_model, rnn_config, source_batch, tiny_config


DECODER_INPUT_IDS = torch.tensor([[PAD, 5, 6, 7], [PAD, 8, 9, 10], [PAD, 11, 12, 13]])


def _drop_from_checkpoint(folder, fragments):
    path = folder / "model.safetensors"
    state = load_file(path)
    save_file({key: value for key, value in state.items() if not any(part in key for part in fragments)}, path,
              metadata={"format": "pt"})


# ------------------------------------------------------------------------------------------------ missing weights
@pytest.mark.parametrize("shared", [True, False])
def test_missing_embeddings_are_reported_and_initialised_like_marian(shared, tmp_path):
    """A checkpoint without its token embeddings: Marian lists every tied name as missing and initialises them
    (normal(0, init_std), padding row 0), still tied; so must this model, on a real device, not meta."""
    sizes = dict(vocab_size=64, decoder_vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 max_position_embeddings=64, pad_token_id=PAD, eos_token_id=1, decoder_start_token_id=PAD,
                 share_encoder_decoder_embeddings=shared)
    results = {}
    for name, model in (("marian", MarianMTModel(MarianConfig(**sizes))),
                        ("headattn", HeadAttnForConditionalGeneration(tiny_config(**sizes)))):
        folder = tmp_path / name
        model.save_pretrained(folder)
        _drop_from_checkpoint(folder, ["shared", "embed_tokens", "lm_head"])
        loaded, info = type(model).from_pretrained(folder, output_loading_info=True)
        results[name] = loaded, set(info["missing_keys"])

    (_, marian_missing), (model, missing) = results["marian"], results["headattn"]
    assert missing == marian_missing and missing
    for embeddings in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
        weight = embeddings.weight
        assert weight.device.type == "cpu"
        assert weight[PAD].abs().sum() == 0 and weight.std().item() == pytest.approx(model.config.init_std, rel=0.2)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    if shared:
        assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    input_ids, attention_mask = source_batch()
    assert model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=3).shape[0] == 3


# ------------------------------------------------------------------------------------------------ get_encoder
@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_get_encoder_follows_the_transformers_contract(family):
    if family == "transformer":
        model = random_model(tiny_config())
        base, head_class, base_class = model.model, HeadAttnForConditionalGeneration, HeadAttnModel
    else:
        model = random_rnn_model(rnn_config())
        base, head_class, base_class = model.model, HeadAttnRNNForConditionalGeneration, HeadAttnRNNModel
    assert isinstance(model, head_class) and isinstance(base, base_class)
    assert model.get_encoder() is base.encoder and base.get_encoder() is base.encoder
    for modality in ("image", "video", "audio"):  # no such encoder: the model itself, as PreTrainedModel does
        assert model.get_encoder(modality=modality) is model
        assert base.get_encoder(modality=modality) is base
    with pytest.raises(ValueError, match="modality"):
        model.get_encoder(modality="smell")
    assert not is_multimodal(model)  # Transformers' exporters then export it as one text model


# ------------------------------------------------------------------------------------------------ retain_grad



def _assert_every_returned_tensor_gets_a_gradient(outputs, names, loss_of):
    returned = {f"{name}[{i}]": tensor for name in names for i, tensor in enumerate(getattr(outputs, name))}
    assert returned
    for tensor in returned.values():
        tensor.retain_grad()
    loss_of(outputs).backward()
    without = sorted(name for name, tensor in returned.items() if tensor.grad is None)
    assert not without, f"retain_grad() got no gradient for {without}: returned tensors the graph did not use"


@pytest.mark.parametrize("variant", list(TRANSFORMER_VARIANTS))
def test_returned_attentions_and_hidden_states_are_the_graphs_tensors(variant):
    model = random_model(tiny_config(**TRANSFORMER_VARIANTS[variant]), std=0.1).train()
    input_ids, attention_mask = source_batch()
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                    output_attentions=True, output_hidden_states=True)
    _assert_every_returned_tensor_gets_a_gradient(
        outputs, ["encoder_hidden_states", "decoder_hidden_states", "encoder_attentions", "decoder_attentions",
                  "cross_attentions"], lambda out: out.logits.sum())


@pytest.mark.parametrize("config", [{}, {"encoder_layers": 2, "decoder_layers": 3, "num_heads": 2, "num_hops": 2}])
def test_rnn_returns_embeddings_and_one_hidden_state_per_layer(config):
    model = random_rnn_model(rnn_config(**config), std=0.1).train()
    input_ids, attention_mask = source_batch()
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                    output_hidden_states=True)
    encoder_states, decoder_states = outputs.encoder_hidden_states, outputs.decoder_hidden_states
    assert len(encoder_states) == model.config.encoder_layers + 1
    assert len(decoder_states) == model.config.decoder_layers + 1
    assert encoder_states[0].shape == (3, input_ids.shape[1], model.config.embedding_size)
    assert decoder_states[0].shape == (3, DECODER_INPUT_IDS.shape[1], model.config.embedding_size)
    for states in (*encoder_states[1:], *decoder_states[1:]):
        assert states.shape[-1] == model.config.hidden_size
    # the last encoder layer is the memory the decoder attends to; per-layer runs change nothing
    torch.testing.assert_close(encoder_states[-1], outputs.encoder_last_hidden_state, rtol=0, atol=0)
    model.eval()
    with torch.no_grad():
        fused = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS)
        per_layer = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                          output_hidden_states=True)
    torch.testing.assert_close(per_layer.logits, fused.logits, rtol=0, atol=1e-6)


def test_rnn_encoder_hidden_states_and_embeddings_are_the_graphs_tensors():
    """Every encoder layer's states feed the next layer, and both stacks' embeddings feed their LSTMs. (Decoder
    layers run one target position at a time, so their states over time are stacked afterwards: a new tensor.)"""
    model = random_rnn_model(rnn_config(encoder_layers=2, decoder_layers=2), std=0.1).train()
    input_ids, attention_mask = source_batch()
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                    output_hidden_states=True)
    returned = [*outputs.encoder_hidden_states, outputs.decoder_hidden_states[0]]
    for tensor in returned:
        tensor.retain_grad()
    outputs.logits.sum().backward()
    assert all(tensor.grad is not None for tensor in returned)


# ------------------------------------------------------------------------------------------------ inputs_embeds
@pytest.mark.parametrize("variant", ["csoftmax", "csparsemax"])
def test_constant_fertility_accepts_inputs_embeds(variant):
    model = random_model(tiny_config(cross_attention=variant, fertility="constant", constant_fertility=1.5))
    input_ids, attention_mask = source_batch()
    inputs_embeds = model.get_input_embeddings()(input_ids) * model.model.encoder.embed_scale
    with torch.no_grad():
        from_ids = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS)
        from_embeds = model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                            decoder_input_ids=DECODER_INPUT_IDS)
    torch.testing.assert_close(from_embeds.logits, from_ids.logits)


def test_fertility_from_the_source_ids_still_needs_input_ids():
    model = random_model(tiny_config(cross_attention="csparsemax", fertility="guided"))
    input_ids, attention_mask = source_batch()
    with pytest.raises(ValueError, match="'guided' fertility .* from `input_ids`"):
        model(inputs_embeds=model.get_input_embeddings()(input_ids), attention_mask=attention_mask,
              decoder_input_ids=DECODER_INPUT_IDS)
