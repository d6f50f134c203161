"""The translation pipeline: inputs, generation kwargs, outputs, and clear errors."""

import pytest
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
    assert len(translator.tokenizer(short[0]["translation_text"], add_special_tokens=False).input_ids) <= 2
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
