"""`--preset goindani2021` (DHICM's paper's recipe: transformer-base at Table 2's optimal De-En values, early
stopping on the validation loss), the flags it needs (--attention_dropout, --activation_dropout) and its
low-resource training sets drawn at random (--sample_train_pairs)."""

import logging

import pytest
from datasets import Dataset
import torch
from safetensors.torch import load_file

from hf_headattn.parallel_data import PairFiles, pairs_on_disk, random_rows
from hf_headattn.toy_corpus import make_toy_corpus, write_toy_corpus
from hf_headattn.training.arguments import build_config, parse_args
from hf_headattn.training.data import load_data, load_hub_translation_dataset, scan_data_files
from hf_headattn.training.presets import TABLE_2
from hf_headattn.training.run import train
from hf_headattn.training.run_manifest import manifest_differences

from helpers import file_flags


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    return write_toy_corpus(tmp_path_factory.mktemp("data"), n_train=60, n_valid=8, seed=0)


def test_the_goindani2021_preset_is_the_papers_recipe(toy_files, tmp_path):
    model_args, data_args, run_args, training_args = parse_args(
        [*file_flags(toy_files), "--output_dir", str(tmp_path / "run"), "--preset", "goindani2021"])
    config = build_config(model_args, data_args)
    optimal = TABLE_2["de-en"]  # the paper's Table 2, optimal De-En column
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim) == (optimal["heads"], optimal["ffn_dim"])
    assert (config.dropout, config.attention_dropout, config.activation_dropout, config.label_smoothing) == (
        optimal["dropout"], optimal["attention_dropout"], optimal["activation_dropout"], optimal["label_smoothing"])
    assert (config.activation_function, config.scale_embedding) == ("relu", True)  # fairseq's Transformer
    assert model_args.vocab_size == 10000 and data_args.max_tokens == 16000
    assert (training_args.learning_rate, training_args.lr_scheduler_type, training_args.warmup_steps) == (
        5e-4, "inverse_sqrt", 4000)
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon) == (0.9, 0.98, 1e-6)
    assert (training_args.weight_decay, training_args.max_grad_norm) == (0.0, 0.0)
    assert (training_args.eval_strategy, training_args.save_strategy) == ("epoch", "best")
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "loss"
    assert run_args.early_stopping_patience == 10


def test_the_dropout_flags_reach_the_transformer_and_are_refused_for_the_lstm(toy_files, tmp_path, capsys):
    model_args, data_args, _, _ = parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "a"),
                                              "--attention_dropout", "0.1", "--activation_dropout", "0.3"])
    config = build_config(model_args, data_args)
    assert (config.attention_dropout, config.activation_dropout) == (0.1, 0.3)
    with pytest.raises(SystemExit):
        parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "b"), "--architecture", "rnn",
                    "--attention_dropout", "0.1"])
    assert "--attention_dropout applies to --architecture transformer only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "c"), "--activation_dropout", "1.5"])
    assert "--activation_dropout" in capsys.readouterr().err


def test_random_rows_are_a_seeded_sorted_sample():
    rows = random_rows(1000, 100, seed=1)
    assert rows == sorted(set(rows)) and len(rows) == 100 and all(0 <= row < 1000 for row in rows)
    assert rows == random_rows(1000, 100, seed=1) != random_rows(1000, 100, seed=2)
    assert random_rows(5, 100, seed=1) == [0, 1, 2, 3, 4]


def test_sampled_training_pairs_are_random_pairs_of_the_corpus_in_its_order(toy_files, tmp_path):
    everything = pairs_on_disk(PairFiles(toy_files["train.src"], toy_files["train.tgt"])).dataset.columns()
    corpus = list(zip(*everything))

    def sample(seed, *extra):
        _, data_args, _, _ = parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "run"),
                                         "--max_train_pairs", "20", "--sample_train_pairs", "true", *extra])
        train_pairs, _, counts = load_data(data_args, scan_data_files(data_args)[0], seed)
        return list(zip(train_pairs["source"], train_pairs["target"])), counts

    pairs, counts = sample(1)
    assert len(pairs) == 20 and counts["train_pairs_read"] == 60
    assert pairs == [corpus[row] for row in random_rows(60, 20, seed=1)]
    assert pairs != corpus[:20]
    assert sample(1)[0] == pairs and sample(2)[0] != pairs


def test_a_sample_without_validation_files_holds_out_its_own_last_pairs(toy_files, tmp_path):
    _, data_args, _, _ = parse_args([*file_flags(toy_files, validation=False), "--output_dir", str(tmp_path / "run"),
                                     "--max_train_pairs", "40", "--sample_train_pairs", "true"])
    train_pairs, held_out, counts = load_data(data_args, scan_data_files(data_args)[0], 3)
    assert (len(train_pairs), len(held_out), counts["train_pairs_held_out"]) == (38, 2, 2)
    corpus = list(zip(*pairs_on_disk(PairFiles(toy_files["train.src"], toy_files["train.tgt"])).dataset.columns()))
    drawn = [corpus[row] for row in random_rows(60, 40, seed=3)]
    assert list(zip(held_out["source"], held_out["target"])) == drawn[38:]


@pytest.mark.parametrize("flags, message", [
    (["--sample_train_pairs", "true"], "--sample_train_pairs draws --max_train_pairs pairs at random; give "
                                       "--max_train_pairs too"),
])
def test_a_sample_needs_its_size(toy_files, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "run"), *flags])
    assert message in capsys.readouterr().err


def test_manifests_from_before_the_new_flags_compare_as_their_defaults():
    current = {"identity": {"--attention_dropout": 0.0, "--activation_dropout": 0.0, "--sample_train_pairs": False},
               "may_change": {}, "files": {}, "versions": {}}
    old = {"identity": {}, "may_change": {}, "files": {}, "versions": {}}
    assert manifest_differences(old, current)[0] == []
    current["identity"]["--attention_dropout"] = 0.1
    assert manifest_differences(old, current)[0] == ["--attention_dropout: 0.0 there, 0.1 now"]


def test_early_stopping_keeps_the_best_epoch_without_warning_of_tied_weights(toy_files, tmp_path, caplog):
    """A tiny model at a high constant learning rate: the validation loss stops falling, training stops
    `--early_stopping_patience` epochs after its best epoch, and the model written is that epoch's checkpoint (the
    only kind --save_strategy best writes), loaded without Trainer's warning about the tied embeddings it saves
    once."""
    output_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        results = train([*file_flags(toy_files), "--output_dir", str(output_dir), "--preset", "goindani2021",
                         "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64", "--vocab_size", "300",
                         "--max_tokens", "600", "--warmup_steps", "1", "--learning_rate", "0.03",
                         "--lr_scheduler_type", "constant", "--dropout", "0", "--attention_dropout", "0",
                         "--activation_dropout", "0", "--num_train_epochs", "40", "--early_stopping_patience", "2",
                         "--keep_checkpoints", "true", "--seed", "1"])
    assert "missing keys" not in caplog.text
    best = max(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert results["epoch"] < 40 and int(best.name.split("-")[1]) < results["global_step"]  # stopped, after the best
    written, kept = (load_file(folder / "model.safetensors") for folder in (output_dir, best))
    assert written.keys() == kept.keys() and all(torch.equal(written[key], kept[key]) for key in written)


def test_a_hugging_face_dataset_is_sampled_as_files_are(tmp_path):
    pairs = make_toy_corpus(50, seed=3)
    Dataset.from_dict({"translation": [{"de": source, "en": target} for source, target in pairs]}).to_json(
        tmp_path / "dataset" / "train.jsonl")
    loaded = load_hub_translation_dataset(str(tmp_path / "dataset"), None, "de", "en", "train", max_pairs=10,
                                          sample_seed=4)
    assert [(row["source"], row["target"]) for row in loaded] == [pairs[row] for row in random_rows(50, 10, seed=4)]
