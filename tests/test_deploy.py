"""Deployment: `hf-headattn-export --format ctranslate2` (through to_marian and CTranslate2's own converter) gives
CTranslate2 models that translate as the package does; what CTranslate2 cannot run is refused before anything is
written; an export is never left half-written."""

import copy
import json
import shutil

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.commands.export import main
from hf_headattn.export import export_ctranslate2, translate_with_ctranslate2
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.translation import DEFAULT_BATCH_SIZE, translate
from hf_headattn.translation.ctranslate2_backend import export_batch_size

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
    assert record["alignment"] == {"layer": 1, "layers": 2, "heads": "mean"}  # what CTranslate2's attention averages
    assert record["max_position_embeddings"] == 64 and record["model_type"] == "headattn"
    assert (exported / "tokenizer" / "tokenizer.json").is_file() and (exported / "generation_config.json").is_file()


def test_int8_export_translates(softmax_model, tokenizer, pairs, exported, tmp_path):
    int8 = export_ctranslate2(softmax_model, tokenizer, tmp_path / "int8", quantization="int8")
    assert (int8 / "model.bin").stat().st_size < 0.5 * (exported / "model.bin").stat().st_size
    sources = [source for source, _ in pairs[:10]]
    translations = translate_with_ctranslate2(int8, sources, beam_size=2, max_decoding_length=20)
    assert len(translations) == 10 and all(translations)


# every variant Marian does not compute (not `exportable`), alone at each site it declares
REFUSED_PLACEMENTS = [(name, site) for name, variant in sorted(ATTENTION_VARIANTS.items()) if not variant.exportable
                      for site in variant.sites]


@pytest.mark.parametrize("name, site", REFUSED_PLACEMENTS)
def test_variants_ctranslate2_cannot_run_are_refused_naming_variant_and_site(name, site, tokenizer, tmp_path):
    placement = {site: ATTENTION_VARIANTS[name].placement(site, num_heads=4)}
    with pytest.raises(ValueError, match=rf"{site} of layer \d+ uses the '{name}' attention variant; MarianMTModel "
                                         "computes softmax"):
        export_ctranslate2(random_model(tiny_config(**placement)), tokenizer, tmp_path / "out")
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
    assert refused.value.code == 2 and "missing: no such folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the commands
@pytest.fixture(scope="module")
def folder_export(folder, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("folder-export") / "ct2"
    main(["--format", "ctranslate2", "--model", str(folder), "--output_dir", str(output_dir)])
    return output_dir


@pytest.fixture(scope="module")
def test_files(pairs, tmp_path_factory):
    """40 toy sources (some longer than the folder's 12 tokens, cut with a warning by both paths), a blank line."""
    directory = tmp_path_factory.mktemp("test-files")
    sources = [source for source, _ in pairs[:40]]
    sources.insert(5, "")
    references = [target for _, target in pairs[:40]]
    references.insert(5, "")
    (directory / "test.src").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    (directory / "test.tgt").write_text("".join(line + "\n" for line in references), encoding="utf-8")
    return directory / "test.src", directory / "test.tgt"


def translate_command(argv, capsys):
    from hf_headattn.commands.translate import main as translate_main

    translate_main(argv)
    return capsys.readouterr()


def split_nbest(lines):
    """n-best lines as (index, text, score, alignment...): the fields without the score, and the score."""
    fields = [line.split(" ||| ") for line in lines]
    return [[field for k, field in enumerate(row) if k != 2] for row in fields], [float(row[2]) for row in fields]


@pytest.fixture(scope="module")
def varied_folder(tokenizer, tmp_path_factory):
    """A random model saved as a folder, whose translations vary in words and length (some empty), and its export."""
    model = random_model(tiny_config(), std=0.5)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] += 14.0
    directory = tmp_path_factory.mktemp("varied")
    model.save_pretrained(directory / "model")
    tokenizer.save_pretrained(directory / "model")
    main(["--format", "ctranslate2", "--model", str(directory / "model"), "--output_dir", str(directory / "ct2")])
    return directory / "model", directory / "ct2"


def jsonl_lines(output):
    return [json.loads(line) for line in output.splitlines()]


def without_scores(lines):
    return [[{**hypothesis, "score": None} for hypothesis in line["translations"]] for line in lines]


def scores_of(lines):
    return [hypothesis["score"] for line in lines for hypothesis in line["translations"]]


@pytest.mark.parametrize("flags", [[], ["--alignments", "--output_format", "jsonl", "--max_tokens", "60"]],
                         ids=["text", "jsonl-alignments"])
def test_translate_command_gives_an_exports_greedy_lines_as_the_model_s(flags, varied_folder, test_files, capsys):
    """Greedy search (the folder's generation config): the same lines, alignments and summary through the export as
    through the model, scores to the kernels' rounding."""
    source = str(test_files[0])
    ours, theirs = (translate_command(["--model", str(model), "--input", source, *flags], capsys)
                    for model in varied_folder)
    assert theirs.err.splitlines()[-1].split(" in ")[0] == ours.err.splitlines()[-1].split(" in ")[0] \
        == "40 lines translated (1 blank)"
    if flags:
        ours, theirs = jsonl_lines(ours.out), jsonl_lines(theirs.out)
        assert without_scores(theirs) == without_scores(ours)
        assert scores_of(theirs) == pytest.approx(scores_of(ours), abs=2e-3)
        ours = [line["translations"][0]["text"] if line["translations"] else "" for line in ours]
    else:
        assert theirs.out == ours.out and theirs.out.splitlines()[5] == ""  # the blank line
        ours = ours.out.splitlines()
    assert len(set(ours)) >= 10 and len({len(line.split()) for line in ours}) >= 4 and "" in ours[6:]


@pytest.mark.parametrize("beams", ["1", "3"])
def test_min_new_tokens_holds_every_translation_to_a_length_through_model_and_export(beams, varied_folder, test_files,
                                                                                      capsys):
    """`--min_new_tokens` reaches generate, the fast path and CTranslate2 (min_decoding_length): the varied model's
    empty translations are gone, and its lines are the same through each."""
    source = str(test_files[0])
    held = ["--min_new_tokens", "6", "--max_new_tokens", "6", "--num_beams", beams]
    free = translate_command(["--model", str(varied_folder[0]), "--input", source, "--num_beams", beams], capsys)
    assert "" in free.out.splitlines()[6:]
    runs = ((varied_folder[0], []), (varied_folder[0], ["--decoding", "generate"]), (varied_folder[1], []))
    ours, generated, theirs = (translate_command(["--model", str(model), "--input", source, *held, *extra], capsys)
                               for model, extra in runs)
    lines = ours.out.splitlines()
    assert lines[5] == "" and "" not in lines[6:] and generated.out == ours.out
    if beams == "1":  # CTranslate2's beam search stops a sentence when its best beam ends (docs/deploying.md)
        assert theirs.out == ours.out


def test_a_guided_models_export_aligns_with_its_guided_heads(tokenizer, test_files, tmp_path, capsys):
    """A model trained with guided alignment (head 2 of the first of two layers, so neither CTranslate2's default
    layer nor its first head): its export's alignments are the model's, which read the guided head, and differ
    from what the mean of the last layer gives."""
    model = random_model(tiny_config(guided_alignment_weight=0.05, guided_alignment_layer=0,
                                     guided_alignment_heads=[2]), std=0.5)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] += 14.0
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    main(["--format", "ctranslate2", "--model", str(tmp_path / "model"), "--output_dir", str(tmp_path / "ct2")])
    record = json.loads((tmp_path / "ct2" / "hf_headattn_export.json").read_text())
    assert record["alignment"] == {"layer": 0, "layers": 2, "heads": "guided", "guided_heads": [2]}
    flags = ["--input", str(test_files[0]), "--alignments", "--output_format", "jsonl"]
    ours, theirs = (jsonl_lines(translate_command(["--model", str(folder), *flags], capsys).out)
                    for folder in (tmp_path / "model", tmp_path / "ct2"))
    assert without_scores(theirs) == without_scores(ours)
    last_layer = jsonl_lines(translate_command(["--model", str(tmp_path / "model"), *flags, "--alignment_layer", "1",
                                                "--alignment_heads", "all"], capsys).out)
    alignments = [[hypothesis["alignment"] for hypothesis in line["translations"]] for line in ours]
    assert alignments != [[hypothesis["alignment"] for hypothesis in line["translations"]] for line in last_layer]


def test_translate_command_gives_an_exports_beam_lines_and_nbest_lists(folder, folder_export, varied_folder,
                                                                       test_files, capsys, caplog):
    """Beam search: the trained folder's n-best lists with alignments through the export are the model's (the
    sources longer than its 12 tokens cut alike); where the random model's differ, CTranslate2 ended the search
    earlier (once it had num_beams finished hypotheses) with one the model's search outscored."""
    source = str(test_files[0])
    flags = ["--input", source, "--num_beams", "4", "--nbest", "2", "--alignments"]
    ours, theirs = (translate_command(["--model", str(model), *flags], capsys) for model in (folder, folder_export))
    assert caplog.text.count("12 line(s) longer than the model's 12 tokens are translated cut to 12") == 2
    (our_fields, our_scores), (their_fields, their_scores) = (split_nbest(out.out.splitlines())
                                                              for out in (ours, theirs))
    assert their_fields == our_fields and len(their_fields) == 2 * 40
    assert their_scores == pytest.approx(our_scores, abs=2e-3)
    flags = ["--input", source, "--num_beams", "4", "--output_format", "jsonl"]
    ours, theirs = (jsonl_lines(translate_command(["--model", str(model), *flags], capsys).out)
                    for model in varied_folder)
    same = [a == b for a, b in zip(without_scores(ours), without_scores(theirs))]
    assert sum(same) >= 0.75 * len(same)
    for a, b, equal in zip(ours, theirs, same):
        a, b = scores_of([a]), scores_of([b])
        assert b == pytest.approx(a, abs=2e-3) if equal else b[0] <= a[0] + 2e-3, (a, b)


def test_early_stopping_true_is_ctranslate2s_stopping_rule(varied_folder, test_files, capsys):
    """--early_stopping true ends a sentence's beam search once it has num_beams finished hypotheses, CTranslate2's
    rule: the varied model's beam lines through the model are then its export's, every one (with generate's default,
    False, the model searches on past some of them); greedy search is refused the flag, and an export refuses the
    other values, before reading the input."""
    source = str(test_files[0])
    outputs = {}
    for name, extra in (("default", []), ("true", ["--early_stopping", "true"])):
        flags = ["--input", source, "--num_beams", "4", "--output_format", "jsonl", *extra]
        outputs[name] = [without_scores(jsonl_lines(translate_command(["--model", str(model), *flags], capsys).out))
                         for model in varied_folder]
    assert outputs["true"][1] == outputs["true"][0] and len(outputs["true"][0]) == 41
    assert outputs["default"][1] != outputs["default"][0]
    generated = translate_command(["--model", str(varied_folder[0]), "--input", source, "--num_beams", "4",
                                   "--early_stopping", "true", "--decoding", "generate", "--output_format", "jsonl",
                                   "--max_new_tokens", "20"], capsys)  # the default, said (generate warns otherwise)
    assert without_scores(jsonl_lines(generated.out)) == outputs["true"][0]
    for model, flags, named in [
            (varied_folder[0], [], "--early_stopping true ends beam search; the model decodes greedily"),
            (varied_folder[1], [], "--early_stopping with greedy search (num_beams 1)"),
            (varied_folder[1], ["--num_beams", "4"], "CTranslate2's beam search ends a sentence once it has "
                                                     "num_beams finished hypotheses")]:
        value = "true" if not flags else "never"
        with pytest.raises(SystemExit) as refused:
            translate_command(["--model", str(model), "--input", source, "--early_stopping", value, *flags], capsys)
        assert refused.value.code == 2 and named in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(varied_folder[0]), "--early_stopping", "soon"], capsys)
    assert refused.value.code == 2 and "'soon' is not one of true, false, never" in capsys.readouterr().err


def test_evaluate_command_scores_an_export_as_the_model(folder, folder_export, test_files, tmp_path, capsys):
    from hf_headattn.commands.evaluate import main as evaluate_main

    source, reference = test_files
    source.with_name("blankless.src").write_text(source.read_text().replace("\n\n", "\n"))
    reference.with_name("blankless.tgt").write_text(reference.read_text().replace("\n\n", "\n"))
    lines = []
    for model in (folder, folder_export):
        evaluate_main(["--model", str(model), "--source", str(source.with_name("blankless.src")), "--reference",
                       str(reference.with_name("blankless.tgt")), "--output_dir", str(tmp_path / model.name),
                       "--num_beams", "2"])
        lines.append(capsys.readouterr().out.strip())
    assert lines[1].split(" | written")[0] == lines[0].split(" | written")[0]  # BLEU ... | 40 sentences
    hypotheses = [(tmp_path / model.name / "blankless.beam2.hyp.tgt").read_text() for model in (folder, folder_export)]
    assert hypotheses[1] == hypotheses[0]
    metrics = json.loads((tmp_path / folder_export.name / "blankless.beam2.metrics.json").read_text())
    assert metrics["decoding"]["backend"] == "ctranslate2" and metrics["decoding"]["compute_type"] == "float32"
    assert metrics["decoding"]["max_length"] == 12 and metrics["model"]["model_type"] == "headattn"
    assert metrics["model"]["exported_from"] == str(folder)
    assert metrics["decoding"]["batch_size"] == export_batch_size() == 128  # what translate_export took for "auto"


def test_an_exports_batches_are_the_fast_paths_at_beam_5_unless_told():
    assert export_batch_size("auto") == DEFAULT_BATCH_SIZE and export_batch_size(7) == 7
    assert export_batch_size(None) is None  # no limit but --max_tokens
    with pytest.raises(ValueError, match="batch_size must be a positive int, None or 'auto', got 'all'"):
        export_batch_size("all")


@pytest.mark.parametrize("flags, named", [
    (["--decoding", "generate"], "--decoding generate (an export decodes with CTranslate2's own search)"),
    (["--tokenizer", "other"], "--tokenizer other (an export splits text with its own tokenizer/"),
    (["--alignments", "--alignment_heads", "hop"], "--alignment_heads hop (an export averages the heads"),
    (["--alignments", "--alignment_layer", "0"], "--alignment_layer 0 (an export gives the attention of decoder "
                                                 "layer 1, chosen when it was exported"),
    (["--do_sample", "--num_beams", "2"], "--do_sample with 2 beams (CTranslate2 samples with beam 1"),
])
def test_translate_command_refuses_what_an_export_cannot_honour_before_reading(flags, named, folder_export, tmp_path,
                                                                               capsys):
    with pytest.raises(SystemExit) as refused:  # the input does not exist: the refusal comes first
        translate_command(["--model", str(folder_export), "--input", str(tmp_path / "missing.de"), *flags], capsys)
    error = capsys.readouterr().err
    assert refused.value.code == 2 and f"{folder_export} is a CTranslate2 export, which cannot take" in error
    assert named in error


def test_evaluate_refuses_what_an_export_cannot_honour(folder_export, test_files, tmp_path):
    from hf_headattn.evaluation import evaluate_model

    source, reference = test_files
    with pytest.raises(ValueError, match=r"cannot take --tokenizer other .*; --coverage_penalty 0.4 "):
        evaluate_model(folder_export, source, reference, output_dir=tmp_path, coverage_penalty=0.4,
                       tokenizer="other")
    assert not list(tmp_path.iterdir())


def test_folders_that_are_not_whole_exports_are_named(folder_export, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(empty)], capsys)
    assert refused.value.code == 2 and (f"{empty} is neither a saved model folder (config.json and weights, as "
                                        "hf-headattn-train writes) nor a CTranslate2 export") in capsys.readouterr().err
    bare = tmp_path / "bare"  # CTranslate2's files without the tokenizer hf-headattn-export writes beside them
    shutil.copytree(folder_export, bare, ignore=shutil.ignore_patterns("tokenizer", "hf_headattn_export.json"))
    (tmp_path / "in.de").write_text("ein hund .\n")
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(bare), "--input", str(tmp_path / "in.de")], capsys)
    assert refused.value.code == 1 and "without the tokenizer/ folder hf-headattn-export writes" in \
        capsys.readouterr().err
    older = tmp_path / "older"  # written before exports averaged the heads of CTranslate2's attention
    shutil.copytree(folder_export, older)
    record = json.loads((older / "hf_headattn_export.json").read_text())
    del record["alignment"]
    (older / "hf_headattn_export.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(older), "--alignments"], capsys)
    assert "--alignments (this export's CTranslate2 attention is one head's" in capsys.readouterr().err
    full_context = tmp_path / "full-context"  # of a model guided with Garg et al.'s full target context
    shutil.copytree(folder_export, full_context)
    record = json.loads((full_context / "hf_headattn_export.json").read_text())
    record["alignment"] = {**record["alignment"], "full_context": True}
    (full_context / "hf_headattn_export.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(full_context), "--alignments"], capsys)
    assert "--alignments (this model reads its alignments with full target context" in capsys.readouterr().err


def test_translate_command_maps_quantize_and_sampling_to_ctranslate2(folder_export, test_files, capsys, monkeypatch):
    source = str(test_files[0])
    int8 = translate_command(["--model", str(folder_export), "--input", source, "--quantize", "int8"], capsys)
    assert len(int8.out.splitlines()) == 41
    sampled = [translate_command(["--model", str(folder_export), "--input", source, "--do_sample", "--seed", "3",
                                  "--top_k", "20", "--output_format", "jsonl"], capsys).out for _ in range(2)]
    assert sampled[0] == sampled[1]  # the seed seeds CTranslate2's sampling
    # sampled hypotheses are scored by the model (score_batch), not by the sampling distribution: sampling from the
    # top 1 token is greedy search, whose scores CTranslate2's search gives
    from hf_headattn.translation.ctranslate2_backend import load_export, translate_export

    export, sources = load_export(folder_export, device="cpu"), test_files[0].read_text().splitlines()
    greedy = translate_export(export, sources, scores=True)
    top1 = translate_export(export, sources, scores=True, do_sample=True, top_k=1, temperature=0.5)
    assert [translation.text for translation in top1] == [translation.text for translation in greedy]
    assert [hypothesis.score for translation in top1 for hypothesis in translation.hypotheses] == pytest.approx(
        [hypothesis.score for translation in greedy for hypothesis in translation.hypotheses], abs=1e-4)
    monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # as if not installed
    with pytest.raises(SystemExit) as refused:
        translate_command(["--model", str(folder_export), "--input", source], capsys)
    assert refused.value.code == 1 and 'pip install "ctranslate2>=4.5" (the deploy extra)' in capsys.readouterr().err
