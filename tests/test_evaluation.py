"""The evaluation command: a saved folder of either family + a test set -> hypotheses file and metrics JSON."""

import json
import logging
import re
import runpy
import shutil
import sys

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_headattn.evaluation import evaluate_model, resolve_device

from helpers import FAMILIES, N_TEST, N_TRAIN, REPO, toy_data, train_tiny_model


METRIC_KEYS = {"bleu", "chrf", "ter", "rep", "drop", "bleu_by_length"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def models(data, tmp_path_factory):
    return {family: train_tiny_model(data, tmp_path_factory.mktemp(family), family) for family in FAMILIES}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_evaluation_writes_hypotheses_and_all_metrics(family, models, data, tmp_path):
    results = evaluate_model(models[family], data["test.src"], data["test.tgt"], num_beams=2, batch_size=5,
                             device="cpu", output_dir=tmp_path / "eval", buckets=(5, 8))

    hypotheses_path = tmp_path / "eval" / "test.beam2.hyp.tgt"
    metrics_path = tmp_path / "eval" / "test.beam2.metrics.json"
    assert results["files"] == {"hypotheses": str(hypotheses_path), "metrics": str(metrics_path)}
    hypotheses = hypotheses_path.read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == N_TEST
    assert json.loads(metrics_path.read_text(encoding="utf-8")) == results

    assert METRIC_KEYS <= set(results)
    assert results["drop"] is None  # no training corpus for the aligner
    for name in ("bleu", "chrf", "ter", "rep"):
        assert isinstance(results[name], float) and results[name] >= 0
    assert list(results["bleu_by_length"]) == ["<5", "5-7", ">=8"]
    assert sum(bucket["count"] for bucket in results["bleu_by_length"].values()) == N_TEST

    model = AutoModelForSeq2SeqLM.from_pretrained(models[family], trust_remote_code=True).eval()
    assert results["model"]["model_type"] == {"transformer": "headattn", "rnn": "headattn_rnn"}[family]
    assert results["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert results["model"]["name"] == models[family].name
    assert results["test_set"] == {"name": "test", "source": str(data["test.src"].resolve()),
                                   "reference": str(data["test.tgt"].resolve()), "sentences": N_TEST}
    assert {key: results["decoding"][key] for key in ("name", "num_beams", "batch_size", "device", "max_length")} == {
        "name": "beam2", "num_beams": 2, "batch_size": 5, "device": "cpu", "max_length": 12}
    assert results["metric_settings"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert results["metric_settings"]["rep_drop_tokenize"] == "13a"
    assert len(results["examples"]) == 3 and results["examples"][0]["hypothesis"] == hypotheses[0]

    # The hypotheses are what the folder's model generates with these settings (one sentence alone: no padding).
    tokenizer = AutoTokenizer.from_pretrained(models[family], trust_remote_code=True)
    source = data["test.src"].read_text(encoding="utf-8").splitlines()[0]
    with torch.no_grad():
        output_ids = model.generate(**tokenizer([source], return_tensors="pt"), num_beams=2)
    assert tokenizer.batch_decode(output_ids, skip_special_tokens=True)[0].strip() == hypotheses[0]


def test_drop_is_measured_with_the_aligners_training_corpus(models, data, tmp_path):
    results = evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], num_beams=1, batch_size=16,
                             device="auto", train_source=data["train.src"], train_target=data["train.tgt"],
                             output_dir=tmp_path, test_name="toy-test", drop_runs=2,
                             drop_cache_dir=tmp_path / "cache")
    assert isinstance(results["drop"], float) and 0.0 <= results["drop"] <= 100.0
    assert results["metric_settings"]["drop_aligner_training_pairs"] == N_TRAIN
    assert results["test_set"]["name"] == "toy-test" and (tmp_path / "toy-test.greedy.metrics.json").is_file()
    assert list(results["bleu_by_length"]) == ["<10", "10-19", "20-29", "30-39", "40-49", ">=50"]
    how = results["metric_settings"]["drop_alignment"]
    assert how["runs"] == 2 and len(how["drop_runs"]) == 2 and how["drop_std"] >= 0.0
    assert (how["aligner"], how["alignments"], how["cache_dir"]) == ("trained", "aligned", str(tmp_path / "cache"))

    # The same call again (replacing its result): the same DROP, from the cached aligner and alignments (no eflomal
    # run).
    again = evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], num_beams=1, batch_size=16,
                           device="auto", train_source=data["train.src"], train_target=data["train.tgt"],
                           output_dir=tmp_path, test_name="toy-test", drop_runs=2, drop_cache_dir=tmp_path / "cache",
                           overwrite=True)
    assert again["drop"] == results["drop"]
    again_how = again["metric_settings"]["drop_alignment"]
    assert again_how["drop_runs"] == how["drop_runs"] and (again_how["aligner"], again_how["alignments"]) == (
        "cached", "cached")


def test_example_script_runs_the_command(models, data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [
        "evaluate_translation.py", "--model", str(models["rnn"]), "--source", str(data["test.src"]),
        "--reference", str(data["test.tgt"]), "--output_dir", str(tmp_path), "--num_beams", "1",
        "--batch_size", "4", "--device", "cpu", "--length_buckets", "6",
    ])
    runpy.run_path(str(REPO / "examples" / "evaluate_translation.py"), run_name="__main__")
    printed = capsys.readouterr().out
    metrics_file = tmp_path / "test.greedy.metrics.json"
    # one line for people: the scores, the sentence count and the file holding everything
    assert re.fullmatch(rf"BLEU [\d.]+ \| chrF [\d.]+ \| TER [\d.]+ \| REP [\d.]+ \| {N_TEST} sentences \| "
                        rf"written: {re.escape(str(metrics_file))}\n", printed), printed
    results = json.loads(metrics_file.read_text(encoding="utf-8"))
    assert list(results["bleu_by_length"]) == ["<6", ">=6"] and results["decoding"]["batch_size"] == 4

    # --json: the whole JSON the command wrote, on standard output (the dashed spellings are aliases)
    from hf_headattn.commands.evaluate import main

    main([*sys.argv[1:], "--overwrite", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(metrics_file.read_text(encoding="utf-8"))
    main(["--model", str(models["rnn"]), "--source", str(data["test.src"]), "--reference", str(data["test.tgt"]),
          "--output-dir", str(tmp_path), "--num-beams", "2", "--batch-size", "4", "--device", "cpu"])
    assert (tmp_path / "test.beam2.metrics.json").is_file() and "| written: " in capsys.readouterr().out


@pytest.mark.parametrize("family, flags, name, batch_size", [
    ("transformer", (), "beam4", 160), ("transformer", ("--num_beams", "2"), "beam2", 320),
    ("rnn", ("--num_beams", "1"), "greedy", 640),
    ("rnn", ("--num_beams", "2", "--coverage_penalty", "0.4"), "beam2-cp0.4", 32)])  # generate decodes it
def test_the_command_batches_as_translate_does_unless_told(family, flags, name, batch_size, models, data, tmp_path,
                                                          capsys):
    """Without --batch_size, hf-headattn-translate's batches for the search that decodes; the JSON records the
    number."""
    from hf_headattn.commands.evaluate import main

    main(["--model", str(models[family]), "--source", str(data["test.src"]), "--reference", str(data["test.tgt"]),
          "--output_dir", str(tmp_path), "--device", "cpu", *flags])
    results = json.loads((tmp_path / f"test.{name}.metrics.json").read_text(encoding="utf-8"))
    assert results["decoding"]["batch_size"] == batch_size


def test_the_command_decodes_through_generate_on_cuda(models, data, tmp_path, monkeypatch):
    """As hf-headattn-translate's --decoding auto: `fast_path_by_default` of the device, here the CPU taken for CUDA;
    the batch size says which search decoded (generate's 32 at beam 2 on a CPU, the fast path's 320)."""
    from hf_headattn import translation
    from hf_headattn.translation import translator

    devices = []

    def as_if_on_cuda(device):
        devices.append(device)
        return translation.sentences.fast_path_by_default(torch.device("cuda"))

    monkeypatch.setattr(translator, "fast_path_by_default", as_if_on_cuda)  # the translator's rule
    results = evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], num_beams=2, device="cpu",
                             output_dir=tmp_path)
    assert devices == [torch.device("cpu")] and results["decoding"]["batch_size"] == 32


def test_a_batch_size_that_is_neither_a_count_nor_auto_is_refused(models, data, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be a positive int or 'auto', got 'all'"):
        evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], batch_size="all", device="cpu",
                       output_dir=tmp_path)
    assert not tmp_path.joinpath("test.beam4.metrics.json").exists()


def test_decoding_settings_name_the_outputs_so_runs_never_overwrite_each_other(models, data, tmp_path):
    runs = {  # file stem -> settings; all written into one folder
        "greedy": dict(num_beams=1), "beam2": dict(num_beams=2), "beam2-maxlen6": dict(num_beams=2, max_length=6),
        "beam2-lp0": dict(num_beams=2, length_penalty=0.0), "beam2-estrue": dict(num_beams=2, early_stopping=True),
    }
    results = {}
    for name, settings in runs.items():
        results[name] = evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], batch_size=16,
                                       device="cpu", output_dir=tmp_path, **settings)
        assert results[name]["decoding"]["name"] == name
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        f"test.{name}.{kind}" for name in runs for kind in ("hyp.tgt", "metrics.json"))
    for name, result in results.items():  # each file still holds its own run
        assert json.loads((tmp_path / f"test.{name}.metrics.json").read_text(encoding="utf-8")) == result
        hypotheses = (tmp_path / f"test.{name}.hyp.tgt").read_text(encoding="utf-8").splitlines()
        assert hypotheses[0] == result["examples"][0]["hypothesis"]
    assert results["beam2-maxlen6"]["decoding"]["max_length"] == 6
    assert results["beam2"]["decoding"]["length_penalty"] == 1.0  # the folder's (Transformers' default)
    assert results["beam2-lp0"]["decoding"]["length_penalty"] == 0.0
    assert results["beam2"]["decoding"]["early_stopping"] is False  # the folder's (Transformers' default)
    assert results["beam2-estrue"]["decoding"]["early_stopping"] is True


def test_the_length_penalty_overrides_the_folders_and_ranks_as_generate_does(models, data, tmp_path):
    """length_penalty=0 (OpenNMT-py's -alpha 0: the log-probability alone) gives generate's output at that setting."""
    from hf_headattn.loading import load_model_and_tokenizer

    result = evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=3, length_penalty=0.0,
                            batch_size=16, device="cpu", output_dir=tmp_path)
    model, tokenizer = load_model_and_tokenizer(models["rnn"])
    sources = data["test.src"].read_text(encoding="utf-8").splitlines()[:3]
    output = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=3, length_penalty=0.0)
    assert [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)] == [
        example["hypothesis"] for example in result["examples"][:3]]
    with pytest.raises(ValueError, match="length_penalty must be a finite number, got nan"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=3, length_penalty=float("nan"),
                       device="cpu", output_dir=tmp_path)
    with pytest.raises(ValueError, match="the length penalty ranks beam hypotheses: use num_beams >= 2, got 1"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=1, length_penalty=0.0,
                       device="cpu", output_dir=tmp_path)


def test_early_stopping_overrides_the_folders_and_stops_as_generate_does(models, data, tmp_path):
    """early_stopping=True (fairseq's and CTranslate2's rule) and "never" give generate's output at those settings;
    a value generate does not take, and greedy search, are refused before the model loads."""
    from hf_headattn.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(models["transformer"])
    sources = data["test.src"].read_text(encoding="utf-8").splitlines()
    for value in (True, "never"):
        result = evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], num_beams=3,
                                early_stopping=value, batch_size=16, device="cpu", output_dir=tmp_path)
        output = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=3,
                                early_stopping=value)
        assert [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)][:3] == [
            example["hypothesis"] for example in result["examples"][:3]]
        assert result["decoding"]["early_stopping"] == value
    with pytest.raises(ValueError, match="early_stopping must be True, False or 'never', got 1"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=3, early_stopping=1,
                       device="cpu", output_dir=tmp_path)
    with pytest.raises(ValueError, match="early_stopping ends beam search: use num_beams >= 2, got 1"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=1, early_stopping=True,
                       device="cpu", output_dir=tmp_path)


def test_the_coverage_penalty_reranks_the_lstm_beam_and_names_its_files(models, data, tmp_path):
    from hf_headattn.loading import load_model_and_tokenizer

    result = evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=3, coverage_penalty=0.4,
                            batch_size=16, device="cpu", output_dir=tmp_path)
    assert result["decoding"]["name"] == "beam3-cp0.4" and result["decoding"]["coverage_penalty"] == 0.4
    assert (tmp_path / "test.beam3-cp0.4.hyp.tgt").is_file()
    # the hypotheses are the model's own generate(coverage_penalty=...) output
    model, tokenizer = load_model_and_tokenizer(models["rnn"])
    source = data["test.src"].read_text(encoding="utf-8").splitlines()[:1]
    output = model.generate(**tokenizer(source, return_tensors="pt"), num_beams=3, coverage_penalty=0.4)
    assert tokenizer.decode(output[0], skip_special_tokens=True).strip() == result["examples"][0]["hypothesis"]

    with pytest.raises(ValueError, match="headattn model, whose generate has no coverage penalty"):
        evaluate_model(models["transformer"], data["test.src"], data["test.tgt"], num_beams=3, coverage_penalty=0.4,
                       device="cpu", output_dir=tmp_path / "transformer")
    with pytest.raises(ValueError, match="use num_beams >= 2, got 1"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=1, coverage_penalty=0.4,
                       device="cpu", output_dir=tmp_path)
    with pytest.raises(ValueError, match="coverage_penalty must be a finite number >= 0, got -1"):
        evaluate_model(models["rnn"], data["test.src"], data["test.tgt"], num_beams=3, coverage_penalty=-1,
                       device="cpu", output_dir=tmp_path)


def test_bad_inputs_raise_clear_errors(models, data, tmp_path):
    model_dir, source, reference = models["transformer"], data["test.src"], data["test.tgt"]

    def evaluate(**overrides):
        arguments = dict(model_dir=model_dir, source_path=source, reference_path=reference, output_dir=tmp_path,
                         device="cpu")
        arguments.update(overrides)
        return evaluate_model(**arguments)

    with pytest.raises(FileNotFoundError, match=r"Model folder not found: .*nowhere"):
        evaluate(model_dir=tmp_path / "nowhere")
    (tmp_path / "empty-folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty-folder is not a saved model folder: it has no config\.json"):
        evaluate(model_dir=tmp_path / "empty-folder")
    with pytest.raises(FileNotFoundError, match=r"Text file not found: .*missing\.src"):
        evaluate(source_path=tmp_path / "missing.src")
    short = tmp_path / "short.tgt"
    short.write_text("".join(line + "\n" for line in reference.read_text(encoding="utf-8").splitlines()[:-1]))
    with pytest.raises(ValueError, match=rf"test\.src has {N_TEST} lines but .*short\.tgt has {N_TEST - 1}"):
        evaluate(reference_path=short)
    (tmp_path / "empty.src").write_text("")
    (tmp_path / "empty.tgt").write_text("")
    with pytest.raises(ValueError, match=r"The test set is empty: .*empty\.src has no lines"):
        evaluate(source_path=tmp_path / "empty.src", reference_path=tmp_path / "empty.tgt")
    with pytest.raises(ValueError, match="Pass both train_source and train_target"):
        evaluate(train_source=data["train.src"])
    with pytest.raises(FileNotFoundError, match=r"Text file not found: .*nowhere\.tgt"):
        evaluate(train_source=data["train.src"], train_target=tmp_path / "nowhere.tgt")
    with pytest.raises(ValueError, match=r"Unknown device 'gpu'; accepted: auto, cpu, cuda, cuda:N"):
        evaluate(device="gpu")
    with pytest.raises(ValueError, match="num_beams must be a positive int, got 0"):
        evaluate(num_beams=0)
    with pytest.raises(ValueError, match=r"Unknown tokenize='moses'; accepted: 13a, whitespace"):
        evaluate(tokenize="moses")
    assert not list(tmp_path.glob("*.metrics.json"))  # every check ran before anything was written


def test_device_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device; use cpu or auto"):
            resolve_device("cuda")


def test_a_folder_whose_code_is_not_the_installed_runtime_is_refused_naming_the_files(models, data, tmp_path, caplog):
    """This package's model types load with the installed runtime, so evaluating a folder saved with other code
    would score code its users never run (issue 75): refused, naming the files, or with `force` warned about."""
    folder = tmp_path / "model"
    shutil.copytree(models["transformer"], folder)
    with open(folder / "modeling_headattn.py", "a", encoding="utf-8") as code:
        code.write("\n# saved by another version\n")
    arguments = dict(model_dir=folder, source_path=data["test.src"], reference_path=data["test.tgt"],
                     output_dir=tmp_path / "eval", device="cpu", num_beams=1)
    with pytest.raises(ValueError, match=r"model's saved code differs from the installed hf_headattn .*'s runtime in "
                                         r"modeling_headattn\.py: a user of the folder runs its own code.*--force"):
        evaluate_model(**arguments)
    assert not (tmp_path / "eval").exists()
    with caplog.at_level(logging.WARNING, logger="hf_headattn.evaluation"):
        results = evaluate_model(**arguments, force=True)
    assert "scoring the installed code (--force)" in caplog.text and results["bleu"] is not None
