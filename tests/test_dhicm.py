"""DHICM (Goindani & Shrivastava): parameter counts, Eq. 1-5 against a re-computation from the returned head
importances, the loss under label smoothing and gradient accumulation, importances from generate, presets,
the Figure 3 plot and importance-guided head pruning."""

import math

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration, TranslationPipeline, train_tokenizer
from hf_headattn.runtime.attention_dhicm import DynamicHeadImportanceAttention
from hf_headattn.head_pruning import head_importance_statistics, mean_head_importances, prune_least_important_heads
from hf_headattn.plotting import head_importance_figure, plot_head_importances
from hf_headattn.training.presets import TABLE_2, dhicm_be_en, dhicm_de_en, dhicm_hi_en, table2_config, transformer_base
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer
from hf_headattn.runtime.transformers_compat import cache_of

from helpers import random_model, source_batch, tiny_config


ALL_SITES_LAST_LAYER = dict(encoder_self_attention="dhicm", decoder_self_attention="dhicm", cross_attention="dhicm")


def _dhicm_modules(model):
    return {name: module for name, module in model.named_modules() if isinstance(module, DynamicHeadImportanceAttention)}


def _labelled_batch():
    input_ids, attention_mask = source_batch((7, 4, 9))
    labels = torch.randint(2, 64, (3, 6), generator=torch.Generator().manual_seed(4))
    labels[1, 3:] = -100
    labels[2, 5:] = -100
    return input_ids, attention_mask, labels


# ------------------------------------------------------------------------------------------------ structure
def test_default_placement_is_the_last_layer_of_every_site():
    model = HeadAttnForConditionalGeneration(tiny_config(encoder_layers=3, decoder_layers=3, **ALL_SITES_LAST_LAYER))
    assert sorted(_dhicm_modules(model)) == [
        "model.decoder.layers.2.encoder_attn.variant",
        "model.decoder.layers.2.self_attn.variant",
        "model.encoder.layers.2.self_attn.variant",
    ]
    # DHICM's W_s replaces the output projection of the attention it sits in
    assert model.model.encoder.layers[2].self_attn.out_proj is None
    assert model.model.encoder.layers[1].self_attn.out_proj is not None


def test_parameter_count_at_the_papers_sizes():
    """d_model 512, 4 heads (d_k = 128), d_m 128: W and V are d_m x d_k, U is d_m x d, W_s is d x d_m, and
    no biases, so each module has 2*128*128 + 2*128*512 = 163,840 weights and the three last-layer modules
    491,520 (the paper's "~d^2 additional parameters" per module, ~500K in all)."""
    config = HeadAttnConfig(vocab_size=100, d_model=512, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, **ALL_SITES_LAST_LAYER)
    modules = _dhicm_modules(HeadAttnForConditionalGeneration(config))
    assert len(modules) == 3
    for module in modules.values():
        assert module.d_m == 128
        assert {name: tuple(p.shape) for name, p in module.named_parameters()} == {
            "w.weight": (128, 128), "u.weight": (128, 512), "v.weight": (128, 128), "w_s.weight": (512, 128)
        }
    assert sum(p.numel() for module in modules.values() for p in module.parameters()) == 491_520

    chosen = HeadAttnConfig(**{**config.to_dict(), "cross_attention": {"type": "dhicm", "d_m": 64, "score": "mlp"}})
    cross = _dhicm_modules(HeadAttnForConditionalGeneration(chosen))["model.decoder.layers.1.encoder_attn.variant"]
    # W, V: 64 x 128; U: 64 x 512; W_s: 512 x 64; the MLP score adds its 64-vector
    assert sum(p.numel() for p in cross.parameters()) == 2 * 64 * 128 + 2 * 64 * 512 + 64


# ------------------------------------------------------------------------------------------------ the math
def test_output_follows_equations_1_to_3():
    model = random_model(tiny_config(cross_attention={"type": "dhicm", "layers": [0]}), std=0.2).double()
    attention = model.model.decoder.layers[0].encoder_attn
    dhicm = attention.variant
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    memory = torch.randn(2, 5, 32, dtype=torch.float64)
    from hf_headattn.runtime.attention_base import AttentionMask

    output, result = attention(x, AttentionMask(None), key_value_states=memory, output_head_importances=True)
    # independent re-computation, head by head, token by token
    q = attention.q_proj(x).view(2, 3, 4, 8)
    k = attention.k_proj(memory).view(2, 5, 4, 8)
    v = attention.v_proj(memory).view(2, 5, 4, 8)
    W, U, V, W_s = dhicm.w.weight, dhicm.u.weight, dhicm.v.weight, dhicm.w_s.weight
    for b in range(2):
        for t in range(3):
            heads = [torch.softmax(k[b, :, h] @ q[b, t, h] / math.sqrt(8), 0) @ v[b, :, h] for h in range(4)]
            scores = torch.stack([O @ W.T @ U @ x[b, t] / math.sqrt(dhicm.d_m) for O in heads])  # Eq. 2
            G = torch.softmax(scores, 0)  # Eq. 1
            expected = W_s @ sum(G[h] * (V @ heads[h]) for h in range(4))  # Eq. 3
            torch.testing.assert_close(result.head_importances[b, t], G)
            torch.testing.assert_close(output[b, t], expected)
            kl = sum(G[h] * torch.log(G[h] * 4) for h in range(4))  # Eq. 4 against b_h = 1/4
            torch.testing.assert_close(result.head_kl[b, t], kl)
            torch.testing.assert_close(result.aux_loss[b, t], -0.1 * kl)  # Eq. 5


def _recomputed_kl(head_importances, attention_mask, labels):
    """The model's head_kl rebuilt from the returned importances: each decoder module averages over real target
    tokens; each encoder module averages each sentence over its real source tokens and weighs the sentence by its
    number of target tokens (as the cross-entropy does); then the mean over modules."""
    target_real = labels.ne(-100)
    target_counts = target_real.sum(1).double()
    per_module = []
    for name, importances in head_importances.items():
        kl = (importances.double() * torch.log(importances.double() * importances.shape[-1])).sum(-1)
        if name.startswith("encoder."):
            source_real = attention_mask.bool()
            sentence_means = (kl * source_real).sum(1) / source_real.sum(1)
            per_module.append((sentence_means * target_counts).sum() / target_counts.sum())
        else:
            per_module.append((kl * target_real).sum() / target_real.sum())
    return torch.stack(per_module).mean()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_loss_is_cross_entropy_minus_lambda_kl_from_the_returned_importances(label_smoothing):
    config = tiny_config(label_smoothing=label_smoothing, **{
        "encoder_self_attention": {"type": "dhicm", "layers": [0, 1], "kl_weight": 0.3},
        "decoder_self_attention": {"type": "dhicm", "kl_weight": 0.3},
        "cross_attention": {"type": "dhicm", "kl_weight": 0.3, "score": "mlp"},
    })
    model = random_model(config, std=0.2)
    input_ids, attention_mask, labels = _labelled_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_head_importances=True)
    assert sorted(out.head_importances) == ["decoder.layers.1.encoder_attn", "decoder.layers.1.self_attn",
                                            "encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    for name, importances in out.head_importances.items():
        assert importances.shape == ((3, 9, 4) if name.startswith("encoder.") else (3, 6, 4))
        torch.testing.assert_close(importances.sum(-1), torch.ones(importances.shape[:2]))
    kl = _recomputed_kl(out.head_importances, attention_mask, labels)
    assert kl > 0
    torch.testing.assert_close(out.head_kl.double(), kl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.loss.double(), out.ce_loss.double() - 0.3 * kl, atol=1e-5, rtol=1e-5)

    log_probs = out.logits.log_softmax(-1)
    keep = labels != -100
    nll = -log_probs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    smoothed = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
    torch.testing.assert_close(out.ce_loss, (smoothed * keep).sum() / keep.sum())


def test_head_kl_is_reported_even_with_zero_weight():
    model = random_model(tiny_config(cross_attention={"type": "dhicm", "kl_weight": 0.0}), std=0.2)
    input_ids, attention_mask, labels = _labelled_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.head_kl > 0
    torch.testing.assert_close(out.loss, out.ce_loss)


def _toy_training_data(tokenizer, pairs):
    sources, targets = zip(*pairs)
    return Dataset.from_dict(dict(tokenizer(list(sources), text_target=list(targets))))


@pytest.fixture(scope="module")
def toy_tokenizer():
    pairs = make_toy_corpus(400, seed=3)
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=120, model="bpe")


def _one_trainer_step(tokenizer, output_dir, batch_size, accumulation, kl_weight=5.0):
    config = tiny_config(vocab_size=len(tokenizer), label_smoothing=0.1, **{
        "encoder_self_attention": {"type": "dhicm", "kl_weight": kl_weight},
        "decoder_self_attention": {"type": "dhicm", "kl_weight": kl_weight},
        "cross_attention": {"type": "dhicm", "kl_weight": kl_weight},
    })
    model = random_model(config, std=0.1).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    data = _toy_training_data(tokenizer, make_toy_corpus(32, seed=11))
    trainer = HeadAttnSeq2SeqTrainer(
        model=model,
        args=Seq2SeqTrainingArguments(
            output_dir=str(output_dir), per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
            max_steps=1, optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", weight_decay=0.0,
            max_grad_norm=0.0, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1,
        ),
        train_dataset=data,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
    )
    trainer.train()
    update = {name: p.detach() - before[name] for name, p in model.named_parameters()}
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    return update, logged


def test_gradient_accumulation_gives_the_same_update_as_one_large_batch(toy_tokenizer, tmp_path):
    """One batch of 32 vs 2 x 16 accumulated, through Seq2SeqTrainer with label smoothing and plain SGD (whose
    update is the gradient itself, so any difference in the summed loss would show). lambda is large (5) so that
    the KL term's share of the update is well above the tolerance."""
    whole, whole_log = _one_trainer_step(toy_tokenizer, tmp_path / "whole", 32, 1)
    accumulated, accumulated_log = _one_trainer_step(toy_tokenizer, tmp_path / "accumulated", 16, 2)
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-5, rtol=1e-4, msg=name)
    # the KL term is in the update: without it the update differs
    without_kl, _ = _one_trainer_step(toy_tokenizer, tmp_path / "no-kl", 32, 1, kl_weight=0.0)
    assert max((without_kl[name] - whole[name]).abs().max() for name in whole) > 1e-4
    # ...and it shows in the training log
    assert whole_log["head_kl"] > 0 and accumulated_log["head_kl"] > 0
    assert whole_log["aux_loss"] == pytest.approx(-5.0 * whole_log["head_kl"], rel=1e-5)


def test_trainer_label_smoothing_factor_is_refused_because_it_would_drop_the_kl(toy_tokenizer, tmp_path):
    model = random_model(tiny_config(vocab_size=len(toy_tokenizer), cross_attention="dhicm"))
    with pytest.raises(ValueError, match="label_smoothing_factor=0.1 .* `config.label_smoothing`"):
        HeadAttnSeq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(
            output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to="none", use_cpu=True))


# ------------------------------------------------------------------------------------------------ generate
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_returns_the_importances_the_decoding_steps_computed(num_beams):
    model = random_model(tiny_config(**ALL_SITES_LAST_LAYER), std=0.2)
    input_ids, attention_mask = source_batch((7, 4, 9))
    generation = dict(max_new_tokens=6, do_sample=False, no_repeat_ngram_size=1, num_beams=num_beams)
    plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, **generation)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, output_head_importances=True,
                         **generation)
    assert torch.equal(out.sequences, plain)
    assert sorted(out.head_importances) == ["decoder.layers.1.encoder_attn", "decoder.layers.1.self_attn",
                                            "encoder.layers.1.self_attn"]
    steps = out.sequences.shape[1] - 1
    assert out.head_importances["encoder.layers.1.self_attn"].shape == (3, 9, 4)
    assert out.head_importances["decoder.layers.1.encoder_attn"].shape == (3, steps, 4)

    # Independent path: decode the chosen sequences step by step with a cache, collecting each step's importances.
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                              output_head_importances=True)
        cache, per_step = None, []
        for t in range(steps):
            step = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                         decoder_input_ids=out.sequences[:, t : t + 1], cache=cache, use_cache=True,
                         output_head_importances=True)
            cache = cache_of(step)
            per_step.append(step.head_importances["decoder.layers.1.encoder_attn"])
    torch.testing.assert_close(out.head_importances["decoder.layers.1.encoder_attn"], torch.cat(per_step, 1),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.head_importances["encoder.layers.1.self_attn"],
                               encoder_outputs.head_importances["encoder.layers.1.self_attn"])


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("spec, message", [
    ({"type": "dhicm", "score": "bilinear"}, "Unknown dhicm `score` 'bilinear'; accepted: dot, mlp"),
    ({"type": "dhicm", "d_m": 0}, "dhicm option `d_m` must be a positive integer"),
    ({"type": "dhicm", "kl_weight": -0.1}, "`kl_weight` .* must be a finite number >= 0, got -0.1"),
    ({"type": "dhicm", "dropout": 1.5}, "dhicm option `dropout` must be a number in \\[0, 1\\)"),
    ({"type": "dhicm", "lambda": 0.1}, "does not take option\\(s\\) lambda; accepted options: d_m, dropout, kl_weight"),
])
def test_bad_dhicm_options_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(cross_attention=spec)


@pytest.mark.parametrize("pruned, message", [
    ({"encoder.layers.7.self_attn": [0]}, "unknown attention module 'encoder.layers.7.self_attn'"),
    ({"encoder.layers.1.self_attn": [4]}, "head indices must be integers in \\[0, 4\\)"),
    ({"encoder.layers.1.self_attn": [0, 1, 2, 3]}, "removes all 4 heads"),
    ({"encoder.layers.1.self_attn": [0]}, None),
])
def test_bad_pruned_heads_are_clear_errors(pruned, message):
    if message is None:
        tiny_config(pruned_heads=pruned)
    else:
        with pytest.raises(ValueError, match=message):
            tiny_config(pruned_heads=pruned)


def test_mma_heads_cannot_be_pruned():
    with pytest.raises(ValueError, match="'mma' ties each head to its index"):
        tiny_config(encoder_self_attention="mma", pruned_heads={"encoder.layers.0.self_attn": [1]})


# ------------------------------------------------------------------------------------------------ presets
def test_presets_follow_table_2():
    expected = {  # Table 2: ffn, heads, dropout, attention dropout, activation dropout, DHICM dropout, smoothing
        transformer_base: (2048, 8, 0.1, 0.0, 0.0, None, 0.1),
        dhicm_de_en: (2048, 4, 0.5, 0.1, 0.3, 0.5, 0.1),
        dhicm_hi_en: (1024, 4, 0.3, 0.0, 0.0, 0.2, 0.1),
        dhicm_be_en: (128, 2, 0.1, 0.0, 0.0, 0.2, 0.4),
    }
    for constructor, (ffn, heads, dropout, attention_dropout, activation_dropout, dhicm_dropout, smoothing) in expected.items():
        config = constructor(vocab_size=1000)
        assert "Table 2" in constructor.__doc__ or "Table 2" in table2_config.__doc__
        assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
        assert (config.encoder_ffn_dim, config.encoder_attention_heads, config.decoder_attention_heads) == (ffn, heads, heads)
        assert (config.dropout, config.attention_dropout, config.activation_dropout) == (dropout, attention_dropout,
                                                                                          activation_dropout)
        assert config.label_smoothing == smoothing
        if constructor is transformer_base:
            assert config.attention_variant("cross_attention", 5) == ("softmax", {})
        else:
            for site in ("encoder_self_attention", "decoder_self_attention", "cross_attention"):
                assert [config.attention_variant(site, layer)[0] for layer in range(6)] == ["softmax"] * 5 + ["dhicm"]
                assert config.attention_variant(site, 5)[1] == {"kl_weight": 0.1, "dropout": dhicm_dropout}
    assert dhicm_de_en(1000, dhicm=False).attention_variant("cross_attention", 5) == ("softmax", {})
    assert set(TABLE_2) == {"default", "de-en", "hi-en", "be-en"}
    with pytest.raises(ValueError, match="Unknown Table 2 setting 'en-de'; accepted: default, de-en, hi-en, be-en"):
        table2_config("en-de", 1000, dhicm=True)


# ------------------------------------------------------------------------------------------------ plots, pruning
def test_head_importance_plot_is_written(toy_tokenizer, tmp_path):
    model = random_model(tiny_config(vocab_size=len(toy_tokenizer), **ALL_SITES_LAST_LAYER), std=0.2)
    path = head_importance_figure(model, toy_tokenizer, "der kleine hund sieht die katze .", tmp_path / "fig3.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    decoder_path = head_importance_figure(model, toy_tokenizer, "die frau lacht .", tmp_path / "dec.png",
                                          module="decoder.layers.1.encoder_attn")
    assert decoder_path.stat().st_size > 1000
    with pytest.raises(ValueError, match="one row per token"):
        plot_head_importances(torch.full((3, 4), 0.25), ["a", "b"], tmp_path / "bad.png")


def test_head_importance_statistics_measure_the_collapse_onto_one_head(toy_tokenizer):
    """The KL from uniform is 0 for uniform importances and ln H when one head takes everything: checked on a model
    whose importance scores (Eq. 2, through W) are zeroed, then blown up."""
    model = random_model(tiny_config(vocab_size=len(toy_tokenizer), **ALL_SITES_LAST_LAYER), std=0.2)
    pairs = make_toy_corpus(12, seed=5)
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    measured = head_importance_statistics(model, toy_tokenizer, sources, targets, batch_size=5)
    means = mean_head_importances(model, toy_tokenizer, sources, targets, batch_size=5)
    assert sorted(measured) == sorted(means)
    for name, module in measured.items():
        assert torch.equal(module["mean_importance"], means[name]) and module["ln_heads"] == pytest.approx(math.log(4))
        assert 0 < module["mean_kl"] < module["ln_heads"] and module["top_head_share"].sum() == pytest.approx(1.0)
    encoder_tokens = sum(len(ids) for ids in toy_tokenizer(sources)["input_ids"])
    assert measured["encoder.layers.1.self_attn"]["tokens"] == encoder_tokens

    score_weights = [module.w.weight for module in model.modules() if isinstance(module, DynamicHeadImportanceAttention)]
    assert len(score_weights) == 3
    for scale, kl, concentrated in ((0.0, 0.0, 0.0), (1e4, math.log(4), 1.0)):
        with torch.no_grad():
            for weight in score_weights:
                weight.mul_(scale)
        for module in head_importance_statistics(model, toy_tokenizer, sources, targets, batch_size=5).values():
            assert module["mean_kl"] == pytest.approx(kl, abs=1e-3)
            assert module["concentrated_share"] == pytest.approx(concentrated, abs=1e-3)
        with torch.no_grad():
            for weight in score_weights:
                weight.normal_(std=0.2)


def test_importance_guided_pruning_shrinks_saves_and_translates(toy_tokenizer, tmp_path):
    model = random_model(tiny_config(vocab_size=len(toy_tokenizer), **ALL_SITES_LAST_LAYER), std=0.2)
    pairs = make_toy_corpus(20, seed=5)
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    importances = mean_head_importances(model, toy_tokenizer, sources, targets, batch_size=8)
    assert sorted(importances) == ["decoder.layers.1.encoder_attn", "decoder.layers.1.self_attn",
                                   "encoder.layers.1.self_attn"]
    for values in importances.values():
        assert values.shape == (4,) and values.sum().item() == pytest.approx(1.0, abs=1e-5)

    parameters_before = model.num_parameters()
    removed = prune_least_important_heads(model, importances, heads_per_module=2)
    for name, heads in removed.items():
        assert heads == sorted(torch.argsort(importances[name])[:2].tolist())
    assert model.config.pruned_heads == removed
    cross = model.model.decoder.layers[1].encoder_attn
    assert cross.num_heads == 2 and cross.q_proj.weight.shape == (16, 32) and cross.k_proj.weight.shape == (16, 32)
    # q, k, v each lose 2 heads x 8 rows x (32 weights + 1 bias) in three modules
    assert parameters_before - model.num_parameters() == 3 * 3 * 2 * 8 * 33

    # pruning again counts heads among the site's original ones
    second = {"encoder.layers.1.self_attn": [h for h in range(4) if h not in removed["encoder.layers.1.self_attn"]][:1]}
    model.prune_heads(second)
    assert len(model.config.kept_heads("encoder_self_attention", 1)) == 1
    with pytest.raises(ValueError, match="already pruned"):
        model.prune_heads(second)

    model.save_pretrained(tmp_path)
    toy_tokenizer.save_pretrained(tmp_path)
    from transformers import AutoModelForSeq2SeqLM

    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    batch = toy_tokenizer(sources[:3], return_tensors="pt", padding=True)
    generation = dict(max_new_tokens=8, do_sample=False, num_beams=2)
    assert torch.equal(reloaded.generate(**batch, **generation), model.generate(**batch, **generation))
    translations = TranslationPipeline(model=reloaded, tokenizer=toy_tokenizer)(sources[:2], **generation)
    assert len(translations) == 2 and all(isinstance(t["translation_text"], str) for t in translations)
