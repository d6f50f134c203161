"""The Transformers contract of the model: attentions, SDPA = eager, gradient checkpointing, resizing,
safetensors, the loss (label smoothing, gradient accumulation, auxiliary loss)."""

import functools

import pytest
import torch

from hf_headattn import HeadAttnForConditionalGeneration, HeadAttnModel
from hf_headattn.runtime.transformers_compat import cache_of

from helpers import random_model, source_batch, tiny_config


def _batch():
    input_ids, attention_mask = source_batch((7, 4, 9))
    labels = torch.randint(2, 64, (3, 6), generator=torch.Generator().manual_seed(7))
    labels[1, 4:] = -100
    return input_ids, attention_mask, labels


@pytest.mark.parametrize("cross_attention", ["softmax", "running_sum"])
def test_output_attentions_are_distributions_over_unpadded_keys(cross_attention):
    model = random_model(tiny_config(cross_attention=cross_attention))
    input_ids, attention_mask, labels = _batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    for weights in out.encoder_attentions + out.cross_attentions:
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
        assert (weights.masked_select(attention_mask[:, None, None, :] == 0) == 0).all()
    for weights in out.decoder_attentions:
        assert torch.triu(weights, diagonal=1).abs().max() == 0  # causal


def test_sdpa_and_eager_agree():
    torch.manual_seed(0)
    config = tiny_config()
    sdpa = random_model(config)
    assert sdpa.config._attn_implementation == "sdpa"
    eager = HeadAttnForConditionalGeneration(tiny_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    assert eager.config._attn_implementation == "eager"
    input_ids, attention_mask, labels = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            sdpa(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits,
            eager(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits,
            atol=1e-5, rtol=1e-5,
        )


def test_gradient_checkpointing_gives_same_gradients():
    model = random_model(tiny_config(cross_attention="running_sum"), std=0.1).train()
    input_ids, attention_mask, labels = _batch()

    def gradients():
        model.zero_grad()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    model.activation_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in model.model.encoder.layers)
    checkpointed = gradients()
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_in_training_leaves_the_cache_unwritten():
    """Transformers' GradientCheckpointingLayer drops the cache it finds under its release's name (`cache` from
    5.24, `past_key_values` before), so that the backward replay does not append the keys a second time; the decoder
    must hand the cache to its layers under that name."""
    model = random_model(tiny_config(cross_attention="running_sum"), std=0.1).train()
    model.activation_checkpointing_enable()
    input_ids, attention_mask, labels = _batch()
    decoder_input_ids = labels.clamp(min=model.config.pad_token_id)
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                use_cache=True)
    out.logits.sum().backward()
    assert cache_of(out).get_seq_length() == 0 and not cache_of(out).variant_states


def test_resize_token_embeddings_keeps_ties_and_logits_bias():
    model = random_model(tiny_config())
    model.resize_token_embeddings(70)
    assert model.config.vocab_size == model.config.decoder_vocab_size == 70
    assert model.final_logits_bias.shape == (1, 70)
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert model.model.encoder.embed_tokens is model.model.decoder.embed_tokens is model.model.shared
    input_ids, attention_mask, labels = _batch()
    assert model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits.shape[-1] == 70


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_save_writes_safetensors_and_reloads(tmp_path, tie_word_embeddings):
    model = random_model(tiny_config(cross_attention="running_sum", tie_word_embeddings=tie_word_embeddings))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    reloaded = HeadAttnForConditionalGeneration.from_pretrained(tmp_path).eval()
    input_ids, attention_mask, labels = _batch()
    with torch.no_grad():
        assert torch.equal(
            reloaded(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits,
            model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits,
        )
    lm_head_is_tied = reloaded.lm_head.weight.data_ptr() == reloaded.model.shared.weight.data_ptr()
    assert lm_head_is_tied == tie_word_embeddings
    shared = reloaded.model.shared.weight  # tied by parameter, as in Marian
    assert reloaded.model.encoder.embed_tokens.weight is reloaded.model.decoder.embed_tokens.weight is shared


def test_base_model_and_separate_embeddings():
    config = tiny_config(share_encoder_decoder_embeddings=False, decoder_vocab_size=50, tie_word_embeddings=True)
    model = HeadAttnForConditionalGeneration(config).eval()
    assert model.lm_head.weight.shape == (50, 32)
    assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    input_ids, attention_mask, labels = _batch()
    labels = labels.clamp(max=49)
    assert model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits.shape == (3, 6, 50)
    base = HeadAttnModel(tiny_config())
    hidden = base(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels.clamp(min=0))
    assert hidden.last_hidden_state.shape == (3, 6, 32)


def test_label_smoothed_loss_matches_manual_computation():
    model = random_model(tiny_config(label_smoothing=0.1))
    input_ids, attention_mask, labels = _batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    log_probs = out.logits.log_softmax(-1)
    keep = labels != -100
    nll = -log_probs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    smooth = -log_probs.mean(-1)
    expected = ((0.9 * nll + 0.1 * smooth) * keep).sum() / keep.sum()
    torch.testing.assert_close(out.loss, expected)
    assert out.aux_loss is None


def _micro_batches(input_ids, attention_mask, labels):
    """Two micro-batches, each trimmed of its own padding as a data collator would."""
    for rows in (slice(0, 1), slice(1, 3)):
        width = int(attention_mask[rows].sum(1).max())
        yield input_ids[rows, :width], attention_mask[rows, :width], labels[rows]


def test_gradient_accumulation_matches_one_large_batch():
    """Micro-batches given Trainer's num_items_in_batch add up to the loss and gradients of the whole batch."""
    model = random_model(tiny_config(label_smoothing=0.1), std=0.1).train()
    input_ids, attention_mask, labels = _batch()
    model.zero_grad()
    whole = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    whole.loss.backward()
    whole_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    total_items = (labels != -100).sum()
    accumulated = 0.0
    for ids, mask, part_labels in _micro_batches(input_ids, attention_mask, labels):
        part = model(input_ids=ids, attention_mask=mask, labels=part_labels, num_items_in_batch=total_items)
        part.loss.backward()
        accumulated = accumulated + part.loss.detach()
    torch.testing.assert_close(accumulated, whole.loss.detach())
    for name, parameter in model.named_parameters():
        if name in whole_grads:
            torch.testing.assert_close(parameter.grad, whole_grads[name], atol=1e-6, rtol=1e-4)


def test_auxiliary_loss_is_added_and_scaled_by_token_share():
    config = tiny_config(cross_attention={"type": "running_sum", "aux_weight": 0.5})
    model = random_model(config, std=0.1)
    input_ids, attention_mask, labels = _batch()
    whole = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert whole.aux_loss is not None and whole.aux_loss > 0
    torch.testing.assert_close(whole.loss, whole.ce_loss + whole.aux_loss)

    total_items = (labels != -100).sum()
    accumulated, expected = 0.0, whole.ce_loss.detach()
    for ids, mask, part_labels in _micro_batches(input_ids, attention_mask, labels):
        part = model(input_ids=ids, attention_mask=mask, labels=part_labels, num_items_in_batch=total_items)
        accumulated = accumulated + part.loss.detach()
        expected = expected + (part_labels != -100).sum() / total_items * part.aux_loss.detach()
    torch.testing.assert_close(accumulated, expected)


def test_return_dict_false_gives_tuples():
    model = random_model(tiny_config())
    input_ids, attention_mask, labels = _batch()
    as_tuple = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, return_dict=False)
    as_output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], as_output.loss) and torch.equal(as_tuple[1], as_output.logits)


def test_unknown_forward_argument_is_an_error_not_silently_dropped():
    model = random_model(tiny_config())
    input_ids, attention_mask, labels = _batch()
    with pytest.raises(TypeError, match="decoder_attention_masks"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, decoder_attention_masks=None)


def test_trainer_passes_num_items_in_batch_under_gradient_accumulation(tmp_path, monkeypatch):
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from hf_headattn import train_tokenizer

    texts = ["der hund schläft .", "die katze lacht .", "ein kind singt .", "der mann wartet ."]
    tokenizer = train_tokenizer(texts=texts * 5, vocab_size=60, model="bpe")
    model = random_model(tiny_config(vocab_size=len(tokenizer)), std=0.05).train()
    seen = []
    forward = type(model).forward

    @functools.wraps(forward)  # Trainer reads the forward signature to pick dataset columns
    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("num_items_in_batch"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    data = Dataset.from_dict(dict(tokenizer(texts, text_target=texts[::-1])))
    trainer = Seq2SeqTrainer(
        model=model,
        args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1,
                                      gradient_accumulation_steps=2, report_to="none", use_cpu=True,
                                      save_strategy="no", disable_tqdm=True),
        train_dataset=data,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
    )
    trainer.train()
    expected = sum(len(ids) for ids in data["labels"])
    assert len(seen) == 2 and all(int(items) == expected for items in seen)


def test_generate_never_warns_about_training_without_labels(caplog):
    """A freshly built model is in train mode; `generate` (no gradients) must not say it trains without labels,
    while a training forward without labels still does (the positive control that the warning is captured)."""
    import logging

    from helpers import source_batch

    logging.Logger.warning_once.cache_clear()  # Transformers' warning_once remembers messages per process
    model = HeadAttnForConditionalGeneration(tiny_config(cross_attention="dhicm"))
    assert model.training
    input_ids, attention_mask = source_batch()
    model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)
    assert "Training without `labels`" not in caplog.text
    model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :2])
    assert "Training without `labels`" in caplog.text
