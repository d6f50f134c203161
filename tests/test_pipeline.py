"""The translation pipeline: inputs, generation kwargs, outputs, and clear errors."""

import warnings

import pytest
import torch
from transformers import pipeline

from hf_headattn import TranslationPipeline, train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import random_model, tiny_config


@pytest.fixture(scope="module")
def tokenizer():
    pairs = make_toy_corpus(300, seed=1)
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150, model="bpe")


@pytest.fixture(scope="module")
def translator(tokenizer):
    return TranslationPipeline(model=random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer=tokenizer)


def test_string_and_list_inputs(translator):
    one = translator("der hund schläft .", max_new_tokens=5)
    assert isinstance(one, list) and len(one) == 1 and isinstance(one[0]["translation_text"], str)
    many = translator(["der hund schläft .", "die katze lacht ."], max_new_tokens=5)
    assert len(many) == 2 and all(set(item) == {"translation_text"} for item in many)
    assert many[0] == one[0]


def test_generation_kwargs_pass_through(translator):
    short = translator("der hund schläft .", max_new_tokens=2, do_sample=False)
    longer = translator("der hund schläft .", max_new_tokens=8, do_sample=False, no_repeat_ngram_size=1)
    batch = translator.tokenizer(["der hund schläft ."], return_tensors="pt")
    two_tokens = translator.model.generate(**batch, max_new_tokens=2, do_sample=False)
    assert two_tokens.shape[1] <= 3  # the start token and at most two more
    assert short[0]["translation_text"] == translator.tokenizer.decode(two_tokens[0], skip_special_tokens=True)
    assert short[0]["translation_text"] != longer[0]["translation_text"]
    several = translator(["der hund schläft .", "die katze lacht ."], num_beams=3, num_return_sequences=3,
                         max_new_tokens=4)
    assert len(several) == 2 and all(len(per_input) == 3 for per_input in several)


def test_batched_pipeline_matches_unbatched(translator):
    sentences = ["der hund schläft .", "ich weiß dass die katze das buch sieht .", "er lacht ."]
    kwargs = dict(max_new_tokens=6, no_repeat_ngram_size=1)
    assert translator(sentences, batch_size=3, **kwargs) == translator(sentences, **kwargs)


def test_bad_inputs_raise_clear_errors(translator, tokenizer):
    with pytest.raises(TypeError, match="takes a string or a list of strings, got int"):
        translator(3)
    too_small = random_model(tiny_config(vocab_size=len(tokenizer) - 10))
    with pytest.raises(ValueError, match=rf"Tokenizer has {len(tokenizer)} tokens but the model's vocabulary has"):
        TranslationPipeline(model=too_small, tokenizer=tokenizer)


def test_pipeline_factory_loads_a_saved_folder(tokenizer, tmp_path):
    model = random_model(tiny_config(vocab_size=len(tokenizer)))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    translator = pipeline("translation", model=str(tmp_path), trust_remote_code=True)
    direct = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert translator("die frau lacht .", max_new_tokens=5) == direct("die frau lacht .", max_new_tokens=5)


def test_empty_and_blank_inputs_translate_to_empty_text_in_place(translator):
    kwargs = dict(max_new_tokens=5)
    assert translator("", **kwargs) == [{"translation_text": ""}]
    assert translator("   \n\t", **kwargs) == [{"translation_text": ""}]
    assert translator([""], **kwargs) == [{"translation_text": ""}]
    alone = translator("der hund schläft .", **kwargs)[0]
    assert translator(["", "der hund schläft .", " "], **kwargs) == [{"translation_text": ""}, alone,
                                                                       {"translation_text": ""}]
    several = translator(["", "der hund schläft ."], num_beams=3, num_return_sequences=3, **kwargs)
    assert several[0] == [{"translation_text": ""}] * 3 and len(several[1]) == 3
    assert translator([], **kwargs) == []


@pytest.mark.parametrize("bad, message", [
    (None, "got NoneType"), (3, "got int"), (["ok .", None], "got NoneType at position 1"),
    ([b"bytes"], "got bytes at position 0"), ({"text": "a"}, "got dict"),
])
def test_none_and_non_strings_are_refused(translator, bad, message):
    with pytest.raises(TypeError, match=f"takes a string or a list of strings, {message}"):
        translator(bad)


def test_truncation_is_reported_once(tokenizer):
    translator = TranslationPipeline(model=random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer=tokenizer)
    long_sentence = "der hund sieht die katze und die frau lacht . " * 3
    with pytest.warns(UserWarning, match=r"Input of \d+ tokens truncated to 5 \(truncation=True\)"):
        translator(long_sentence, truncation=True, max_input_length=5, max_new_tokens=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator(long_sentence, truncation=True, max_input_length=5, max_new_tokens=3)  # reported already
        translator("der hund .", truncation=True, max_input_length=50, max_new_tokens=3)


@pytest.mark.parametrize("variant", [{}, {"cross_attention": "csparsemax", "constant_fertility": 1.0},
                                     {"encoder_self_attention": "mma", "cross_attention": "multihop"}])
def test_a_list_is_batched_by_length_by_default_and_comes_back_in_input_order(tokenizer, variant, monkeypatch):
    translator = TranslationPipeline(model=random_model(tiny_config(vocab_size=len(tokenizer), **variant)),
                                     tokenizer=tokenizer)
    texts = [source for source, _ in make_toy_corpus(40, seed=5)]
    alone = [translator(text, num_beams=2, max_new_tokens=6)[0] for text in texts]
    batches = []
    generate = translator.model.generate
    monkeypatch.setattr(translator.model, "generate",
                        lambda *args, **kwargs: batches.append(kwargs["input_ids"]) or generate(*args, **kwargs))
    assert translator(texts, num_beams=2, max_new_tokens=6) == alone
    assert [len(batch) for batch in batches] == [32, 8]  # DEFAULT_BATCH_SIZE, longest sentences first
    widths = [int(mask.sum()) for batch in batches for mask in (batch != tokenizer.pad_token_id)]
    assert widths == sorted(widths, reverse=True)
    batches.clear()
    assert translator(texts, batch_size=16, num_beams=2, max_new_tokens=6) == alone  # batch_size: as given
    assert [len(batch) for batch in batches] == [16, 16, 8]
    first = tokenizer(texts[:16], return_tensors="pt", padding=True)["input_ids"]
    assert torch.equal(batches[0], first)
