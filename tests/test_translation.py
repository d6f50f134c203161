"""The translation module and `hf-headattn-translate`: input order, blank lines, n-best lists and their scores,
word alignments for every variant of both families, the command's output formats and its refusals."""

import json
import os
import random

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.decoding import fast_generate
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.commands import translate as translate_command
from hf_headattn.commands.translate import main
from hf_headattn.translation import quantization, sentences as translation_sentences
from hf_headattn.translation import translator as translator_module
from hf_headattn.translation import (DEFAULT_BATCH_SIZE, GENERATE_BATCH_SIZE, Hypothesis, Translation, align,
                                     default_batch_size, format_translation, length_sorted_batches, quantize,
                                     read_lines, resolve_batch_size, translate)
from hf_headattn.translation.alignments import decoded_word_indices, pharaoh, source_word_indices

from helpers import (RNN_CONFIGS, RNN_EOS_BIAS, VARIANT_CONFIGS, VOCAB, random_model, random_rnn_model, rnn_config,
                     tiny_config, toy_data, train_tiny_model)

GENERATION = dict(max_new_tokens=8, no_repeat_ngram_size=1)


@pytest.fixture(scope="module")
def pairs():
    return make_toy_corpus(300, seed=3)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=VOCAB)
    assert len(tokenizer) == VOCAB
    return tokenizer


@pytest.fixture(scope="module")
def sources(pairs):
    """Sentences of mixed lengths in no length order, with blank and whitespace-only lines among them."""
    texts = [source for source, _ in pairs[:9]]
    random.Random(0).shuffle(texts)
    return texts[:3] + [""] + texts[3:6] + ["   "] + texts[6:]


def transformer_model(name):
    return random_model(tiny_config(**VARIANT_CONFIGS[name]))


def rnn_model(name):
    return random_rnn_model(rnn_config(**RNN_CONFIGS[name]), eos_bias=RNN_EOS_BIAS.get(name, 0.0))


MODELS = {**{f"transformer {name}": (transformer_model, name) for name in VARIANT_CONFIGS},
          **{f"lstm {name}": (rnn_model, name) for name in RNN_CONFIGS}}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    build, name = MODELS[request.param]
    return build(name)


# ------------------------------------------------------------------------------------------------ batching
def test_length_sorted_batches_cover_every_sentence_once_within_both_limits():
    lengths = [random.Random(k).randint(1, 40) for k in range(200)]
    for batch_size, max_tokens in ((7, None), (None, 100), (16, 120), (200, 40)):
        batches = length_sorted_batches(lengths, batch_size, max_tokens)
        assert sorted(index for batch in batches for index in batch) == list(range(200))
        flat = [lengths[index] for batch in batches for index in batch]
        assert flat == sorted(flat, reverse=True)
        for batch in batches:
            assert batch_size is None or len(batch) <= batch_size
            longest = max(lengths[index] for index in batch)
            assert max_tokens is None or len(batch) * longest <= max_tokens or len(batch) == 1
    assert length_sorted_batches([50, 3], None, 10) == [[0], [1]]  # a sentence over the budget: a batch of its own
    with pytest.raises(ValueError, match="batch_size, max_tokens or both"):
        length_sorted_batches([1], None, None)
    with pytest.raises(ValueError, match="max_tokens must be a positive int, got 0"):
        length_sorted_batches([1], 4, 0)


# ------------------------------------------------------------------------------------------------ translate
def test_the_fast_path_fills_its_default_batches_with_sentences_where_fewer_beams_leave_room():
    assert [default_batch_size(beams) for beams in (1, 2, 4, 5, 10)] == [640, 320, 160, 128, 128]
    # generate's batches ride along until their longest sentence ends: fewer sentences, at any beam size
    assert [default_batch_size(beams, fast=False) for beams in (1, 5)] == [GENERATE_BATCH_SIZE] * 2 == [32, 32]
    assert DEFAULT_BATCH_SIZE == 128
    # on a GPU a step's time hardly grows with its rows: generate keeps the larger batches, the fast path its rule
    assert [default_batch_size(beams, fast=False, device_type="cuda") for beams in (1, 5)] == [128, 128]
    assert [default_batch_size(beams, device_type="cuda") for beams in (1, 5)] == [640, 128]


def test_auto_batches_follow_the_models_device(monkeypatch):
    model = random_model(tiny_config())
    assert resolve_batch_size(model, fast=False) == GENERATE_BATCH_SIZE
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    assert resolve_batch_size(model, fast=False) == resolve_batch_size(model, do_sample=True) == DEFAULT_BATCH_SIZE
    assert resolve_batch_size(model, num_beams=4) == 160


def record_batch_limits(monkeypatch) -> dict:
    """The limits (sentences, padded tokens) `translate` cut its last batches by, as `length_sorted_batches` got
    them."""
    asked = {}
    real = translation_sentences.length_sorted_batches

    def recording(lengths, batch_size, max_tokens):
        asked.update(batch_size=batch_size, max_tokens=max_tokens)
        return real(lengths, batch_size, max_tokens)

    monkeypatch.setattr(translation_sentences, "length_sorted_batches", recording)
    return asked


@pytest.mark.parametrize("options, batch_size", [
    (dict(num_beams=1), 640), (dict(num_beams=4), 160), (dict(num_beams=1, fast=False), GENERATE_BATCH_SIZE),
    (dict(num_beams=1, do_sample=True), GENERATE_BATCH_SIZE), (dict(num_beams=2, batch_size=7), 7)])
def test_translate_batches_by_the_search_that_decodes(tokenizer, sources, monkeypatch, options, batch_size):
    """`batch_size="auto"`, the default: the fast path's rows rule where it decodes, else generate's 32."""
    asked = record_batch_limits(monkeypatch)
    translate(random_model(tiny_config()), tokenizer, sources, **options, **GENERATION)
    assert asked == {"batch_size": batch_size, "max_tokens": 4096}


def test_translate_refuses_a_batch_size_it_does_not_know(tokenizer, sources):
    with pytest.raises(ValueError, match="batch_size must be a positive int, None or 'auto', got 'all'"):
        translate(random_model(tiny_config()), tokenizer, sources, batch_size="all", **GENERATION)


def test_each_process_takes_every_nth_batch_so_that_all_get_long_and_short_ones(tokenizer, sources, monkeypatch):
    """Under torchrun, the second of two processes decodes batches 1, 3, ... of the longest-first order: a
    contiguous split would give the first process every long sentence."""
    import types

    import accelerate.utils

    state = types.SimpleNamespace(process_index=1, num_processes=2, is_main_process=False)
    monkeypatch.setattr(translation_sentences, "distributed_state", lambda: state)
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: objects)  # this process's share alone
    decoded = []
    real = translation_sentences._translate_batch

    def recording(model, tokenizer, texts, **kwargs):
        decoded.append(texts)
        return real(model, tokenizer, texts, **kwargs)

    monkeypatch.setattr(translation_sentences, "_translate_batch", recording)
    kept = [source for source in sources if source.strip()]
    lengths = [len(ids) for ids in tokenizer(kept)["input_ids"]]
    batches = [[kept[k] for k in batch] for batch in length_sorted_batches(lengths, 2)]
    assert len(batches) == 5
    translated = translate(random_model(tiny_config()), tokenizer, sources, batch_size=2, max_tokens=None,
                           **GENERATION)
    assert decoded == [batches[1], batches[3]]
    assert [bool(translation.hypotheses) for translation in translated] == [
        any(source in batch for batch in decoded) for source in sources]


def test_output_keeps_input_order_and_blank_lines_whatever_the_batches(model, tokenizer, sources):
    alone = [translate(model, tokenizer, [source], num_beams=3, **GENERATION)[0] for source in sources]
    for batch_size, max_tokens in ((2, None), (32, None), (None, 40)):
        batched = translate(model, tokenizer, sources, batch_size=batch_size, max_tokens=max_tokens, num_beams=3,
                            **GENERATION)
        assert [translation.source for translation in batched] == sources
        assert [translation.text for translation in batched] == [translation.text for translation in alone]
    assert batched[3] == Translation("", []) and batched[7] == Translation("   ", [])
    assert all(translation.hypotheses for k, translation in enumerate(batched) if k not in (3, 7))


def test_fast_decoding_and_generate_give_the_same_translations(model, tokenizer, sources):
    for options in (dict(num_beams=1), dict(num_beams=4, nbest=3), dict(num_beams=3, length_penalty=2.0)):
        fast = translate(model, tokenizer, sources, fast=True, batch_size=3, **options, **GENERATION)
        slow = translate(model, tokenizer, sources, fast=False, batch_size=3, **options, **GENERATION)
        assert [[hypothesis.text for hypothesis in translation.hypotheses] for translation in fast] == \
            [[hypothesis.text for hypothesis in translation.hypotheses] for translation in slow]


def test_nbest_lists_are_sorted_by_the_score_beam_search_ranks_by(model, tokenizer, sources):
    translations = translate(model, tokenizer, sources, nbest=4, num_beams=4, batch_size=3, **GENERATION)
    for translation in translations:
        if not translation.source.strip():
            continue
        scores = [hypothesis.score for hypothesis in translation.hypotheses]
        assert len(scores) == 4 and scores == sorted(scores, reverse=True)
    # the scores are generate's own sequences_scores, recomputed: compare with beam search's for one sentence
    batch = tokenizer([sources[0]], return_tensors="pt", return_token_type_ids=False)
    generated = model.generate(**batch, num_beams=4, num_return_sequences=4, return_dict_in_generate=True,
                               output_scores=True, **GENERATION)
    expected = sorted(generated.sequences_scores.tolist(), reverse=True)
    assert [hypothesis.score for hypothesis in translations[0].hypotheses] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("fast", [True, False])
def test_nbest_scores_are_the_searchs_own_without_a_second_pass(model, tokenizer, sources, fast, monkeypatch):
    from hf_headattn.translation import sentences

    with_pass = translate(model, tokenizer, sources, nbest=3, num_beams=3, alignments=True, fast=fast, **GENERATION)

    def no_second_pass(*args, **kwargs):
        raise AssertionError("n-best scores were computed again by a teacher-forced pass")

    monkeypatch.setattr(sentences, "teacher_forced", no_second_pass)
    from_search = translate(model, tokenizer, sources, nbest=3, num_beams=3, fast=fast, **GENERATION)
    for searched, passed in zip(from_search, with_pass):
        assert [hypothesis.text for hypothesis in searched.hypotheses] == \
            [hypothesis.text for hypothesis in passed.hypotheses]
        assert [hypothesis.score for hypothesis in searched.hypotheses] == pytest.approx(
            [hypothesis.score for hypothesis in passed.hypotheses], abs=1e-4)


def test_alignment_links_stay_within_both_sentences_for_every_variant(model, tokenizer, sources):
    translations = translate(model, tokenizer, sources, nbest=2, num_beams=2, alignments=True, **GENERATION)
    linked = 0
    for translation in translations:
        for hypothesis in translation.hypotheses:
            source_words, target_words = len(translation.source.split()), len(hypothesis.text.split())
            for link in hypothesis.alignment.split():
                i, j = (int(x) for x in link.split("-"))
                assert 0 <= i < source_words and 0 <= j < target_words, (link, translation.source, hypothesis.text)
                linked += 1
    assert linked > 0
    forced = align(model, tokenizer, [source for source in sources if source.strip()][:3],
                   ["a man sleeps .", "the dog sees the big house .", "he says that a child laughs ."])
    for links, target in zip(forced, ["a man sleeps .", "the dog sees the big house .", "he says that a child laughs ."]):
        assert all(0 <= int(link.split("-")[1]) < len(target.split()) for link in links.split())


def test_kept_attention_is_what_scored_and_aligned_each_hypothesis(model, tokenizer, sources):
    plain = translate(model, tokenizer, sources, nbest=2, num_beams=2, alignments=True, **GENERATION)
    kept = translate(model, tokenizer, sources, nbest=2, num_beams=2, alignments=True, attention=True, **GENERATION)
    assert [[(h.text, h.alignment) for h in t.hypotheses] for t in kept] == \
        [[(h.text, h.alignment) for h in t.hypotheses] for t in plain]
    # the plain pass encodes each source once for its n-best list, the kept one with every hypothesis: float rounding
    assert [h.score for t in kept for h in t.hypotheses] == pytest.approx(
        [h.score for t in plain for h in t.hypotheses], abs=1e-5)
    is_rnn = model.config.model_type == "headattn_rnn"
    for translation in kept:
        for hypothesis in translation.hypotheses:
            attention = hypothesis.attention
            source_ids = tokenizer(translation.source, return_token_type_ids=False)["input_ids"]
            assert attention.source_tokens == tokenizer.convert_ids_to_tokens(source_ids)
            assert len(attention.source_words) == len(source_ids)
            target_length = len(attention.target_tokens)
            assert len(attention.target_words) == target_length
            assert len(attention.cross_attentions) == (1 if is_rnn else model.config.decoder_layers)
            for layer in attention.cross_attentions:
                assert layer.shape[1:] == (target_length, len(source_ids))
            # the reduction the alignment read: the last layer's heads averaged
            torch.testing.assert_close(attention.alignment_attention, attention.cross_attentions[-1].mean(0))
            for name, importances in attention.head_importances.items():
                tokens = len(source_ids) if name.startswith("encoder.") else target_length
                assert importances.shape[0] == tokens
                torch.testing.assert_close(importances.sum(-1), torch.ones(tokens))
    assert plain[0].hypotheses[0].attention is None


def test_every_variant_translates_with_int8_linear_layers(model, tokenizer, sources):
    import copy

    quantized = quantize(copy.deepcopy(model))
    kinds = {type(module).__module__ for module in quantized.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.linear" in kinds
    still_float = [name for name, module in quantized.named_modules() if type(module) is torch.nn.Linear]
    assert still_float == [f"{name}.{linear}" for name, module in quantized.named_modules()
                           for linear in getattr(module, "weight_read_linears", ())]  # DHICM's W only
    translations = translate(quantized, tokenizer, sources, num_beams=2, nbest=2, alignments=True, **GENERATION)
    assert all(len(translation.hypotheses) == 2 for translation in translations if translation.source.strip())
    batch = tokenizer(sources[:2], return_tensors="pt", padding=True, return_token_type_ids=False)
    # the fast path decodes int8 models (it raises FastPathUnsupported where it does not); int8 activations are
    # quantized per batch, so its ids follow generate's only where no sentence has left the batch yet
    assert fast_generate(quantized, batch["input_ids"], batch["attention_mask"], num_beams=2,
                         **GENERATION).shape[0] == 2
    labels = tokenizer(text_target=["a man sleeps .", "the dog sees the house ."], return_tensors="pt", padding=True)
    with torch.no_grad():
        exact = model(**batch, labels=labels["input_ids"]).logits
        approximate = quantized(**batch, labels=labels["input_ids"]).logits
    # int8 weights: close, not equal (random weights this large give 0.93-1.0 across the variants)
    assert torch.nn.functional.cosine_similarity(approximate.flatten(), exact.flatten(), dim=0) > 0.9
    with pytest.raises(ValueError, match="Unknown quantization 'int4'; accepted: int8"):
        quantize(model, "int4")


def small_transformer():
    from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration

    config = HeadAttnConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32,
                            decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2)
    torch.manual_seed(0)
    return HeadAttnForConditionalGeneration(config).eval()


def test_int8_adds_the_final_logits_bias_inside_the_output_layer(monkeypatch):
    """quantize folds a Transformer's final_logits_bias into the int8 output layer's bias: the logits are those of
    the quantized model that adds it after the layer."""
    import copy

    # both models' output layers on fbgemm's kernels, as quantize_dynamic packs them (not oneDNN's, with AMX)
    monkeypatch.setattr(quantization, "cpu_has_any_flag", lambda flags, if_unknown=True: False)
    model = small_transformer()
    model.final_logits_bias.normal_()
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 1]]), "decoder_input_ids": torch.tensor([[0, 8, 9]])}
    with torch.no_grad():
        unfolded = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        expected = unfolded(**inputs).logits
        folded = quantize(copy.deepcopy(model))
        assert folded.final_logits_bias is None
        torch.testing.assert_close(folded(**inputs).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("amx", [True, False])
def test_int8_output_layer_is_packed_for_onednn_where_the_cpu_has_amx(monkeypatch, amx):
    """With AMX int8 reported, quantize packs the output layer (and no other) again while oneDNN is the engine, and
    leaves the engine as it was; its logits stay those of fbgemm's packing (the same int8 products). Without AMX (or
    where the CPU's flags cannot be read) nothing is packed again."""
    import copy

    packed_under = []
    set_weight_bias = torch.ao.nn.quantized.dynamic.Linear.set_weight_bias

    def recording(layer, weight, bias):
        packed_under.append((layer, torch.backends.quantized.engine))
        set_weight_bias(layer, weight, bias)

    monkeypatch.setattr(torch.ao.nn.quantized.dynamic.Linear, "set_weight_bias", recording)
    asked = []
    monkeypatch.setattr(quantization, "cpu_has_any_flag",
                        lambda flags, if_unknown=True: asked.append((tuple(flags), if_unknown)) or amx)
    model = small_transformer()
    engine = torch.backends.quantized.engine
    quantized = quantize(copy.deepcopy(model))
    assert torch.backends.quantized.engine == engine
    assert asked == [(quantization.AMX_INT8_FLAGS, False)]
    on_onednn = [layer for layer, packed_engine in packed_under if packed_engine == "onednn"]
    assert on_onednn == ([quantized.get_output_embeddings()] if amx else [])
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 1]]), "decoder_input_ids": torch.tensor([[0, 8, 9]])}
    monkeypatch.setattr(quantization, "cpu_has_any_flag", lambda flags, if_unknown=True: False)
    with torch.no_grad():
        torch.testing.assert_close(quantized(**inputs).logits, quantize(copy.deepcopy(model))(**inputs).logits,
                                   atol=1e-5, rtol=1e-5)


def test_hop_alignments_need_weights_over_heads(tokenizer, sources):
    for model in (transformer_model("multihop-dependent-2-hops"), transformer_model("dhicm-every-layer-and-site"),
                  rnn_model("2x2-dependent")):
        translation = translate(model, tokenizer, sources[:2], alignments=True, alignment_heads="hop",
                                alignment_layer=-1, **GENERATION)[0]
        assert translation.hypotheses[0].alignment
    with pytest.raises(ValueError, match="has no weights over heads"):
        translate(transformer_model("softmax-every-site"), tokenizer, sources[:1], alignments=True, alignment_heads="hop",
                  **GENERATION)
    with pytest.raises(ValueError, match="decoder has 2 attention layer"):
        translate(transformer_model("softmax-every-site"), tokenizer, sources[:1], alignments=True, alignment_layer=2)


def test_pharaoh_takes_the_argmax_word_skips_special_tokens_and_keeps_exact_zeros_unlinked():
    attention = torch.tensor([
        [0.1, 0.7, 0.2, 0.0],  # -> source token 1, word 0
        [0.0, 0.1, 0.3, 0.6],  # token 3 is special (-1): argmax over the words -> token 2, word 1
        [0.0, 0.0, 0.0, 1.0],  # everything on the special token (or the sink): no link
        [0.5, 0.0, 0.5, 0.0],  # a tie: the first
    ])
    assert pharaoh(attention, [0, 0, 1, -1], [0, 0, 1, 2]) == "0-0 0-2 1-0"
    assert pharaoh(attention, [0, 0, 1, -1], [-1, -1, -1, -1]) == ""


def test_word_indices_follow_whitespace_words_of_source_and_decoded_text(tokenizer):
    text = "der mann sieht den hund ."
    encoded = tokenizer([text], return_tensors="pt", return_token_type_ids=False)
    words = source_word_indices(tokenizer, [text], encoded["input_ids"])[0]
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    assert words[-1] == -1 and tokens[-1] == "</s>"
    assert sorted(set(words[:-1])) == list(range(6)) and words[:-1] == sorted(words[:-1])
    ids = tokenizer("the man sees the dog .")["input_ids"]
    target_words = decoded_word_indices(tokenizer, ids)
    assert target_words[-1] == -1 and sorted(set(target_words[:-1])) == list(range(6))


def test_too_long_lines_are_cut_with_one_warning_or_refused_with_strict(tokenizer, sources, caplog):
    model = transformer_model("softmax-every-site")
    long_line = " ".join(["der große hund sieht die katze ."] * 12)  # beyond 64 positions
    with caplog.at_level("WARNING", logger="hf_headattn.translation"):
        translations = translate(model, tokenizer, [sources[0], long_line, long_line], **GENERATION)
    assert caplog.text.count("line(s) longer than the model's 64 tokens are translated cut to 64: line 2, 3") == 1
    assert translations[1].text
    with pytest.raises(ValueError, match=r"2 line\(s\) are longer than the model's 64 tokens: line 2, 3"):
        translate(model, tokenizer, [sources[0], long_line, long_line], strict=True)
    with pytest.raises(ValueError, match="nbest=3 is more than num_beams=2"):
        translate(model, tokenizer, sources, nbest=3, num_beams=2)


def test_read_lines_keeps_line_count_and_names_the_bad_line(tmp_path):
    path = tmp_path / "in.de"
    path.write_bytes("\ufeffeins\r\nzwei\u2028drei\n\nvier".encode())
    assert read_lines(path) == ["eins", "zwei\u2028drei", "", "vier"]
    path.write_bytes(b"gut\nauch gut\nschlecht \xff\n")
    with pytest.raises(ValueError, match=r"in.de, line 3: not UTF-8 \(byte 0xff at character 10\)"):
        read_lines(path)
    with pytest.raises(FileNotFoundError, match="Text file not found"):
        read_lines(tmp_path / "missing.de")


def test_output_formats_follow_marian_moses_and_json_lines():
    best, second = Hypothesis("a dog .", -0.25, "0-0 1-1"), Hypothesis("the dog .", -0.5, "1-1")
    translated, blank = Translation("ein hund .", [best, second]), Translation("  ")
    assert format_translation(translated, 4) == "a dog .\n"
    assert format_translation(translated, 4, alignments=True) == "a dog . ||| 0-0 1-1\n"
    assert format_translation(blank, 5, alignments=True) == " ||| \n"  # a blank line stays one line
    assert format_translation(translated, 4, nbest=2, alignments=True) == \
        "4 ||| a dog . ||| -0.250000 ||| 0-0 1-1\n4 ||| the dog . ||| -0.500000 ||| 1-1\n"
    assert format_translation(blank, 5, nbest=2) == ""
    assert json.loads(format_translation(translated, 4, output_format="jsonl")) == {
        "source": "ein hund .", "translations": [{"text": "a dog .", "score": -0.25},
                                                 {"text": "the dog .", "score": -0.5}]}
    assert json.loads(format_translation(blank, 5, output_format="jsonl")) == {"source": "  ", "translations": []}
    with pytest.raises(ValueError, match="Unknown output_format 'tsv'"):
        format_translation(translated, 4, output_format="tsv")


# ------------------------------------------------------------------------------------------------ the command
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    directory = tmp_path_factory.mktemp("translate")
    data = toy_data(directory / "data")
    return train_tiny_model(data, directory / "model", "transformer", "--cross_attention", "csparsemax",
                            "--fertility", "guided"), data


def run(argv, capsys):
    main([str(argument) for argument in argv])
    return capsys.readouterr()


def test_command_writes_one_line_per_input_line(folder, tmp_path, capsys):
    model_dir, data = folder
    lines = read_lines(data["test.src"])[:6]
    source = tmp_path / "in.de"
    source.write_text("\n".join(lines[:2] + [""] + lines[2:] + ["  "]) + "\n", encoding="utf-8")
    out = run(["--model", model_dir, "--input", source, "--output", tmp_path / "out.en", "--num-beams", "2",
               "--batch_size", "2"], capsys)
    written = (tmp_path / "out.en").read_text(encoding="utf-8").split("\n")
    assert len(written) == 9 and written[-1] == "" and written[2] == "" and written[7] == ""
    assert all(written[k] for k in (0, 1, 3, 4, 5, 6))
    assert out.out == "" and "6 lines translated (2 blank)" in out.err and "out.en" in out.err
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out.en").stat().st_mode & 0o777 == 0o666 & ~umask  # not tempfile's private 0600
    assert not list(tmp_path.glob(".*partial"))  # the temporary file was renamed

    out = run(["--model", model_dir, "--input", source, "--num_beams", "3", "--nbest", "2", "--alignments",
               "--quiet"], capsys)
    nbest = out.out.splitlines()
    assert len(nbest) == 12 and out.err == ""
    assert [int(line.split(" ||| ")[0]) for line in nbest] == [0, 0, 1, 1, 3, 3, 4, 4, 5, 5, 6, 6]
    assert all(len(line.split(" ||| ")) == 4 for line in nbest)

    out = run(["--model", model_dir, "--input", source, "--num-beams", "2", "--max_tokens", "30", "-q"], capsys)
    assert out.out == (tmp_path / "out.en").read_text(encoding="utf-8")  # other batches, same translations

    out = run(["--model", model_dir, "--input", source, "--num_beams", "2", "--quantize", "int8", "-q"], capsys)
    assert len(out.out.split("\n")) == 9 and out.out.split("\n")[2] == ""

    out = run(["--model", model_dir, "--input", source, "--num_beams", "3", "--nbest", "3", "--alignments",
               "--output_format", "jsonl", "-q"], capsys)
    records = [json.loads(line) for line in out.out.splitlines()]
    assert len(records) == 8 and records[2] == {"source": "", "translations": []}
    for record in records:
        scores = [hypothesis["score"] for hypothesis in record["translations"]]
        assert scores == sorted(scores, reverse=True) and len(scores) in (0, 3)
        assert all(set(hypothesis) == {"text", "score", "alignment"} for hypothesis in record["translations"])


@pytest.mark.parametrize("flags, batch_size", [
    ((), 640), (("--num_beams", "4"), 160), (("--decoding", "generate"), GENERATE_BATCH_SIZE),
    (("--do_sample",), GENERATE_BATCH_SIZE), (("--batch_size", "7"), 7), (("--max_tokens", "99"), None)])
def test_command_batches_by_the_search_that_decodes(folder, tmp_path, capsys, monkeypatch, flags, batch_size):
    model_dir, data = folder
    asked = record_batch_limits(monkeypatch)
    run(["--model", model_dir, "--input", data["test.src"], "--output", tmp_path / "out.en", "--num_beams", "1",
         "--quiet", *flags], capsys)
    assert asked["batch_size"] == batch_size
    assert asked["max_tokens"] == (99 if "--max_tokens" in flags else None if "--batch_size" in flags else 4096)


@pytest.mark.parametrize("flags, batch_size", [((), GENERATE_BATCH_SIZE), (("--decoding", "fast"), 640)])
def test_the_command_decodes_through_generate_on_cuda_unless_told(folder, tmp_path, capsys, monkeypatch, flags,
                                                                  batch_size):
    """--decoding auto (the default) asks `fast_path_by_default` of the model's device; here the CPU is taken for
    CUDA, and the batch size says which search decoded (generate's 32, the fast path's 640 rows)."""
    assert not translation_sentences.fast_path_by_default(torch.device("cuda"))
    assert not translation_sentences.fast_path_by_default("cuda:1")
    assert translation_sentences.fast_path_by_default(torch.device("cpu"))
    devices = []

    def as_if_on_cuda(device):
        devices.append(device)
        return translation_sentences.fast_path_by_default(torch.device("cuda") if device.type == "cpu" else device)

    monkeypatch.setattr(translator_module, "fast_path_by_default", as_if_on_cuda)  # the translator's rule
    model_dir, data = folder
    asked = record_batch_limits(monkeypatch)
    run(["--model", model_dir, "--input", data["test.src"], "--output", tmp_path / "out.en", "--num_beams", "1",
         "--quiet", *flags], capsys)
    assert asked["batch_size"] == batch_size
    assert devices == ([] if flags else [torch.device("cpu")])


def test_command_refuses_bad_input_before_translating(folder, tmp_path, capsys):
    model_dir, data = folder
    source = tmp_path / "in.de"
    source.write_text("der hund .\n", encoding="utf-8")
    cases = [
        (["--model", model_dir, "--input", tmp_path / "missing.de"], "missing.de: no such file"),
        (["--model", tmp_path / "no-model", "--input", source], "no-model: no such folder"),
        (["--model", model_dir, "--input", source, "--nbest", "3", "--num_beams", "2"], "--nbest 3 is more than"),
        (["--model", model_dir, "--input", source, "--output", source], "is the input file"),
        (["--model", tmp_path / "no-model", "--input", source, "--output", tmp_path / "no" / "out.en"],
         "its folder"),  # the output is checked before the model loads
        (["--model", model_dir, "--input", source, "--output", tmp_path], "is a folder"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            run(argv, capsys)
        assert exit_info.value.code != 0
        assert message in capsys.readouterr().err, message
    source.write_bytes(b"gut\n\xfcbel\n")
    with pytest.raises(SystemExit):
        run(["--model", model_dir, "--input", source], capsys)
    assert "in.de, line 2: not UTF-8" in capsys.readouterr().err


def test_an_interrupted_run_leaves_no_output_file(folder, tmp_path, capsys, monkeypatch):
    model_dir, data = folder
    output = tmp_path / "out.en"
    output.write_text("the previous translation\n", encoding="utf-8")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translator_module, "translate", interrupted)  # what the model's translator runs
    with pytest.raises(KeyboardInterrupt):
        run(["--model", model_dir, "--input", data["test.src"], "--output", output], capsys)
    assert output.read_text(encoding="utf-8") == "the previous translation\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.en"]


@pytest.mark.slow
def test_two_processes_translate_their_shares_into_one_file_in_input_order(folder, tmp_path):
    """torchrun with 2 processes: Accelerate splits the batches, the first process writes everything in order."""
    import shutil
    import subprocess
    import sys

    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    model_dir, data = folder
    lines = read_lines(data["test.src"])
    source = tmp_path / "in.de"
    source.write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n", encoding="utf-8")
    flags = ["-m", "hf_headattn.commands.translate", "--model", str(model_dir), "--input", str(source),
             "--batch_size", "2", "--num_beams", "2", "--output_format", "jsonl", "--alignments"]
    one = subprocess.run([sys.executable, *flags, "--output", str(tmp_path / "one.jsonl")], capture_output=True,
                         text=True)
    assert one.returncode == 0, one.stderr
    two = subprocess.run(["torchrun", "--nproc_per_node", "2", *flags, "--output", str(tmp_path / "two.jsonl")],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert two.returncode == 0, two.stderr
    records = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [record["source"] for record in records] == lines[:5] + [""] + lines[5:]
    assert (tmp_path / "two.jsonl").read_text(encoding="utf-8") == (tmp_path / "one.jsonl").read_text(encoding="utf-8")
    assert two.stderr.count("lines translated") == 1  # one summary, from the process that wrote


def test_half_precision_on_a_cpu_without_its_arithmetic_is_said_to_be_slow(folder, tmp_path, capsys, monkeypatch,
                                                                             caplog):
    model_dir, _ = folder
    source = tmp_path / "in.de"
    source.write_text("der hund .\n", encoding="utf-8")
    for has_it in (False, True):
        monkeypatch.setattr(translate_command, "cpu_has_any_flag", lambda flags: has_it)
        caplog.clear()
        run(["--model", model_dir, "--input", source, "--output", tmp_path / "out.en", "--device", "cpu",
             "--dtype", "bfloat16", "--max_new_tokens", "3"], capsys)
        warned = "--dtype bfloat16 on this CPU, which lacks avx512_bf16 and amx_bf16" in caplog.text
        assert warned is not has_it
        assert ("slower than float32; for a faster CPU model use --quantize int8" in caplog.text) is not has_it
    assert (tmp_path / "out.en").read_text(encoding="utf-8").count("\n") == 1
