"""Sparse and constrained attention variants (Malaviya et al., 2018) inside the Transformer: fertility bounds hold
through beam search, the scan in training equals step-by-step decoding, the sink and exhaustion options, and
fertility strategies computed by the model itself."""

import pytest
import torch

from hf_headattn.runtime.attention_sparse import ConstrainedAttention
from hf_headattn.runtime.sparse_attention import csparsemax

from helpers import random_model, source_batch, tiny_config


def _constrained_modules(model):
    return [module for module in model.modules() if isinstance(module, ConstrainedAttention)]


def _record_cumulative_attention(model):
    """Every call's cumulative attention, from a forward hook on each constrained variant."""
    seen = []

    def hook(module, args, result):
        seen.append(result.state["cumulative"].detach().clone())

    for module in _constrained_modules(model):
        module.register_forward_hook(hook)
    return seen


@pytest.mark.parametrize("variant", ["csoftmax", "csparsemax"])
@pytest.mark.parametrize("fertility", ["constant", "guided", "predicted"])
def test_beam_search_never_exceeds_a_source_tokens_fertility(variant, fertility):
    config = tiny_config(cross_attention=variant, fertility=fertility, constant_fertility=1.0)
    model = random_model(config, std=0.3)
    if fertility == "guided":
        with torch.no_grad():
            model.model.encoder.source_fertility.guided_fertility.copy_(torch.randint(1, 3, (64,)).float())
    input_ids, attention_mask = source_batch((7, 4, 9))
    with torch.no_grad():
        bounds = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).fertility
    assert bounds.shape == (3, 9) and (bounds[attention_mask == 0] == 0).all() and (bounds[attention_mask == 1] > 0).all()
    seen = _record_cumulative_attention(model)
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=5, max_new_tokens=12,
                            do_sample=False, output_attentions=True, return_dict_in_generate=True)
    assert len(seen) >= 12 * len(_constrained_modules(model))
    beam_bounds = bounds.repeat_interleave(5, dim=0)[:, None, :]
    for cumulative in seen:
        assert (cumulative <= beam_bounds + 1e-6).all()
    # the returned weights cover the source tokens only, and never exceed the tokens' bounds either
    for step in output.cross_attentions:
        assert step[-1].shape[-1] == 9 and (step[-1] <= 1 + 1e-6).all()


def test_training_scan_equals_step_by_step_decoding_and_the_sink_takes_the_rest():
    model = random_model(tiny_config(cross_attention={"type": "csparsemax", "layers": [1]}, constant_fertility=1.0))
    input_ids, attention_mask = source_batch((5, 3, 6))
    decoder_input_ids = torch.randint(2, 64, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                     output_attentions=True)
        weights = full.cross_attentions[1]  # [batch, heads, 9 target steps, 6 sources]
    cumulative = weights.cumsum(dim=2)
    source_real = attention_mask.bool()[:, None, None, :]
    assert (cumulative <= 1.0 + 1e-6).all() and (weights[~source_real.expand_as(weights)] == 0).all()
    # with 9 steps and at most 6 units of fertility, the sink must take the remainder: rows sum to <= 1
    assert (weights.sum(-1) <= 1 + 1e-6).all() and (weights.sum(-1)[0, :, -1] < 1).all()


def test_the_sink_key_and_value_are_cached_with_the_sources_once_a_sentence():
    """The <SINK>'s key and value join the source tokens' in the cross-attention cache when the source is projected,
    so that no decoding step rebuilds them; without the sink the cache holds the source tokens alone."""
    input_ids, attention_mask = source_batch((5, 3, 6))
    for sink, cached_keys in ((True, 7), (False, 6)):
        config = tiny_config(cross_attention={"type": "csparsemax", "layers": [1], "sink": sink},
                             constant_fertility=1.0)
        model = random_model(config, std=0.3)
        with torch.no_grad():
            outputs = model(input_ids=input_ids, attention_mask=attention_mask,
                            decoder_input_ids=torch.full((3, 1), 2), use_cache=True)
        cache = outputs.past_key_values
        layer = cache.cross_attention_cache.layers[1]
        assert layer.keys.shape[-2] == layer.values.shape[-2] == cached_keys
        assert cache.cross_attention_cache.layers[0].keys.shape[-2] == 6  # softmax layer: the sources alone
        if sink:
            variant = model.model.decoder.layers[1].encoder_attn.variant
            assert torch.equal(layer.keys[:, :, -1], variant.sink_key.expand(3, -1, -1))
            assert torch.equal(layer.values[:, :, -1], variant.sink_value.expand(3, -1, -1))


def test_exhaustion_bonus_is_z_plus_c_u():
    """One head, one step by hand: z' = z + c u with u = f - beta, then csparsemax with the sink key."""
    config = tiny_config(cross_attention={"type": "csparsemax", "layers": [0], "exhaustion": 0.5},
                         constant_fertility=1.5, decoder_layers=1, encoder_layers=1)
    model = random_model(config, std=0.3).double()
    attention = model.model.decoder.layers[0].encoder_attn
    variant = attention.variant
    torch.manual_seed(0)
    x = torch.randn(1, 2, 32, dtype=torch.float64)
    memory = torch.randn(1, 4, 32, dtype=torch.float64)
    from hf_headattn.runtime.attention_base import AttentionMask

    mask = AttentionMask(torch.ones(1, 1, 1, 4, dtype=torch.bool), fertility=torch.full((1, 4), 1.5))
    _, result = attention(x, mask, key_value_states=memory, output_attentions=True)
    q = attention.q_proj(x).view(1, 2, 4, 8).transpose(1, 2)
    k = attention.k_proj(memory).view(1, 4, 4, 8).transpose(1, 2)
    z = q @ k.transpose(-1, -2) / 8**0.5  # [1, heads, 2, 4]
    sink = torch.einsum("bhtd,hd->bht", q, variant.sink_key) / 8**0.5
    beta = torch.zeros(1, 4, 4, dtype=torch.float64)
    for t in range(2):
        u = 1.5 - beta
        scores = torch.cat([z[:, :, t] + 0.5 * u, sink[:, :, t, None]], dim=-1)
        bound = torch.cat([u, torch.full((1, 4, 1), float("inf"), dtype=torch.float64)], dim=-1)
        alpha = csparsemax(scores, bound)
        torch.testing.assert_close(result.weights[:, :, t], alpha[..., :4])
        beta = beta + alpha[..., :4]
    torch.testing.assert_close(result.state["cumulative"], beta)


@pytest.mark.parametrize("spec, message", [
    ({"type": "csparsemax", "exhaustion": -1}, "`exhaustion` .* must be a finite number >= 0"),
    ({"type": "csoftmax", "sink": "yes"}, "`sink` must be true or false"),
])
def test_bad_constrained_options_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(cross_attention=spec)


def test_constrained_variants_only_at_cross_attention_and_fertility_is_checked():
    with pytest.raises(ValueError, match="'csparsemax' cannot be used at `encoder_self_attention`"):
        tiny_config(encoder_self_attention="csparsemax")
    with pytest.raises(ValueError, match="Unknown fertility 'learned'; accepted: constant, guided, predicted"):
        tiny_config(cross_attention="csparsemax", fertility="learned")
    with pytest.raises(ValueError, match="`constant_fertility` must be a finite number > 0"):
        tiny_config(cross_attention="csparsemax", constant_fertility=0)


def test_sparsemax_attention_is_sparse_and_sums_to_one():
    model = random_model(tiny_config(encoder_self_attention="sparsemax", cross_attention="sparsemax"), std=0.5)
    input_ids, attention_mask = source_batch((7, 4, 9))
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :5],
                    output_attentions=True)
    for weights in (*out.encoder_attentions, *out.cross_attentions):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert (weights[~attention_mask.bool()[:, None, None, :].expand_as(weights)] == 0).all()
    assert (out.encoder_attentions[0] == 0).float().mean() > 0.2  # exact zeros, not tiny softmax weights


@pytest.mark.parametrize("fertility", ["guided", "predicted"])
def test_training_command_learns_fertilities_from_eflomal_alignments(fertility, tmp_path):
    """The training command aligns the training data, fills the GUIDED table or trains the PREDICTED tagger,
    trains the NMT model and saves a folder that loads through remote code with the learnt fertilities."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_headattn.toy_corpus import write_toy_corpus
    from hf_headattn.training import train

    paths = write_toy_corpus(tmp_path / "data", n_train=300, n_valid=20, seed=4)
    train(["--train_source", str(paths["train.src"]), "--train_target", str(paths["train.tgt"]),
           "--output_dir", str(tmp_path / "model"), "--vocab_size", "150", "--d_model", "32", "--layers", "1",
           "--heads", "2", "--ffn_dim", "64", "--max_steps", "3", "--per_device_train_batch_size", "16",
           "--cross_attention", "csparsemax", "--fertility", fertility,
           *(["--fertility_predictor_epochs", "2"] if fertility == "predicted" else [])])
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model", trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model", trust_remote_code=True)
    batch = tokenizer(["der hund sieht die katze ."], return_tensors="pt")
    with torch.no_grad():
        bounds = model.get_encoder()(**batch).fertility[0]
    assert model.config.fertility == fertility and bounds.shape == batch["input_ids"].shape[1:]
    if fertility == "guided":  # learnt integers, not the all-ones default everywhere
        assert torch.equal(bounds, bounds.round()) and (bounds >= 1).all()
        assert (model.get_encoder().source_fertility.guided_fertility != 1).any()
    else:  # a few tagger steps already pull the expected fertility towards the aligner's 1 (+1 slack) of most tokens
        from hf_headattn.runtime.fertility import FertilityPredictor

        torch.manual_seed(0)
        untrained = FertilityPredictor(len(tokenizer), embedding_size=128, hidden_size=128, max_fertility=10)
        with torch.no_grad():
            untrained_bounds = untrained.expected_fertility(batch["input_ids"])[0]
        assert (bounds - 2).abs().mean() < (untrained_bounds - 2).abs().mean()
