"""The training command's data preparation started before its imports (training/data_prefetch.py): its reading of
the command line agrees with the command's parser, what it prepares is what the command prepares itself, and it is
taken only when made from the same recipe, stopped and cleaned up otherwise."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_headattn.toy_corpus import write_toy_corpus
from hf_headattn.training import data_prefetch
from hf_headattn.training.arguments import argument_parser, parse_args
from hf_headattn.training.data import load_data, scan_data_files, tokenize_splits, train_corpus_tokenizer
from hf_headattn.training.data_prefetch import DataPrefetch
from hf_headattn.training.recipe import RECIPE_DEFAULTS, UNFORESEEN_FLAGS, data_recipe, read_recipe

from helpers import file_flags

TINY_MODEL = ["--vocab_size", "300", "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64",
              "--max_length", "32"]


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    return write_toy_corpus(tmp_path_factory.mktemp("data"), n_train=60, n_valid=5, seed=0)


def commands_recipe(argv) -> dict:
    """The recipe the command's own parser gives (as `run._train` computes it), without files' hashes."""
    model_args, data_args, _, _ = parse_args(argv)
    return data_recipe({**vars(model_args), **vars(data_args)}, {})


@pytest.fixture
def prefetch_allowed(monkeypatch):
    """Torch is imported in this process: start the forked preparation all the same (it never uses torch)."""
    monkeypatch.setattr(data_prefetch, "started_too_late", lambda: False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the test process may have run the tokenizer's threads
    monkeypatch.setenv("HF_DATASETS_CACHE", str(Path(os.environ.get("HF_DATASETS_CACHE", "/tmp")) / "prefetch"))


def test_the_recipe_flags_and_their_defaults_are_the_commands():
    actions = {action.dest: action for action in argument_parser()._actions}
    for name, default in RECIPE_DEFAULTS.items():
        assert name in actions, f"--{name} is no flag of hf-headattn-train"
        assert actions[name].default == default, name
    for name in (*UNFORESEEN_FLAGS, "preset", "output_dir", "overwrite_output_dir", "verbose"):
        assert name in actions, f"--{name} is no flag of hf-headattn-train"


@pytest.mark.parametrize("extra", [
    [],
    ["--vocab-size", "500", "--max_length=64", "--tokenizer_model", "unigram"],
    ["--preset", "multi30k-anchor", "--max_train_pairs", "40"],
    ["--preset=multi30k-anchor", "--vocab_size", "700", "--overwrite_output_dir", "--max_valid_pairs", "3"],
    ["--preprocessing_num_workers", "2", "--source_lang", "fr", "--verbose"],
])
def test_the_start_up_reading_gives_the_commands_recipe(toy_files, tmp_path, extra):
    argv = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run"), *extra]
    recipe, verbose = read_recipe(argv)
    assert data_recipe(recipe, {}) == commands_recipe(argv)
    assert verbose == ("--verbose" in extra)


def test_the_start_up_reading_parses_the_words_as_the_command_does(toy_files, tmp_path):
    """The command's own parser reads the recipe: an abbreviated flag, the last of a repeated one and a boolean
    flag's value mean what they mean to the command (a reading of its own gave the defaults, or True)."""
    argv = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run"), "--max_len", "64",
            "--source_lang", "fr", "--source_lang", "it", "--verbose", "false"]
    recipe, verbose = read_recipe(argv)
    assert data_recipe(recipe, {}) == commands_recipe(argv)
    assert recipe["max_length"] == 64 and recipe["source_lang"] == "it" and verbose is False


def test_an_arguments_file_is_read_with_its_preset_under_it(toy_files, tmp_path):
    values = {"train_source": str(toy_files["train.src"]), "train_target": str(toy_files["train.tgt"]),
              "valid_source": str(toy_files["valid.src"]), "valid_target": str(toy_files["valid.tgt"]),
              "preset": "multi30k-anchor", "max_length": 48, "output_dir": str(tmp_path / "run")}
    for suffix, text in ((".json", json.dumps(values)), (".yaml", "\n".join(f"{k}: {v}" for k, v in values.items()))):
        path = tmp_path / f"args{suffix}"
        path.write_text(text)
        recipe, _ = read_recipe([str(path)])
        assert data_recipe(recipe, {}) == commands_recipe([str(path)])
        assert recipe["max_length"] == 48 and recipe["vocab_size"] == 8000


def test_what_cannot_be_foreseen_starts_nothing(toy_files, tmp_path):
    base = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run")]
    for extra in (["--dataset", "wmt16"], ["--tokenizer", "some/tokenizer"], ["--sample_train_pairs"],
                  ["--resume_from_checkpoint", "x"], ["--help"], ["--version"], ["--vocab_size", "many"],
                  ["--preset", "no-such-preset"]):
        assert read_recipe([*base, *extra]) is None, extra
    assert read_recipe(TINY_MODEL) is None  # no training files: the command says so
    (tmp_path / "run" / "checkpoint-5").mkdir(parents=True)
    assert read_recipe(base) is None  # resumed: the checkpoint's tokenizer
    assert read_recipe([*base, "--overwrite_output_dir"]) is not None
    assert read_recipe([str(tmp_path / "missing.yaml")]) is None


def test_started_in_a_process_with_torch_or_switched_off_it_does_nothing(toy_files, tmp_path, monkeypatch):
    argv = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run")]
    assert data_prefetch.started_too_late()  # this test process imported torch
    with DataPrefetch.start(argv) as prefetch:
        assert not prefetch.active and prefetch.take(commands_recipe(argv)) is None
    monkeypatch.setattr(data_prefetch, "started_too_late", lambda: False)
    monkeypatch.setenv("HF_HEADATTN_DATA_PREFETCH", "0")
    assert not DataPrefetch.start(argv).active


@pytest.mark.parametrize("data", ["text files", "held out", "tsv"])
def test_the_prepared_data_is_what_the_command_prepares(toy_files, tmp_path, prefetch_allowed, data):
    if data == "text files":
        flags = file_flags(toy_files)
    elif data == "held out":  # no validation files: the last 5% of the pairs, a Dataset held in memory
        flags = file_flags(toy_files)[:4] + ["--max_train_pairs", "50"]
    else:
        tsv = tmp_path / "train.tsv"
        pairs = zip(toy_files["train.src"].read_text().splitlines(), toy_files["train.tgt"].read_text().splitlines())
        tsv.write_text("".join(f"{source}\t{target}\n" for source, target in pairs))
        flags = ["--train_file", str(tsv)]
    argv = [*flags, *TINY_MODEL, "--output_dir", str(tmp_path / "run")]
    model_args, data_args, _, _ = parse_args(argv)
    scans, file_sha256 = scan_data_files(data_args)
    with DataPrefetch.start(argv) as prefetch:
        assert prefetch.active
        folder = prefetch._folder
        prepared = prefetch.take(data_recipe({**vars(model_args), **vars(data_args)}, file_sha256))
        assert prepared is not None
    assert not folder.exists()  # removed once taken (the tokenizer is read, the ids are in datasets' cache)
    train_text, valid_text, _ = load_data(data_args, scans)
    tokenizer = train_corpus_tokenizer(train_text, model_args.vocab_size, model_args.tokenizer_model,
                                       data_args.max_length)
    train, valid = tokenize_splits(train_text, valid_text, tokenizer, data_args.max_length,
                                   data_args.preprocessing_num_workers)
    assert prepared.tokenizer.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert prepared.tokenizer.model_max_length == tokenizer.model_max_length == 32
    for ours, theirs in ((prepared.train_dataset, train), (prepared.valid_dataset, valid)):
        assert ours.column_names == theirs.column_names == ["input_ids", "labels"]
        assert ours.to_dict() == theirs.to_dict()


def test_data_of_another_recipe_or_a_failed_preparation_is_not_taken(toy_files, tmp_path, prefetch_allowed):
    argv = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run")]
    _, data_args, _, _ = parse_args(argv)
    _, file_sha256 = scan_data_files(data_args)
    with DataPrefetch.start(argv) as prefetch:
        folder = prefetch._folder
        other = data_recipe({**read_recipe(argv)[0], "vocab_size": 301}, file_sha256)
        assert prefetch.take(other) is None
    assert not folder.exists()
    # files that cannot be read as pairs: the process fails quietly, the command reads them and says why
    (tmp_path / "bad.src").write_text("eins\nzwei\n")
    (tmp_path / "bad.tgt").write_text("one\n")
    bad = ["--train_source", str(tmp_path / "bad.src"), "--train_target", str(tmp_path / "bad.tgt"), *TINY_MODEL,
           "--output_dir", str(tmp_path / "run")]
    with DataPrefetch.start(bad) as prefetch:
        assert prefetch.active
        assert prefetch.take(data_recipe(read_recipe(bad)[0], {})) is None


def test_a_preparation_not_taken_is_stopped_and_its_folder_removed(toy_files, tmp_path, prefetch_allowed):
    argv = [*file_flags(toy_files), *TINY_MODEL, "--output_dir", str(tmp_path / "run")]
    prefetch = DataPrefetch.start(argv)
    pid, folder = prefetch.pid, prefetch._folder
    prefetch.close()
    assert not prefetch.active and not folder.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no process left behind


def test_the_command_trains_the_same_model_with_the_data_prepared_during_start_up(toy_files, tmp_path):
    """The command as users run it (a new process, torch not imported yet): the same tokenizer and weights whether
    the data was prepared beside the imports or after them, and nothing left in the temporary folder."""
    outputs = {}
    for prefetch in ("1", "0"):
        temporary = tmp_path / f"tmp-{prefetch}"
        temporary.mkdir()
        env = {**os.environ, "HF_HEADATTN_DATA_PREFETCH": prefetch, "TMPDIR": str(temporary), "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_CACHE": str(tmp_path / f"datasets-{prefetch}")}
        outputs[prefetch] = tmp_path / f"run-{prefetch}"
        argv = [*file_flags(toy_files), *TINY_MODEL, "--max_steps", "2", "--eval_strategy", "no",
                "--output_dir", str(outputs[prefetch])]
        command = ("import logging, sys; logging.getLogger('hf_headattn.training.data_prefetch').setLevel('DEBUG'); "
                   "from hf_headattn.commands.train import main; main(sys.argv[1:])")
        result = subprocess.run([sys.executable, "-c", command, *argv], env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "trained 2 steps" in result.stdout
        assert ("prepared during start-up are taken" in result.stderr) == (prefetch == "1")
        assert "training the tokenizer" in result.stderr  # the forked process's progress bar, or the command's
        assert not list(temporary.iterdir())  # the forked process's folder removed
    for name in ("tokenizer.json", "model.safetensors"):
        assert (outputs["1"] / name).read_bytes() == (outputs["0"] / name).read_bytes(), name


@pytest.mark.parametrize("bad_flag", [["--cross_attention", "csparsmax"], ["--fertility", "guidded"],
                                      ["--cross_attention", '{"variant": "sparsemax", "typo": 1}']])
def test_a_refused_command_shows_nothing_of_the_data_preparation(toy_files, tmp_path, bad_flag):
    """The preparation forked at start-up is speculative: a command whose flags are refused prints its usage error
    and nothing of it (issue 75: the tokenizer's and the tokenisation's bars came first), and leaves no folder."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    env.pop(data_prefetch.DISABLED, None)
    argv = [*file_flags(toy_files), *TINY_MODEL, *bad_flag, "--output_dir", str(tmp_path / "run")]
    result = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", *argv], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: hf-headattn-train") and lines[-1].startswith("hf-headattn-train: error: "), \
        result.stderr
    assert len(lines) == 2, result.stderr
    assert not (tmp_path / "run").exists() and not list(temporary.iterdir())


def test_the_model_flags_are_checked_before_trainers_arguments_import_the_model_stack(toy_files, tmp_path):
    """A misspelt variant is refused before `Seq2SeqTrainingArguments` is built, whose checks import Transformers'
    modeling code (~2.5 s on 2 cores): the refusal costs the imports of the flags' parser and no more."""
    script = ("import sys; from hf_headattn.training.arguments import parse_args\n"
              "try:\n    parse_args(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              "print('transformers.modeling_utils' in sys.modules)")
    argv = [*file_flags(toy_files), "--cross_attention", "csparsmax", "--output_dir", str(tmp_path / "run")]
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert "Unknown attention variant 'csparsmax'" in result.stderr
    assert result.stdout.strip() == "False"


def held_output_after(release: bytes) -> tuple[str, str]:
    """What a `HeldOutput` showed of two progress-bar updates before and after its gate got `release` (then
    closed), and after one more line."""
    stream, (gate_reader, gate_writer) = io.StringIO(), os.pipe()
    held = data_prefetch.HeldOutput(stream, gate_reader)
    held.write("bar 1\r")
    held.write("bar 2\r")
    before = stream.getvalue()
    os.write(gate_writer, release)
    os.close(gate_writer)
    held.settle()
    held.write("after\n")
    return before, stream.getvalue()


def test_held_output_shows_what_it_kept_once_released_and_nothing_if_refused():
    assert held_output_after(b"1") == ("", "bar 1\rbar 2\rafter\n")
    assert held_output_after(b"") == ("", "")
