"""Tiny trained model folders of both families, made by the training command on the toy corpus."""

from pathlib import Path

import pytest

from hf_headattn import tokenization
from hf_headattn.toy_corpus import write_toy_corpus
from hf_headattn.training import run, train


# Tiny trained folders of both families, made with the training command
N_TRAIN, N_TEST = 200, 12
FAMILIES = {  # the training command's flags for a tiny model of each family
    "transformer": ["--architecture", "transformer", "--d_model", "32", "--layers", "2", "--heads", "4",
                    "--ffn_dim", "64"],
    "rnn": ["--architecture", "rnn", "--embedding_size", "16", "--hidden_size", "32", "--heads", "2", "--hops", "2"],
}


def toy_data(directory: Path) -> dict[str, Path]:
    """A toy German-English corpus: train.src/.tgt (200 pairs), valid.* (8) and test.* (12)."""
    return write_toy_corpus(directory, n_train=N_TRAIN, n_valid=8, n_test=N_TEST, seed=0)


def file_flags(data: dict[str, Path], validation: bool = True) -> list[str]:
    """The training command's flags for `write_toy_corpus`' files (`data`), the validation files too if
    `validation`."""
    flags = ["--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"])]
    if validation:
        flags += ["--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"])]
    return flags


def train_tiny_model(data: dict[str, Path], output_dir: Path, family: str, *extra: str, max_length: int = 12) -> Path:
    """A tiny model trained for 3 optimizer steps with the training command: a real saved folder (model,
    tokenizer, code, pipeline, train_results.json, training_args.bin), in about a second. Outputs are at
    most `max_length` tokens long (the barely trained model rarely stops earlier), which keeps decoding cheap; the
    default 12 truncates some toy sentences (with a warning), 48 keeps them whole."""
    train([
        *FAMILIES[family], *extra,
        "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
        "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
        "--output_dir", str(output_dir), "--max_steps", "3", "--vocab_size", "200", "--max_length", str(max_length),
        "--per_device_train_batch_size", "16", "--warmup_steps", "1", "--logging_steps", "1",
    ])
    return output_dir


def refused_before_data(argv: list[str], monkeypatch, capsys) -> str:
    """`hf-headattn-train argv` (in process) with reading data and training a tokenizer made to fail the test:
    asserts that the flags are refused first, with exit status 2, and returns what the command wrote to stderr."""

    def must_not_run(*args, **kwargs):
        raise AssertionError("the command read data or trained a tokenizer before rejecting the flags")

    monkeypatch.setattr(run, "load_data", must_not_run)
    monkeypatch.setattr(tokenization, "train_tokenizer", must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        train(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err
