"""Guided alignment (Garg et al., 2019) inside the models: the cost between the guided heads' cross-attention and
`alignment_links`, added to the loss both families return (runtime/guided_alignment.py)."""

import shutil

import pytest
import torch

from hf_headattn import (HeadAttnConfig, HeadAttnForConditionalGeneration, HeadAttnRNNConfig,
                         HeadAttnRNNForConditionalGeneration)
from hf_headattn.runtime.attention_base import CROSS_ATTENTION
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.runtime.guided_alignment import GUIDED_ALIGNMENT_COSTS, guided_alignment_sum
from helpers import random_model, random_rnn_model, rnn_config, source_batch, tiny_config

CROSS_VARIANTS = sorted(name for name, variant in ATTENTION_VARIANTS.items() if CROSS_ATTENTION in variant.sites)
RNN_TRANSFORMS = ("softmax", "sparsemax", "csoftmax", "csparsemax")


def _batch(target_len=5, seed=3):
    """Sources of lengths 7, 4, 9; labels; links of each target position to one real source position (a diagonal),
    two links for position 1 of sentence 0, and no link for position 2 of sentence 1."""
    input_ids, attention_mask = source_batch()
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, 64, (3, target_len), generator=generator)
    labels[1, -1] = -100
    links = torch.zeros(3, target_len, input_ids.shape[1])
    for row, length in enumerate(attention_mask.sum(-1).tolist()):
        for t in range(target_len):
            links[row, t, t % length] = 1.0
    links[0, 1] = 0.0
    links[0, 1, [2, 3]] = 0.5
    links[1, 2] = 0.0
    links[1, -1] = 0.0  # the ignored label
    return input_ids, attention_mask, labels, links


def _transformer(variant, **overrides):
    config = tiny_config(cross_attention={"type": variant, "layers": [0, 1]}, guided_alignment_weight=0.5,
                         guided_alignment_layer=0, guided_alignment_heads=[1, 2], **overrides)
    return random_model(config).train()


def _rnn(transform, **overrides):
    config = rnn_config(attention_transform=transform, num_heads=2, guided_alignment_weight=0.5,
                        guided_alignment_heads=[1], constant_fertility=1.0, **overrides)
    return random_rnn_model(config).train()


# ------------------------------------------------------------------------------------------------ the cost
@pytest.mark.parametrize("cost", sorted(GUIDED_ALIGNMENT_COSTS))
def test_a_cost_is_zero_where_the_attention_is_the_links_distribution(cost):
    *_, links = _batch()
    attention = links[:, None].expand(-1, 2, -1, -1).clone()
    aligned = links.sum(-1) > 0
    attention[~aligned[:, None].expand(-1, 2, -1)] = 1.0 / links.shape[-1]  # anything where nothing is linked
    if cost == "mult":  # Marian's mult: 0 when all the attention is on linked tokens, however it is split
        attention[0, :, 1] = 0.0
        attention[0, :, 1, 2] = 1.0
    assert guided_alignment_sum(attention, links, cost).item() == pytest.approx(0.0, abs=1e-6)
    off = torch.roll(attention, 1, dims=-1)
    assert guided_alignment_sum(off, links, cost).item() > 0.5


def test_positions_without_links_are_left_out_of_the_cost():
    *_, links = _batch()
    attention = torch.softmax(torch.randn(3, 2, *links.shape[1:]), dim=-1)
    changed = attention.clone()
    changed[1, :, 2] = torch.softmax(torch.randn(2, links.shape[-1]), dim=-1)  # sentence 1, position 2: no link
    for cost in GUIDED_ALIGNMENT_COSTS:
        assert guided_alignment_sum(changed, links, cost) == guided_alignment_sum(attention, links, cost)


def test_links_of_the_wrong_shape_are_refused_with_the_shapes():
    input_ids, attention_mask, labels, links = _batch()
    model = _transformer("softmax")
    with pytest.raises(ValueError, match=r"`alignment_links` has shape \(3, 5, 8\); it must be .* \(3, 5, 9\)"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links[..., :8])
    with pytest.raises(ValueError, match="pass both"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels.clamp(min=0),
              alignment_links=links)


# ------------------------------------------------------------------------------------------------ the models
def _assert_guided_loss(model, guided_parameters, unguided_parameters):
    input_ids, attention_mask, labels, links = _batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    assert torch.isfinite(out.alignment_loss) and out.alignment_loss > 0
    aux_loss = getattr(out, "aux_loss", None)  # DHICM's, added as before
    torch.testing.assert_close(out.loss, out.ce_loss + (0 if aux_loss is None else aux_loss) + 0.5 * out.alignment_loss)
    gradients = torch.autograd.grad(out.alignment_loss, guided_parameters + unguided_parameters, allow_unused=True)
    for gradient in gradients[:len(guided_parameters)]:
        assert gradient is not None and torch.isfinite(gradient).all() and gradient.abs().sum() > 0
    for gradient in gradients[len(guided_parameters):]:  # what the guided heads' attention does not depend on
        assert gradient is None or gradient.abs().sum() == 0


@pytest.mark.parametrize("variant", CROSS_VARIANTS)
def test_every_cross_attention_variant_adds_the_cost_and_its_gradient_reaches_the_guided_layer(variant):
    model = _transformer(variant)
    decoder_layers, encoder_layers = model.model.decoder.layers, model.model.encoder.layers
    # guided: layer 0's cross-attention and the encoder it reads; not: anything above layer 0's cross-attention
    _assert_guided_loss(model, [decoder_layers[0].encoder_attn.q_proj.weight, encoder_layers[1].ffn.fc1.weight],
                        [decoder_layers[1].encoder_attn.q_proj.weight, decoder_layers[0].ffn.fc1.weight])


@pytest.mark.parametrize("transform", RNN_TRANSFORMS)
def test_the_lstm_adds_the_cost_and_its_gradient_reaches_the_attention(transform):
    model = _rnn(transform)
    _assert_guided_loss(model, [model.model.decoder.attention.query_proj.weight],
                        [model.generator.weight, model.generator.bias])  # (input feeding: all else is upstream)


def test_only_the_guided_heads_are_pulled():
    """The query rows of heads 1 and 2 (guided) get gradient from the cost; those of heads 0 and 3 do not."""
    model = _transformer("softmax")
    input_ids, attention_mask, labels, links = _batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    (gradient,) = torch.autograd.grad(out.alignment_loss, model.model.decoder.layers[0].encoder_attn.q_proj.weight)
    per_head = gradient.view(4, -1).abs().sum(-1)
    assert per_head[1] > 0 and per_head[2] > 0 and per_head[0] == 0 and per_head[3] == 0


@pytest.mark.parametrize("family", ["transformer", "lstm"])
@pytest.mark.parametrize("cost", ["ce", "mse"])
def test_the_cost_is_zero_when_the_models_attention_is_the_links(family, cost):
    input_ids, attention_mask, labels, links = _batch()
    model = _transformer("softmax", guided_alignment_cost=cost) if family == "transformer" else _rnn(
        "softmax", guided_alignment_cost=cost)
    with torch.no_grad():
        first = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
        own = first.guided_attention.mean(1) * (links.sum(-1, keepdim=True) > 0)  # the model's attention as links
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=own)
    assert first.alignment_loss > 0.1
    assert out.alignment_loss.item() == pytest.approx(0.0, abs=1e-5)


def _sparse_rows_with_a_zero(model, input_ids, attention_mask, labels):
    """Links, per target position, to a source token the guided heads' sparse attention gives exactly 0."""
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    weights = out.cross_attentions[0] if len(out.cross_attentions) > 0 else None
    heads = model.config.guided_alignment_heads
    weights = weights[:, heads].max(dim=1).values  # zero in every guided head
    links = torch.zeros_like(weights)
    zeros = (weights == 0) & attention_mask.bool()[:, None, :]
    for b in range(links.shape[0]):
        for t in range(links.shape[1]):
            candidates = zeros[b, t].nonzero()
            if len(candidates):
                links[b, t, candidates[0, 0]] = 1.0
    assert links.sum() >= 3, "the random model's sparse attention has too few exact zeros for this test"
    return links


@pytest.mark.parametrize("variant", sorted(name for name in CROSS_VARIANTS if ATTENTION_VARIANTS[name].exact_zeros))
def test_links_to_exact_zeros_of_sparse_attention_give_a_finite_useful_gradient(variant):
    """Links put where the guided heads' sparsemax / entmax / constrained attention is exactly 0: the weights'
    Jacobian is 0 there, but the cost (on the heads' scores' softmax) is finite and pulls the queries."""
    # large queries: sparse attention with many exact zeros; small fertilities: csoftmax's spent budgets
    model = _transformer(variant, constant_fertility=0.3)
    with torch.no_grad():
        model.model.decoder.layers[0].encoder_attn.q_proj.weight.mul_(4.0)
    input_ids, attention_mask, labels, _ = _batch()
    links = _sparse_rows_with_a_zero(model, input_ids, attention_mask, labels)
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    assert torch.isfinite(out.alignment_loss)
    (gradient,) = torch.autograd.grad(out.alignment_loss, model.model.decoder.layers[0].encoder_attn.q_proj.weight)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0
    # and the gradient raises the linked tokens' attention: a small step against it lowers the cost
    with torch.no_grad():
        model.model.decoder.layers[0].encoder_attn.q_proj.weight.sub_(0.05 * gradient / gradient.norm())
        after = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    assert after.alignment_loss < out.alignment_loss


@pytest.mark.parametrize("transform", ["sparsemax", "csparsemax"])
def test_the_lstms_sparse_transforms_give_a_finite_useful_gradient_at_exact_zeros(transform):
    model = _rnn(transform)
    with torch.no_grad():
        model.model.decoder.attention.query_proj.weight.mul_(4.0)
    input_ids, attention_mask, labels, _ = _batch()
    model.config.guided_alignment_heads = [0, 1]  # the helper reads the zeros of every guided head
    links = _sparse_rows_with_a_zero(model, input_ids, attention_mask, labels)
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    (gradient,) = torch.autograd.grad(out.alignment_loss, model.model.decoder.attention.query_proj.weight)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0


def test_pruned_models_guide_the_heads_they_name_by_original_index():
    model = _transformer("softmax", pruned_heads={"decoder.layers.0.encoder_attn": [0]})
    _assert_guided_loss(model, [model.model.decoder.layers[0].encoder_attn.q_proj.weight],
                        [model.model.decoder.layers[1].encoder_attn.q_proj.weight])
    with pytest.raises(ValueError, match=r"`guided_alignment_heads` \[1\] of the guided layer were pruned"):
        model.prune_heads({"decoder.layers.0.encoder_attn": [1]})


def test_gradient_accumulation_scales_the_cost_like_the_cross_entropy():
    """Two halves with num_items_in_batch = the whole batch's tokens sum to the whole batch's loss."""
    model = _transformer("softmax").eval()
    input_ids, attention_mask, labels, links = _batch()
    tokens = labels.ne(-100).sum()
    with torch.no_grad():
        whole = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
        halves = [model(input_ids=input_ids[rows], attention_mask=attention_mask[rows], labels=labels[rows],
                        alignment_links=links[rows], num_items_in_batch=tokens).loss
                  for rows in (slice(0, 1), slice(1, 3))]
    torch.testing.assert_close(sum(halves), whole.loss)


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("family", ["transformer", "lstm"])
def test_the_guided_fields_save_and_load(family, tmp_path):
    model = _transformer("sparsemax", guided_alignment_cost="mse") if family == "transformer" else _rnn(
        "csparsemax", guided_alignment_cost="mult")
    model.save_pretrained(tmp_path)
    model_class = HeadAttnForConditionalGeneration if family == "transformer" else HeadAttnRNNForConditionalGeneration
    loaded = model_class.from_pretrained(tmp_path)
    for field in ("guided_alignment_weight", "guided_alignment_cost", "guided_alignment_heads"):
        assert getattr(loaded.config, field) == getattr(model.config, field), field
    if family == "transformer":
        assert loaded.config.guided_alignment_layer == 0


@pytest.mark.parametrize("overrides, message", [
    ({"guided_alignment_layer": 2}, r"`guided_alignment_layer`=2 is not a decoder layer: give an index in \[-2, 2\)"),
    ({"guided_alignment_heads": [4]}, r"`guided_alignment_heads`=\[4\].* in \[0, 4\)"),
    ({"guided_alignment_heads": []}, "non-empty list"),
    ({"guided_alignment_heads": [1, 1]}, "distinct"),
    ({"guided_alignment_cost": "kl"}, "Unknown guided_alignment_cost 'kl'; accepted: 'ce'"),
    ({"guided_alignment_weight": -1.0}, "`guided_alignment_weight` must be a finite number >= 0, got -1.0"),
])
def test_bad_guided_fields_are_refused_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_a_full_context_that_is_not_a_bool_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="guided_alignment_full_context must be True or False, got 'yes'") as error:
        tiny_config(guided_alignment_full_context="yes")
    assert error.value.fields == ("guided_alignment_full_context",)


def test_the_lstms_bad_guided_heads_are_refused():
    with pytest.raises(ValueError, match=r"`guided_alignment_heads`=\[2\].* in \[0, 2\)"):
        rnn_config(num_heads=2, guided_alignment_heads=[2])


def test_the_defaults_are_garg_et_al_s_penultimate_layer_one_head_and_no_guidance():
    for config in (HeadAttnConfig(), HeadAttnRNNConfig()):
        assert config.guided_alignment_weight == 0.0 and config.guided_alignment_heads == [0]
        assert config.guided_alignment_cost == "ce"
    assert HeadAttnConfig().guided_alignment_layer is None and HeadAttnConfig().guided_alignment_layer_index() == 4
    assert tiny_config(decoder_layers=1).guided_alignment_layer_index() == 0  # a one-layer decoder: its only layer


# ---------------------------------------------------------------------------------------- full target context
def _full_context_pair(variant="softmax"):
    """The same random weights as a model guided with Garg et al.'s full context and as one guided without it."""
    full = random_model(tiny_config(cross_attention=variant, guided_alignment_weight=0.5, guided_alignment_layer=1,
                                    guided_alignment_heads=[1], guided_alignment_full_context=True), std=0.5).eval()
    causal = HeadAttnForConditionalGeneration(HeadAttnConfig.from_dict(
        {**full.config.to_dict(), "guided_alignment_full_context": False})).eval()
    causal.load_state_dict(full.state_dict())
    return full, causal


@pytest.mark.parametrize("variant", ["softmax", "csparsemax"])
def test_full_context_guidance_reads_the_words_after_each_target_word_and_leaves_the_loss_of_words_alone(variant):
    full, causal = _full_context_pair(variant)
    input_ids, attention_mask, labels, links = _batch()
    later = labels.clone()
    later[0, 3] = 7 if labels[0, 3] != 7 else 8  # a later word of sentence 0
    outputs = {(name, key): model(input_ids=input_ids, attention_mask=attention_mask, labels=batch_labels,
                                  alignment_links=links)
               for name, model in (("full", full), ("causal", causal))
               for key, batch_labels in (("labels", labels), ("later", later))}
    # causal guidance: positions 0-3 (before the changed decoder input at 4) are unchanged; full context: they move
    assert torch.equal(outputs["causal", "labels"].guided_attention[0, :, :4],
                       outputs["causal", "later"].guided_attention[0, :, :4])
    assert (outputs["full", "labels"].guided_attention[0, :, :4]
            - outputs["full", "later"].guided_attention[0, :, :4]).abs().max() > 1e-4
    # the translation (logits, cross-entropy) is the causal pass's in both
    torch.testing.assert_close(outputs["full", "labels"].ce_loss, outputs["causal", "labels"].ce_loss)
    assert not torch.allclose(outputs["full", "labels"].alignment_loss, outputs["causal", "labels"].alignment_loss)


def test_full_context_guidance_of_a_padded_batch_is_each_sentence_alone():
    full, _ = _full_context_pair()
    input_ids, attention_mask, labels, links = _batch()
    batched = full(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    alone = full(input_ids=input_ids[1:2], attention_mask=attention_mask[1:2], labels=labels[1:2, :-1],
                 alignment_links=links[1:2, :-1])  # sentence 1 without its ignored last label
    torch.testing.assert_close(batched.guided_attention[1:2, :, :-1, :], alone.guided_attention, atol=1e-6, rtol=0)


def test_full_context_guidance_trains_the_guided_layer_and_the_layers_below_it():
    full, _ = _full_context_pair()
    full.train()
    input_ids, attention_mask, labels, links = _batch()
    outputs = full(input_ids=input_ids, attention_mask=attention_mask, labels=labels, alignment_links=links)
    outputs.alignment_loss.backward()
    decoder = full.model.decoder
    assert decoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert decoder.layers[1].encoder_attn.q_proj.weight.grad.abs().sum() > 0


def test_a_full_context_pass_is_refused_with_labels_and_with_a_cache():
    full, _ = _full_context_pair()
    input_ids, attention_mask, labels, _ = _batch()
    with pytest.raises(ValueError, match="lets every decoder position see the tokens it predicts"):
        full(input_ids=input_ids, attention_mask=attention_mask, labels=labels, full_target_context=True)
    with pytest.raises(ValueError, match="pass use_cache=False"):
        full(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels.clamp(min=2),
             full_target_context=True, use_cache=True)


# ------------------------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("family", ["transformer", "lstm"])
def test_generation_is_the_same_with_and_without_guidance_in_the_config(family):
    guided = (_transformer("csparsemax") if family == "transformer" else _rnn("csparsemax")).eval()
    config = guided.config.to_dict()
    config.update(guided_alignment_weight=0.0, guided_alignment_heads=[0])
    config_class = HeadAttnConfig if family == "transformer" else HeadAttnRNNConfig
    model_class = HeadAttnForConditionalGeneration if family == "transformer" else HeadAttnRNNForConditionalGeneration
    plain = model_class(config_class.from_dict(config)).eval()
    plain.load_state_dict(guided.state_dict())
    input_ids, attention_mask = source_batch()
    for flags in ({"num_beams": 1}, {"num_beams": 3}):
        ours = guided.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, **flags)
        theirs = plain.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, **flags)
        assert torch.equal(ours, theirs)


# ------------------------------------------------------------------------------------------- using a guided model
@pytest.fixture(scope="module")
def guided_folder(tmp_path_factory):
    """A random guided model (head 2 of the first of two layers) saved with a tokenizer, and its sources."""
    from hf_headattn import train_tokenizer
    from hf_headattn.toy_corpus import make_toy_corpus

    pairs = make_toy_corpus(200, seed=5)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=64)
    model = random_model(tiny_config(guided_alignment_weight=0.05, guided_alignment_layer=0,
                                     guided_alignment_heads=[2]), std=0.5)
    with torch.no_grad():
        model.final_logits_bias[0, 1] += 14.0  # translations of many lengths
    folder = tmp_path_factory.mktemp("guided") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, [source for source, _ in pairs[:24]]


def _alignments(translations):
    return [translation.hypotheses[0].alignment for translation in translations]


def test_the_fast_path_and_generate_read_the_same_guided_heads(guided_folder):
    from hf_headattn.translation import load_translator

    folder, sources = guided_folder
    translator = load_translator(folder)
    fast, generated = (_alignments(translator.translate(sources, alignments=True, fast=fast)) for fast in (True, False))
    assert fast == generated
    every_head = _alignments(translator.translate(sources, alignments=True, alignment_heads="all"))
    assert fast != every_head  # the guided head alone, not the layer's mean


def test_alignments_of_a_full_context_model_come_from_a_full_context_pass(guided_folder, tmp_path):
    from hf_headattn.translation import load_translator
    from hf_headattn.translation.teacher_forcing import teacher_forced

    folder, sources = guided_folder
    full_folder = tmp_path / "full-context"
    shutil.copytree(folder, full_folder)
    model = HeadAttnForConditionalGeneration.from_pretrained(full_folder)
    model.config.guided_alignment_full_context = True
    model.save_pretrained(full_folder)
    causal_alignments = _alignments(load_translator(folder).translate(sources, alignments=True))
    translator = load_translator(full_folder)
    translations = translator.translate(sources, alignments=True)
    assert _alignments(translations) != causal_alignments  # same weights, same words: read with full context
    assert [t.hypotheses[0].text for t in translations] == [t.hypotheses[0].text for t in
                                                            load_translator(folder).translate(sources)]
    # what the alignments are read from: the guided head in a full-context pass over each translation
    tokenizer, model = translator.tokenizer, translator.model
    batch = tokenizer(sources[:4], return_tensors="pt", padding=True)
    sequences = model.generate(**batch, max_new_tokens=64)
    read = teacher_forced(model, batch["input_ids"], batch["attention_mask"], sequences, length_penalty=1.0,
                          alignments=True, alignment_layer=None, alignment_heads="mean")
    for row, (_, attention, _) in enumerate(read):
        length = attention.shape[0]
        real = torch.ones(1, length, dtype=torch.long)
        with torch.inference_mode():
            outputs = model(input_ids=batch["input_ids"][row:row + 1],
                            attention_mask=batch["attention_mask"][row:row + 1],
                            decoder_input_ids=sequences[row:row + 1, :length], decoder_attention_mask=real,
                            output_attentions=True, full_target_context=True)
        by_hand = outputs.cross_attentions[0][0, 2]  # layer 0, head 2: the guided ones
        torch.testing.assert_close(attention, by_hand[:, :attention.shape[1]], atol=1e-5, rtol=0)


def test_averaged_checkpoints_and_int8_keep_the_guided_heads(guided_folder, tmp_path):
    from hf_headattn.averaging import average_checkpoints
    from hf_headattn.translation import load_translator
    from hf_headattn.translation.alignments import guided_heads

    folder, sources = guided_folder
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    averaged = average_checkpoints([folder, other], tmp_path / "averaged", allow_different_runs=True)
    translations = {name: load_translator(path, quantize=quantize)
                    for name, path, quantize in (("float", folder, "none"), ("averaged", averaged, "none"),
                                                 ("int8", folder, "int8"))}
    for translator in translations.values():
        assert guided_heads(translator.model) == (0, [2])
    alignments = {name: _alignments(translator.translate(sources, alignments=True))
                  for name, translator in translations.items()}
    assert alignments["averaged"] == alignments["float"]  # the average of one model twice is that model
    every_head = _alignments(translations["int8"].translate(sources, alignments=True, alignment_heads="all"))
    assert alignments["int8"] != every_head  # int8 reads the guided head too, not the layer's mean


def test_an_export_records_that_its_models_alignments_need_full_context():
    from hf_headattn.export import exported_alignment

    full = exported_alignment(tiny_config(guided_alignment_weight=0.05, guided_alignment_full_context=True))
    assert full == {"layer": 0, "layers": 2, "heads": "guided", "guided_heads": [0], "full_context": True}
    assert "full_context" not in exported_alignment(tiny_config(guided_alignment_weight=0.05))
