"""The training command: data loading errors, Hugging Face datasets, the demo, and (slow) real-data and
two-process runs."""

import json
import os
import shutil
import subprocess

import pytest
from datasets import Dataset

from hf_headattn import demo
from hf_headattn.toy_corpus import make_toy_corpus, write_toy_corpus
from hf_headattn.training import load_hub_translation_dataset, main as train, read_parallel_files, translate_and_score

from helpers import MULTI30K, REPO


TINY_MODEL = ["--vocab-size", "300", "--d-model", "32", "--layers", "1", "--heads", "2", "--ffn-dim", "64",
              "--batch-size", "16", "--num-beams", "1", "--warmup-steps", "5", "--max-length", "32"]


def test_missing_and_misaligned_files_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Parallel text file not found: .*nowhere\.de"):
        read_parallel_files(tmp_path / "nowhere.de", tmp_path / "nowhere.en")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(ValueError, match=r"a\.de has 2 lines but .*a\.en has 1; parallel files must be line-aligned"):
        read_parallel_files(tmp_path / "a.de", tmp_path / "a.en")


def test_cli_rejects_ambiguous_data_arguments(capsys):
    with pytest.raises(SystemExit):
        train(["--output-dir", "x"])
    assert "give either --train-source/--train-target (text files) or --dataset" in capsys.readouterr().err


def test_local_hf_dataset_with_translation_column(tmp_path):
    pairs = make_toy_corpus(120, seed=3)
    rows = [{"de": source, "en": target} for source, target in pairs]
    # a folder of data files, which load_dataset reads like a Hub dataset
    Dataset.from_dict({"translation": rows}).to_json(tmp_path / "dataset" / "train.jsonl")
    Dataset.from_dict({"translation": rows[:10]}).to_json(tmp_path / "dataset" / "validation.jsonl")
    loaded = load_hub_translation_dataset(str(tmp_path / "dataset"), None, "de", "en", "train")
    assert loaded[0] == {"source": pairs[0][0], "target": pairs[0][1]}
    with pytest.raises(ValueError, match=r"has languages \['de', 'en'\]; asked for 'fr' -> 'en'"):
        load_hub_translation_dataset(str(tmp_path / "dataset"), None, "fr", "en", "train")

    metrics = train(["--dataset", str(tmp_path / "dataset"), "--output-dir", str(tmp_path / "run"),
                     "--max-steps", "3", *TINY_MODEL])
    assert metrics["train_pairs"] == 120 and "valid_bleu" in metrics and "valid_chrf" in metrics
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_demo_trains_reloads_through_remote_code_and_translates(tmp_path):
    summary = demo.run(tmp_path, epochs=5)
    assert summary["test_sentences"] == 100
    assert summary["bleu"] > 90, summary  # the toy language is learnt almost perfectly in 5 epochs
    assert (tmp_path / "model" / "pipeline_headattn.py").exists()
    scores = translate_and_score(tmp_path / "model", tmp_path / "data" / "test.src", tmp_path / "data" / "test.tgt",
                                 num_beams=4)
    assert scores["sentences"] == 100 and scores["bleu"] > 90


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K}")
def test_train_on_2000_multi30k_pairs_end_to_end(tmp_path):
    metrics = train([
        "--train-source", str(MULTI30K / "train.de"), "--train-target", str(MULTI30K / "train.en"),
        "--valid-source", str(MULTI30K / "val.de"), "--valid-target", str(MULTI30K / "val.en"),
        "--max-train-pairs", "2000", "--max-valid-pairs", "100", "--output-dir", str(tmp_path),
        "--vocab-size", "2000", "--d-model", "64", "--layers", "2", "--heads", "4", "--ffn-dim", "128",
        "--epochs", "2", "--batch-size", "32", "--num-beams", "2", "--warmup-steps", "50",
        "--cross-attention", '{"type": "running_sum", "layers": [-1]}',
    ])
    assert metrics["train_pairs"] == 2000 and metrics["valid_bleu"] >= 0 and metrics["valid_chrf"] > 0
    results = json.loads((tmp_path / "train_results.json").read_text())
    assert results["valid_bleu"] == metrics["valid_bleu"]
    from transformers import pipeline

    translator = pipeline("translation", model=str(tmp_path), trust_remote_code=True)
    assert isinstance(translator("Ein Hund läuft.")[0]["translation_text"], str)


@pytest.mark.slow
def test_torchrun_really_runs_two_processes(tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    data = write_toy_corpus(tmp_path / "data", n_train=400, n_valid=20, seed=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        ["torchrun", "--nproc_per_node", "2", str(REPO / "examples" / "train_translation.py"),
         "--train-source", str(data["train.src"]), "--train-target", str(data["train.tgt"]),
         "--valid-source", str(data["valid.src"]), "--valid-target", str(data["valid.tgt"]),
         "--output-dir", str(tmp_path / "run"), "--max-steps", "6", *TINY_MODEL],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "train_results.json").read_text())
    assert results["world_size"] == 2
    assert (tmp_path / "run" / "model.safetensors").exists()
