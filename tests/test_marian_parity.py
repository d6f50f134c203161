"""The softmax model imported from a MarianMTModel computes exactly what Marian computes."""

import pytest
import torch
from transformers import MarianConfig, MarianMTModel

from hf_headattn import HeadAttnForConditionalGeneration


@pytest.fixture(scope="module", params=[True, False], ids=["shared-embeddings", "separate-embeddings"])
def marian_pair(request):
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=80,
        decoder_vocab_size=80 if request.param else 70,
        share_encoder_decoder_embeddings=request.param,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=69,
        eos_token_id=0,
        decoder_start_token_id=69,
        forced_eos_token_id=None,
        scale_embedding=True,
    )
    marian = MarianMTModel(config).eval()
    with torch.no_grad():  # large random weights, so that generation is not degenerate
        for name, parameter in marian.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:
                parameter.normal_(0.0, 0.3)
        marian.final_logits_bias.normal_()
    return marian, HeadAttnForConditionalGeneration.from_marian(marian)


def _inputs():
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(1, 69, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:], attention_mask[1, 6:] = 69, 0
    input_ids[0, -1] = input_ids[1, 5] = input_ids[2, -1] = 0
    return input_ids, attention_mask


def test_logits_match_marian(marian_pair):
    marian, model = marian_pair
    input_ids, attention_mask = _inputs()
    decoder_input_ids = torch.randint(1, 69, (3, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = marian(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        actual = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 5])
def test_generation_matches_marian(marian_pair, num_beams):
    marian, model = marian_pair
    input_ids, attention_mask = _inputs()
    # Random models fall into repeating one token; forbidding repeats makes every step's argmax matter.
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, num_beams=num_beams,
                  do_sample=False, no_repeat_ngram_size=1)
    expected = marian.generate(**kwargs)
    actual = model.generate(**kwargs)
    assert len(set(map(tuple, expected[:, 1:].tolist()))) > 1, "degenerate test: every sentence got the same output"
    assert torch.equal(actual, expected)


def test_from_marian_accepts_a_saved_folder(marian_pair, tmp_path):
    marian, model = marian_pair
    marian.save_pretrained(tmp_path)
    reloaded = HeadAttnForConditionalGeneration.from_marian(str(tmp_path))
    input_ids, attention_mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits,
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits,
        )


def test_from_marian_can_swap_in_a_variant(marian_pair):
    marian, _ = marian_pair
    model = HeadAttnForConditionalGeneration.from_marian(marian, cross_attention={"type": "running_sum", "layers": [-1]})
    assert model.config.attention_variant("cross_attention", 2) == ("running_sum", {})
    assert model.config.attention_variant("cross_attention", 0) == ("softmax", {})


def test_to_marian_gives_back_marian_with_the_same_logits_and_translations(marian_pair):
    marian, model = marian_pair
    back = model.to_marian()
    assert type(back) is MarianMTModel and back.config.share_encoder_decoder_embeddings == \
        marian.config.share_encoder_decoder_embeddings
    for key, value in marian.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    input_ids, attention_mask = _inputs()
    decoder_input_ids = torch.randint(1, 69, (3, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        actual = back(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=0)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, num_beams=4,
                  do_sample=False, no_repeat_ngram_size=1)
    assert torch.equal(back.generate(**kwargs), model.generate(**kwargs))


@pytest.mark.parametrize("overrides, message", [
    ({"cross_attention": {"type": "sparsemax", "layers": [-1]}},
     "cross_attention of layer 2 uses the 'sparsemax' attention variant"),
    ({"encoder_self_attention": "mma"}, "encoder_self_attention of layer 0 uses the 'mma' attention variant"),
])
def test_to_marian_refuses_what_marian_cannot_compute(marian_pair, overrides, message):
    marian, _ = marian_pair
    with pytest.raises(ValueError, match=message):
        HeadAttnForConditionalGeneration.from_marian(marian, **overrides).to_marian()
    pruned = HeadAttnForConditionalGeneration.from_marian(marian)
    pruned.prune_heads({"decoder.layers.0.encoder_attn": [1]})
    with pytest.raises(ValueError, match="pruned heads"):
        pruned.to_marian()
