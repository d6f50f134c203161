"""One translator (`load_translator`) for a model and its CTranslate2 export: the same `Translation` fields where both
can give them; what a backend cannot honour refused with one error (`OptionRefused`: each option and its reason),
worded with the library's names in the library and with the flags by the commands."""

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.cli import FLAG_SPELLING
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.translation import (ModelTranslator, OptionRefused, Refusal, Translation, check_options,
                                     load_translator, translate)

from helpers import EOS, random_model, tiny_config


@pytest.fixture(scope="module")
def pairs():
    return make_toy_corpus(300, seed=3)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=64)


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    """A random model saved as a folder, whose translations vary in words and length (some empty)."""
    model = random_model(tiny_config(), std=0.5)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] += 14.0
    directory = tmp_path_factory.mktemp("translator") / "model"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def export(folder, tmp_path_factory):
    pytest.importorskip("ctranslate2", reason="CTranslate2 export needs ctranslate2 (the [deploy] extra)")
    from hf_headattn.export import export_ctranslate2
    from hf_headattn.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(folder)
    return export_ctranslate2(model, tokenizer, tmp_path_factory.mktemp("translator-export") / "ct2")


@pytest.fixture(scope="module")
def sources(pairs):
    lines = [source for source, _ in pairs[:30]]
    lines.insert(3, "")
    return lines


def fields(translations: list[Translation]) -> list:
    """What both backends give alike: sources, and each hypothesis' text and alignment (scores apart)."""
    return [(translation.source, [(hypothesis.text, hypothesis.alignment) for hypothesis in translation.hypotheses])
            for translation in translations]


def scores(translations: list[Translation]) -> list[float]:
    return [hypothesis.score for translation in translations for hypothesis in translation.hypotheses]


@pytest.mark.parametrize("fast", [None, False], ids=["fast-path", "generate"])
def test_a_model_and_its_export_give_the_same_translations(fast, folder, export, sources):
    """Greedy search with scores and alignments: the same texts and alignments through the model (fast path or
    generate) and through the export, the same scores to the kernels' rounding, a blank line blank in both."""
    model, exported = load_translator(folder, device="cpu"), load_translator(export, device="cpu")
    assert (model.backend, exported.backend) == ("model", "ctranslate2")
    options = dict(scores=True, alignments=True, num_beams=1, max_new_tokens=10)
    ours = model.translate(sources, fast=fast, **options)
    theirs = exported.translate(sources, **options)
    assert fields(theirs) == fields(ours) and ours[3] == Translation("", [])
    assert scores(theirs) == pytest.approx(scores(ours), abs=2e-3)
    assert len({translation.text for translation in ours}) >= 5
    # the function under the model's translator, as before
    assert fields(translate(model.model, model.tokenizer, sources, fast=fast is not False, **options)) == fields(ours)


def test_a_loaded_model_is_a_translator_too(folder, sources):
    loaded = load_translator(folder, device="cpu")
    again = load_translator(loaded.model, tokenizer=loaded.tokenizer)
    assert isinstance(again, ModelTranslator)
    assert fields(again.translate(sources, num_beams=2, nbest=2)) == fields(loaded.translate(sources, num_beams=2,
                                                                                             nbest=2))
    with pytest.raises(ValueError, match="pass tokenizer="):
        load_translator(loaded.model)
    sampled = [loaded.translate(sources, do_sample=True, top_k=20, seed=5) for _ in range(2)]
    assert fields(sampled[0]) == fields(sampled[1])  # the seed seeds sampling


def library_and_flag_words(error: OptionRefused) -> tuple[str, str]:
    return str(error), str(error.spelled(FLAG_SPELLING))


def test_what_an_export_cannot_honour_is_one_error_naming_option_and_reason(export, sources):
    translator = load_translator(export, device="cpu")
    with pytest.raises(OptionRefused) as refused:
        translator.translate(sources, fast=False, attention=True, alignments=True, alignment_heads="hop")
    error = refused.value
    assert isinstance(error, ValueError) and error.options == ["fast", "attention", "alignment_heads"]
    assert error.refusals[0] == Refusal("fast", False, "an export decodes with CTranslate2's own search")
    library, flags = library_and_flag_words(error)
    assert library.startswith(f"{export} is a CTranslate2 export, which cannot take fast=False (an export decodes")
    assert "--" not in library and "alignment_heads='hop' (an export averages the heads" in library
    assert "--decoding generate (an export decodes with CTranslate2's own search)" in flags
    assert "--attention (CTranslate2 gives one layer's attention" in flags and "--alignment_heads hop (" in flags
    with pytest.raises(OptionRefused) as refused:  # before anything is loaded
        check_options(export, tokenizer="other", do_sample=True, num_beams=3, early_stopping="never")
    library, flags = library_and_flag_words(refused.value)
    assert refused.value.options == ["tokenizer", "do_sample", "early_stopping"] and "--" not in library
    assert "do_sample=True with 3 beams (CTranslate2 samples with beam 1: pass num_beams 1)" in library
    assert "--do_sample with 3 beams (CTranslate2 samples with beam 1: pass --num_beams 1)" in flags
    assert "--early_stopping never (CTranslate2's beam search ends a sentence" in flags
    with pytest.raises(OptionRefused, match="tokenizer='other'"):
        load_translator(export, tokenizer="other")
    with pytest.raises(OptionRefused, match=r"nbest=3 is more than the 1 beam \(") as refused:
        translator.translate(sources, nbest=3)
    assert refused.value.options == ["nbest"]


def test_what_a_model_cannot_honour_is_the_same_error(folder, sources):
    translator = load_translator(folder, device="cpu")
    with pytest.raises(OptionRefused) as refused:
        translator.translate(sources, early_stopping=True, coverage_penalty=0.4)  # the folder decodes greedily
    assert refused.value.options == ["coverage_penalty", "early_stopping"]
    library, flags = library_and_flag_words(refused.value)
    assert "--" not in library and "early_stopping=True ends beam search; the model decodes greedily" in library
    assert "--coverage_penalty 0.4: " in flags and "headattn model, whose generate has no coverage penalty" in flags
    assert "--early_stopping true ends beam search; the model decodes greedily (num_beams 1): pass --num_beams 2" \
        in flags
    check_options(folder, early_stopping=True)  # a model's options are checked once it is loaded


def test_the_translate_command_words_a_refusal_with_its_flags(folder, export, tmp_path, capsys):
    from hf_headattn.commands.translate import main

    source = tmp_path / "in.de"
    source.write_text("ein hund .\n", encoding="utf-8")
    for model, flags, words in [
            (folder, ["--early_stopping", "false"], "--early_stopping false ends beam search"),
            (folder, ["--nbest", "2"], "--nbest 2 is more than the 1 beam (beam search keeps --num_beams"),
            (export, ["--decoding", "generate", "--alignments", "--alignment_heads", "hop"],
             "cannot take --decoding generate (an export decodes with CTranslate2's own search); --alignment_heads "
             "hop (")]:
        with pytest.raises(SystemExit) as refused:
            main(["--model", str(model), "--input", str(source), *flags])
        error = capsys.readouterr().err
        assert refused.value.code == 2 and words in error, error
        assert "fast=" not in error and "=True" not in error
