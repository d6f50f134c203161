"""Deployment: `hf-headattn-export --format ctranslate2` (through to_marian and CTranslate2's own converter) gives
CTranslate2 models that translate as the package does; what CTranslate2 cannot run is refused before anything is
written; an export is never left half-written."""

import copy
import json

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.commands.export import main
from hf_headattn.export import export_ctranslate2, translate_with_ctranslate2
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.translation import translate

from helpers import EOS, random_model, tiny_config, toy_data, train_tiny_model

ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 export needs ctranslate2 (the [deploy] extra)")


@pytest.fixture(scope="module")
def pairs():
    return make_toy_corpus(300, seed=3)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=64)


@pytest.fixture(scope="module")
def softmax_model():
    model = random_model(tiny_config())
    with torch.no_grad():
        model.final_logits_bias[0, EOS] += 6.25  # translations of many lengths (as in test_decoding)
    return model


@pytest.fixture(scope="module")
def exported(softmax_model, tokenizer, tmp_path_factory):
    return export_ctranslate2(softmax_model, tokenizer, tmp_path_factory.mktemp("ct2") / "float32")


def test_ctranslate2_greedy_translations_are_the_packages(softmax_model, tokenizer, exported, pairs):
    """Greedy search, where both search alike (beam search differs in when it stops: examples/benchmark_decoding.py
    measures the agreement of both on a trained model)."""
    sources = [source for source, _ in pairs[:40]] + [""]
    # random models fall into repeating one token; forbidding repeats makes every step's argmax matter
    ours = [translation.text for translation in translate(softmax_model, tokenizer, sources, num_beams=1,
                                                          max_new_tokens=20, no_repeat_ngram_size=1)]
    theirs = translate_with_ctranslate2(exported, sources, beam_size=1, max_decoding_length=20,
                                        no_repeat_ngram_size=1)
    assert theirs[-1] == ""  # a blank line stays blank
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.95 * len(sources), list(zip(ours, theirs))
    assert len({len(text) for text in ours}) >= 3  # the comparison covers translations of many lengths


def test_the_export_keeps_every_token_and_starts_the_decoder_from_pad(exported, tokenizer):
    config = json.loads((exported / "config.json").read_text())
    assert config["decoder_start_token"] == "<pad>" and config["eos_token"] == "</s>"
    vocabulary = (exported / "shared_vocabulary.json")
    tokens = json.loads(vocabulary.read_text()) if vocabulary.exists() else None
    if tokens is not None:
        assert tokens == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    record = json.loads((exported / "hf_headattn_export.json").read_text())
    assert record["format"] == "ctranslate2" and record["quantization"] == "float32"
    assert (exported / "tokenizer" / "tokenizer.json").is_file()


def test_int8_export_translates(softmax_model, tokenizer, pairs, exported, tmp_path):
    int8 = export_ctranslate2(softmax_model, tokenizer, tmp_path / "int8", quantization="int8")
    assert (int8 / "model.bin").stat().st_size < 0.5 * (exported / "model.bin").stat().st_size
    sources = [source for source, _ in pairs[:10]]
    translations = translate_with_ctranslate2(int8, sources, beam_size=2, max_decoding_length=20)
    assert len(translations) == 10 and all(translations)


@pytest.mark.parametrize("variant, site", [
    ({"cross_attention": "sparsemax"}, "cross_attention of layer 0 uses the 'sparsemax'"),
    ({"encoder_self_attention": "mma"}, "encoder_self_attention of layer 0 uses the 'mma'"),
    ({"cross_attention": "csparsemax", "constant_fertility": 1.0}, "cross_attention of layer 0 uses the 'csparsemax'"),
])
def test_variants_ctranslate2_cannot_run_are_refused_naming_variant_and_site(variant, site, tokenizer, tmp_path):
    with pytest.raises(ValueError, match=site):
        export_ctranslate2(random_model(tiny_config(**variant)), tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_lstm_models_are_refused(tokenizer, tmp_path):
    from test_rnn import random_rnn_model, rnn_config

    with pytest.raises(ValueError, match="LSTM family has no CTranslate2 architecture"):
        export_ctranslate2(random_rnn_model(rnn_config()), tokenizer, tmp_path / "out")


def test_bad_settings_are_refused_before_anything_is_written(softmax_model, tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="Unknown quantization 'int4'; accepted: float32, int8"):
        export_ctranslate2(softmax_model, tokenizer, tmp_path / "out", quantization="int4")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists; choose another folder or pass --overwrite"):
        export_ctranslate2(softmax_model, tokenizer, existing)
    assert (existing / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="existing is the input .*existing: writing there would delete it"):
        export_ctranslate2(softmax_model, tokenizer, existing, overwrite=True, source=str(existing))
    monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install "ctranslate2>=4.5" \(the deploy extra\)'):
        export_ctranslate2(softmax_model, tokenizer, tmp_path / "out")


def test_an_interrupted_export_leaves_the_old_folder_and_no_partial_one(softmax_model, tokenizer, tmp_path,
                                                                        monkeypatch):
    from ctranslate2.converters.converter import Converter

    target = tmp_path / "model"
    export_ctranslate2(softmax_model, tokenizer, target)
    before = sorted(path.name for path in target.iterdir())

    def fail(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Converter, "convert", fail)
    other = copy.deepcopy(softmax_model)
    with pytest.raises(KeyboardInterrupt):
        export_ctranslate2(other, tokenizer, target, overwrite=True)
    assert sorted(path.name for path in target.iterdir()) == before
    assert [path.name for path in tmp_path.iterdir()] == ["model"]  # no staging folder left


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    directory = tmp_path_factory.mktemp("export")
    return train_tiny_model(toy_data(directory / "data"), directory / "model", "transformer")


def test_command_exports_a_folder_and_refuses_what_it_cannot(folder, tmp_path, capsys):
    main(["--format", "ctranslate2", "--model", str(folder), "--output-dir", str(tmp_path / "ct2"),
          "--quantization", "int8"])
    assert (tmp_path / "ct2" / "model.bin").is_file()
    assert "CTranslate2 model (int8) written" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["--format", "ctranslate2", "--model", str(folder), "--output_dir", str(tmp_path / "ct2")])
    assert refused.value.code == 2 and "exists; choose another folder or pass --overwrite" in capsys.readouterr().err
    main(["--format", "ctranslate2", "--model", str(folder), "--output_dir", str(tmp_path / "ct2"), "--overwrite"])
    assert "CTranslate2 model (float32) written" in capsys.readouterr().err  # an export replaces an export
    for holds_the_model in (folder.parent, folder):  # data loss before issue 44: the model exported deleted
        with pytest.raises(SystemExit) as refused:
            main(["--format", "ctranslate2", "--model", str(folder), "--output_dir", str(holds_the_model),
                  "--overwrite"])
        assert refused.value.code == 2 and "writing there would delete it" in capsys.readouterr().err
    assert (folder / "model.safetensors").is_file()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as refused:
        main(["--format", "ctranslate2", "--model", str(folder), "--output_dir", str(tmp_path / "mine"), "--overwrite"])
    assert "--overwrite replaces only a folder hf-headattn-export wrote" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["--format", "onnx", "--model", str(folder), "--output_dir", str(tmp_path / "onnx")])
    assert refused.value.code == 2 and "invalid choice: 'onnx'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["--format", "ctranslate2", "--model", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "x")])
    assert refused.value.code == 1 and "cannot load --model" in capsys.readouterr().err
