"""Runs are transactions (issue 32): fault injection through the training and evaluation commands.

Kills are real SIGKILLs: the run goes on in a child process (a fresh interpreter), which kills itself at the
point under test through a patched function, as `kill -9` from outside would at that moment. The folder is then
loaded the way the tools load it (`loading.load_model_and_tokenizer`, which refuses a tokenizer the model was not
trained with) and compared, weights and tokenizer, with the old model or with an uninterrupted run of the new one.
"""

import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Seq2SeqTrainingArguments, Trainer, TrainerState
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from hf_headattn import HeadAttnForConditionalGeneration, HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration
from hf_headattn import output_files, tokenization
from hf_headattn.commands import evaluate
from hf_headattn.commands import train as train_command
from hf_headattn.evaluation import evaluate_model
from hf_headattn.loading import load_model_and_tokenizer
from hf_headattn.parallel_data import PairFiles, read_pairs, read_parallel_files, scan_text_file
from hf_headattn.tokenization import load_tokenizer, tokenizer_fingerprint, train_tokenizer
from hf_headattn.training import run as training_run
from hf_headattn.training import run_folder
from hf_headattn.training.arguments import parse_args
from hf_headattn.training.run import train
from hf_headattn.training.run_folder import RunRefused
from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer, TrainingDiverged

from helpers import FAMILIES, tiny_config, toy_data

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the child runs tokenise too

STEPS, SAVE_STEPS = 4, 2


def command(data, output_dir, *extra, family="transformer") -> list[str]:
    """A tiny run of `STEPS` steps, checkpoints every `SAVE_STEPS`; `extra` flags override."""
    return [*FAMILIES[family], "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
            "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
            "--output_dir", str(output_dir), "--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS),
            "--vocab_size", "200", "--max_length", "24", "--per_device_train_batch_size", "16", "--warmup_steps", "1",
            "--eval_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "1", *extra]


NEW = ("--seed", "2", "--vocab_size", "150")  # the second model: other weights, another tokenizer


# Children start a fresh interpreter ("spawn"): a fork of the test process copies whatever locks its other threads
# (OpenMP's, an earlier test's servers) hold at that moment, and can hang in the default suite.
CHILDREN = multiprocessing.get_context("spawn")


def in_child(function, *args, timeout: float = 300) -> int:
    """Run function(*args) (a module-level function) in a child process; its exit code (-9: killed with SIGKILL)."""
    process = CHILDREN.Process(target=_as_this_process, args=(torch.get_num_threads(), function, *args))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        raise AssertionError(f"{function.__name__} did not end within {timeout} s")
    return process.exitcode


def _as_this_process(threads: int, function, *args) -> None:
    """In the child: the test process's torch threads (conftest's one), so its float results are the same."""
    torch.set_num_threads(threads)
    function(*args)


def kill_at(owner, name: str, when=lambda *args, **kwargs: True, after: bool = False):
    """Patch owner.name to SIGKILL this process when it is called (before it runs, or `after`) and `when` holds."""
    original = getattr(owner, name)

    def killing(*args, **kwargs):
        if not after and when(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if after and when(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, killing)


def assert_loads_as(folder: Path, reference: Path):
    """The folder loads through its own code with the tokenizer it was trained with, and is the reference model."""
    model, tokenizer = load_model_and_tokenizer(folder)
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(load_tokenizer(reference))
    expected = load_file(reference / "model.safetensors")
    weights = model.state_dict()
    for key, value in expected.items():
        assert torch.equal(weights[key], value), f"{folder}: {key} is not the reference's"
    assert json.loads((folder / "run_manifest.json").read_text())["identity"] == json.loads(
        (reference / "run_manifest.json").read_text())["identity"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def old_model(data, tmp_path_factory):
    """A finished run: the model a new run in its folder replaces."""
    output_dir = tmp_path_factory.mktemp("old") / "run"
    train(command(data, output_dir))
    return output_dir


@pytest.fixture(scope="module")
def new_model(data, tmp_path_factory):
    """The new run, uninterrupted: what an interrupted and resumed one must end as."""
    output_dir = tmp_path_factory.mktemp("new") / "run"
    train(command(data, output_dir, *NEW))
    return output_dir


@pytest.fixture(scope="module")
def resumable(data, tmp_path_factory):
    """A finished run that kept its checkpoints: started again, it resumes from checkpoint-4."""
    output_dir = tmp_path_factory.mktemp("resumable") / "run"
    train(command(data, output_dir, "--keep_checkpoints"))
    return output_dir


def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    return copy


# ------------------------------------------------------------------------------------------------ one run per folder
def hold_the_folder(data, output_dir, marker):
    """A run that stops, holding its folder's lock, once it reads its data."""
    def wait(*args, **kwargs):
        marker.write_text("reading")
        time.sleep(600)

    training_run.load_data = wait
    train(command(data, output_dir, "--overwrite_output_dir"))


def test_a_second_run_on_a_folder_is_refused_and_a_killed_runs_lock_blocks_nothing(data, old_model, new_model,
                                                                                   tmp_path):
    output_dir, marker = copy_of(old_model, tmp_path), tmp_path / "marker"
    process = CHILDREN.Process(target=_as_this_process,
                               args=(torch.get_num_threads(), hold_the_folder, data, output_dir, marker))
    process.start()
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and process.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the first run did not get to its data"
        with pytest.raises(SystemExit) as refused:
            train_command.main(command(data, output_dir, *NEW, "--overwrite_output_dir"))
        message = str(refused.value.code)
        assert f"--output_dir {output_dir.resolve()} is in use by another training run (pid {process.pid} on host " \
               f"{socket.gethostname()}, started " in message and "hf-headattn-train: error: " in message
        assert_loads_as(output_dir, old_model)  # the refused run with --overwrite_output_dir deleted nothing
    finally:
        process.kill()
        process.join()
    assert process.exitcode == -signal.SIGKILL
    train(command(data, output_dir, *NEW, "--overwrite_output_dir"))  # the dead run's lock is no obstacle
    assert_loads_as(output_dir, new_model)


# ------------------------------------------------------------------------------------------------ kill -9
def killed_run(argv, point):
    """The run `argv`, killed with SIGKILL at `point` (a key of KILL_POINTS)."""
    KILL_POINTS[point]()
    train(argv)


def killed_between_renames(argv):
    """The run `argv` on a file system without renameat2's exchange, killed between its two renames."""
    output_files._exchange = lambda first, second: False
    kill_at(output_files.os, "rename", lambda source, destination: str(source).endswith(".partial"))
    train(argv)


def killed_training_its_tokenizer(argv):
    kill_at(tokenization, "train_tokenizer")
    train(argv)


def _checkpoint_done(self, *args, **kwargs):
    return self.state.global_step == SAVE_STEPS


KILL_POINTS = {
    # during training
    "after checkpoint-2 is written": lambda: kill_at(HeadAttnSeq2SeqTrainer, "_save_checkpoint", _checkpoint_done,
                                                     after=True),
    "while checkpoint-4 is written (no trainer_state.json yet)": lambda: kill_at(
        TrainerState, "save_to_json", lambda self, path: "checkpoint-4" in str(path)),
    # during the final save
    "weights staged, tokenizer not": lambda: kill_at(
        PreTrainedTokenizerBase, "save_pretrained", lambda self, directory, *a, **k: str(directory).endswith(".partial")),
    "staging complete, before the swap": lambda: kill_at(training_run, "replace_folder"),
    "swapped, the old folder not yet deleted": lambda: kill_at(output_files, "_exchange", after=True),
}


@pytest.mark.parametrize("point", ["after checkpoint-2 is written",
                                   "while checkpoint-4 is written (no trainer_state.json yet)"])
def test_a_run_killed_while_training_resumes_to_the_uninterrupted_model(point, data, new_model, tmp_path, caplog):
    output_dir = tmp_path / "run"
    argv = command(data, output_dir, *NEW)
    assert in_child(killed_run, argv, point) == -signal.SIGKILL
    assert not (output_dir / "config.json").exists()  # no model yet, only checkpoints
    with caplog.at_level(logging.INFO, logger="hf_headattn"):
        train(argv)  # the same command again
    assert f"resuming from {output_dir / 'checkpoint-2'}" in caplog.text
    if "checkpoint-4" in point:
        assert "checkpoint-4 is incomplete (killed while saving?)" in caplog.text
    assert_loads_as(output_dir, new_model)


@pytest.mark.parametrize("point", ["weights staged, tokenizer not", "staging complete, before the swap",
                                   "swapped, the old folder not yet deleted"])
def test_a_run_killed_while_saving_leaves_the_old_model_or_the_new_one_never_a_mix(point, data, old_model, new_model,
                                                                                  tmp_path):
    output_dir = copy_of(old_model, tmp_path)
    argv = command(data, output_dir, *NEW, "--overwrite_output_dir")
    assert in_child(killed_run, argv, point) == -signal.SIGKILL
    leftover = output_files.sibling(output_dir, "partial")
    assert leftover.exists()  # what the next run in the folder clears away
    if point.startswith("swapped"):  # the new model is in place: the run is done
        assert_loads_as(output_dir, new_model)
        assert (leftover / "model.safetensors").is_file()  # the old folder, swapped out
        run_folder.clean_leftovers(output_dir)
    else:
        assert_loads_as(output_dir, old_model)
        train(command(data, output_dir, *NEW))  # resumes the new run's last checkpoint, at its last step
        assert_loads_as(output_dir, new_model)
    assert not leftover.exists()


def test_without_an_atomic_exchange_a_swap_killed_between_its_renames_is_undone(data, old_model, new_model, tmp_path,
                                                                               monkeypatch):
    output_dir = copy_of(old_model, tmp_path)
    argv = command(data, output_dir, *NEW, "--overwrite_output_dir")
    assert in_child(killed_between_renames, argv) == -signal.SIGKILL
    assert not output_dir.exists()
    assert_loads_as(output_files.sibling(output_dir, "replaced"), old_model)  # whole, beside the path
    monkeypatch.setattr(output_files, "_exchange", lambda first, second: False)
    train(command(data, output_dir, *NEW))  # puts the old folder back, resumes the new run, swaps by renames
    assert_loads_as(output_dir, new_model)
    assert not output_files.sibling(output_dir, "replaced").exists()


def test_overwrite_deletes_nothing_before_the_new_run_has_its_data_and_tokenizer(data, resumable, tmp_path):
    output_dir = copy_of(resumable, tmp_path)
    assert in_child(killed_training_its_tokenizer, command(data, output_dir, *NEW, "--overwrite_output_dir")) \
        == -signal.SIGKILL
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (output_dir / run_folder.TOKENIZER_SCRATCH).exists()  # nothing written into the folder
    assert_loads_as(output_dir, resumable)


def test_overwrite_never_deletes_the_checkpoint_it_is_told_to_resume(data, resumable, capsys):
    with pytest.raises(SystemExit) as refused:
        train(command(data, resumable, "--overwrite_output_dir", "--resume_from_checkpoint",
                      str(resumable / "checkpoint-2")))
    assert refused.value.code == 2
    assert "--overwrite_output_dir would delete --resume_from_checkpoint" in capsys.readouterr().err
    assert (resumable / "checkpoint-2" / "trainer_state.json").is_file()


def test_the_final_model_keeps_what_else_the_folder_holds_and_replaces_the_old_model_whole(data, old_model, tmp_path):
    output_dir = copy_of(old_model, tmp_path)
    (output_dir / "eval").mkdir()
    (output_dir / "eval" / "test.greedy.metrics.json").write_text("{}")
    (output_dir / "model.safetensors.index.json").write_text("{}")  # a file of the old model the new one lacks
    train(command(data, output_dir, *NEW, "--overwrite_output_dir"))
    assert (output_dir / "eval" / "test.greedy.metrics.json").read_text() == "{}"
    assert not (output_dir / "model.safetensors.index.json").exists()
    assert not list(output_dir.glob("checkpoint-*"))


def test_an_average_keeps_the_runs_tokenizer_binding_and_replaces_an_old_folder_whole(resumable, new_model,
                                                                                     tmp_path):
    from hf_headattn.averaging import average_checkpoints

    with pytest.raises(ValueError, match="--overwrite replaces only a folder hf-headattn-average wrote, and .* holds "
                                         "a training run"):
        average_checkpoints([resumable / "checkpoint-2"], copy_of(new_model, tmp_path), overwrite=True)
    output_dir = average_checkpoints([resumable / "checkpoint-2"], tmp_path / "average")  # an older average
    (output_dir / "notes.txt").write_text("of the old average")
    average_checkpoints([resumable / "checkpoint-2", resumable / "checkpoint-4"], output_dir, overwrite=True)
    assert not (output_dir / "notes.txt").exists()
    assert json.loads((output_dir / "run_manifest.json").read_text())["identity"] == json.loads(
        (resumable / "run_manifest.json").read_text())["identity"]
    load_model_and_tokenizer(output_dir)  # its tokenizer is the run's
    assert not list(tmp_path.glob(".*.partial"))


def test_the_current_folder_is_not_an_output_dir(data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        train(command(data, "."))
    assert "--output_dir . is the current folder or holds it" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the same run
CHANGED_SETTINGS = {  # flags -> a line of the refusal
    "vocabulary size": (["--vocab_size", "150"], "--vocab_size: 200 there, 150 now"),
    "tokenizer model": (["--tokenizer_model", "unigram"], '--tokenizer_model: "bpe" there, "unigram" now'),
    "max length": (["--max_length", "20"], "--max_length: 24 there, 20 now"),
    "model width": (["--d_model", "64"], "--d_model: 32 there, 64 now"),
    "attention variant": (["--cross_attention", "dhicm"], '--cross_attention: "softmax" there, "dhicm" now'),
    "seed": (["--seed", "3"], "--seed: 1 there, 3 now"),
    "batch size": (["--per_device_train_batch_size", "8"], "--per_device_train_batch_size: 16 there, 8 now"),
    "token batches": (["--max_tokens", "400"], "--max_tokens: null there, 400 now"),
    "learning rate": (["--learning_rate", "0.001"], "--learning_rate: 0.0005 there, 0.001 now"),
    "schedule": (["--lr_scheduler_type", "linear"], '--lr_scheduler_type: "inverse_sqrt" there, "linear" now'),
    "fewer pairs": (["--max_train_pairs", "100"], "--max_train_pairs: null there, 100 now"),
    "loss normalization": (["--loss_normalization", "sentences"],
                           '--loss_normalization: "tokens" there, "sentences" now'),
}


@pytest.mark.parametrize("change", sorted(CHANGED_SETTINGS))
def test_a_resume_with_a_changed_setting_is_refused_naming_it(change, data, resumable, monkeypatch):
    flags, line = CHANGED_SETTINGS[change]
    monkeypatch.setattr(training_run, "load_data", lambda *args: pytest.fail("data was read before the refusal"))
    with pytest.raises(RunRefused) as refused:
        train(command(data, resumable, *flags))
    assert f"{resumable / 'checkpoint-4'} belongs to another run than these flags describe" in str(refused.value)
    assert f"  {line}" in str(refused.value).splitlines()


FILE_OF_FLAG = {"train_source": "train.src", "train_target": "train.tgt", "valid_source": "valid.src",
                "valid_target": "valid.tgt"}


@pytest.mark.parametrize("side", sorted(FILE_OF_FLAG))
def test_a_resume_on_other_data_is_refused(side, data, resumable, tmp_path):
    edited = tmp_path / f"edited.{side}"
    lines = data[FILE_OF_FLAG[side]].read_text(encoding="utf-8").splitlines()
    edited.write_text("\n".join(["ein anderer satz ."] + lines[1:]) + "\n", encoding="utf-8")
    argv = command(data, resumable)
    argv[argv.index(f"--{side}") + 1] = str(edited)
    with pytest.raises(RunRefused, match=rf"--{side}: the file's contents differ \(sha256 \w{{12}} there, \w{{12}} now\)"):
        train(argv)


def test_a_resume_with_another_tokenizer_is_refused(data, resumable, new_model):
    with pytest.raises(RunRefused, match=r"tokenizer: the tokenizer's vocabulary and rules differ"):
        train(command(data, resumable, "--tokenizer", str(new_model)))


def test_a_resume_may_train_longer_log_and_save_otherwise_and_read_moved_files(data, resumable, tmp_path, caplog):
    output_dir = copy_of(resumable, tmp_path)
    moved = tmp_path / "moved"
    shutil.copytree(data["train.src"].parent, moved)
    argv = command({name: moved / path.name for name, path in data.items()}, output_dir, "--max_steps", "6",
                   "--logging_steps", "2", "--save_steps", "3", "--tokenizer", str(resumable))  # its own tokenizer
    with caplog.at_level(logging.INFO, logger="hf_headattn"):
        metrics = train(argv)
    assert metrics["global_step"] == 6
    for line in ("--max_steps: 4 there, 6 now", "--logging_steps: 1 there, 2 now", "--save_steps: 2 there, 3 now",
                 f'--train_source: "{data["train.src"].resolve()}" there, "{(moved / "train.src").resolve()}" now',
                 f'--tokenizer: null there, "{resumable.resolve()}" now'):
        assert f"resuming with a changed setting: {line}" in caplog.text


def test_a_checkpoint_without_optimizer_state_resumes_only_with_reset_optimizer(data, resumable, tmp_path, capsys,
                                                                               caplog):
    output_dir = copy_of(resumable, tmp_path)
    (output_dir / "checkpoint-4" / "optimizer.pt").unlink()
    with pytest.raises(SystemExit) as refused:
        train(command(data, output_dir, "--max_steps", "6"))
    assert refused.value.code == 2
    assert (f"{output_dir / 'checkpoint-4'} has no optimizer.pt (saved with --save_only_model, or deleted): resuming "
            "it would restart the optimizer's moments and the learning-rate schedule; add --reset_optimizer"
            in capsys.readouterr().err)
    with caplog.at_level(logging.WARNING, logger="hf_headattn"):
        assert train(command(data, output_dir, "--max_steps", "6", "--reset_optimizer"))["global_step"] == 6
    assert "--reset_optimizer: resuming" in caplog.text and "fresh optimizer and learning-rate schedule" in caplog.text


def test_reset_optimizer_does_not_load_the_saved_optimizer(data, resumable, tmp_path):
    weights = {}
    for name, flags in (("restored", []), ("reset", ["--reset_optimizer"])):
        output_dir = copy_of(resumable, tmp_path / name)
        train(command(data, output_dir, "--max_steps", "5", *flags))
        weights[name] = load_file(output_dir / "model.safetensors")
    assert any(not torch.equal(weights["restored"][key], weights["reset"][key]) for key in weights["reset"])


def test_a_checkpoint_from_before_manifests_resumes_with_a_warning(data, resumable, tmp_path, caplog):
    output_dir = copy_of(resumable, tmp_path)
    (output_dir / "checkpoint-4" / "run_manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="hf_headattn"):
        train(command(data, output_dir))
    assert "checkpoint-4 has no run_manifest.json (saved by an older version): only its model config" in caplog.text


def test_a_manifest_from_before_the_run_flags_were_recorded_resumes(data, resumable, tmp_path):
    """Manifests written before --lr_decay and --loss_normalization were recorded lack them: not compared."""
    output_dir = copy_of(resumable, tmp_path)
    manifest_file = output_dir / "checkpoint-4" / "run_manifest.json"
    manifest = json.loads(manifest_file.read_text())
    for flag in ("--lr_decay", "--lr_decay_factor", "--lr_decay_start_at", "--loss_normalization"):
        del manifest["identity"][flag]
    manifest_file.write_text(json.dumps(manifest))
    train(command(data, output_dir, "--loss_normalization", "sentences"))
    assert (output_dir / "train_results.json").is_file()


def test_a_resume_under_other_package_versions_is_warned_about(data, resumable, tmp_path, caplog):
    output_dir = copy_of(resumable, tmp_path)
    path = output_dir / "checkpoint-4" / "run_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["versions"]["transformers"] = "5.0.0"
    path.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="hf_headattn"):
        train(command(data, output_dir))
    assert "was saved under other package versions (transformers: \"5.0.0\" there" in caplog.text


def test_every_checkpoint_and_the_model_record_the_run(resumable, data):
    manifest = json.loads((resumable / "run_manifest.json").read_text())
    assert json.loads((resumable / "checkpoint-2" / "run_manifest.json").read_text())["identity"] == \
        manifest["identity"]
    identity = manifest["identity"]
    assert identity["--train_source"]["sha256"] == scan_text_file(data["train.src"]).sha256
    assert identity["tokenizer"]["sha256"] == tokenizer_fingerprint(load_tokenizer(resumable))
    assert identity["--max_length"] == 24 and identity["processes"] == 1 and identity["--seed"] == 1
    assert set(manifest["versions"]) == {"hf_headattn", "transformers", "torch", "datasets", "tokenizers"}
    assert manifest["files"]["--train_source"] == str(data["train.src"].resolve())


# ------------------------------------------------------------------------------------------------ divergence
def poison_at(monkeypatch, step: int):
    """From optimizer step `step` on, a weight of the output layer is NaN (as after an overflow)."""
    compute_loss = HeadAttnSeq2SeqTrainer.compute_loss

    def poisoned(self, model, *args, **kwargs):
        if self.state.global_step + 1 == step:
            with torch.no_grad():
                model.get_output_embeddings().weight[5, 0] = float("nan")
        return compute_loss(self, model, *args, **kwargs)

    monkeypatch.setattr(HeadAttnSeq2SeqTrainer, "compute_loss", poisoned)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(family, data, tmp_path,
                                                                                      monkeypatch):
    output_dir = tmp_path / "run"
    poison_at(monkeypatch, step=3)
    with pytest.raises(SystemExit) as failed:
        train_command.main(command(data, output_dir, "--max_steps", "6", family=family))
    assert str(failed.value.code).startswith("hf-headattn-train: error: training diverged at step 3: the loss is nan. "
                                             f"Nothing of this step was applied or saved; the last checkpoint, "
                                             f"{output_dir / 'checkpoint-2'}, holds the run before it")
    # no model, no later checkpoint: the run's record and its last good checkpoint
    assert sorted(path.name for path in output_dir.iterdir()) == [".hf_headattn_output.json", "checkpoint-2"]
    weights = load_file(output_dir / "checkpoint-2" / "model.safetensors")
    assert all(torch.isfinite(value).all() for value in weights.values())


def test_a_non_finite_gradient_norm_stops_training_before_the_optimizer_step(data, tmp_path, monkeypatch):
    get_grad_norm = Trainer._get_grad_norm

    def overflowing(self, model, grad_norm=None):
        norm = get_grad_norm(self, model, grad_norm)
        return torch.tensor(float("inf")) if self.state.global_step == 2 else norm

    monkeypatch.setattr(Trainer, "_get_grad_norm", overflowing)
    with pytest.raises(TrainingDiverged, match=r"training diverged at step 3: the gradient norm is inf"):
        train(command(data, tmp_path / "run", "--max_steps", "6", family="rnn"))


def test_non_finite_weights_are_never_saved(data, tmp_path):
    # a learning rate so large that Adam's first full update (step 2: step 1 is warmup at rate 0) overflows them
    with pytest.raises(TrainingDiverged, match=r"the weight \S+ is not finite at step 2: \S+checkpoint-2 is not "
                                               r"written"):
        train(command(data, tmp_path / "run", "--learning_rate", "1e38", "--save_steps", "1"))
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == [".hf_headattn_output.json", "checkpoint-1"]
    weights = load_file(tmp_path / "run" / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(value).all() for value in weights.values())


def test_a_loss_that_grows_far_above_its_start_is_warned_about(tmp_path, caplog):
    trainer = HeadAttnSeq2SeqTrainer(model=HeadAttnForConditionalGeneration(tiny_config()),
                                     args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                   report_to="none"))
    with caplog.at_level(logging.WARNING, logger="hf_headattn.training.trainer"):
        for step, loss in enumerate([5.0, 4.0, 9.0, 10.5, 19.0, 25.0], start=1):
            trainer.state.global_step = step
            trainer.log({"loss": loss})
    warned = [record.getMessage() for record in caplog.records if "training loss" in record.getMessage()]
    assert len(warned) == 2  # at 10.5 (> 2 x 5.0), and again once it has doubled once more (25.0 > 2 x 10.5)
    assert warned[0].startswith("the training loss 10.5 at step 4 is over 2 times its first logged value (5 at "
                                "step 1): training may be diverging")


# ------------------------------------------------------------------------------------------------ data as written
def pair_files(tmp_path, source: bytes, target: bytes, suffix: str = "") -> tuple[Path, Path]:
    paths = tmp_path / f"a.de{suffix}", tmp_path / f"a.en{suffix}"
    for path, content in zip(paths, (source, target)):
        path.write_bytes(content)
    return paths


def test_every_line_end_ends_a_line_and_a_byte_order_mark_is_dropped(tmp_path):
    source, target = pair_files(tmp_path, b"\xef\xbb\xbfeins\rzwei\r\ndrei\nvier\r",  # classic Mac, Windows, Unix
                                "one\u2028still one\rtwo\r\nthree\nfour".encode())
    pairs = read_parallel_files(source, target)
    assert list(zip(pairs["source"], pairs["target"])) == [
        ("eins", "one\u2028still one"), ("zwei", "two"), ("drei", "three"), ("vier", "four")]


def test_a_classic_mac_corpus_trains_as_its_lines(data, tmp_path):
    mac = {name: tmp_path / name for name in data}
    for name, path in data.items():
        mac[name].write_bytes(path.read_bytes().replace(b"\n", b"\r"))
    metrics = train(command(mac, tmp_path / "run", "--max_steps", "1"))
    assert metrics["train_pairs"] == metrics["train_pairs_read"] == 200


def test_text_that_is_not_utf8_is_refused_naming_the_file_line_and_byte(tmp_path):
    source, target = pair_files(tmp_path, "eins\nzwei\nDrei Männer\n".encode("latin-1"), b"one\ntwo\nthree men\n")
    with pytest.raises(ValueError, match=r"a\.de, line 3: not UTF-8 \(byte 0xe4 at character 7\); convert the file"):
        read_parallel_files(source, target)


def test_the_same_text_on_both_sides_is_refused(data, tmp_path):
    with pytest.raises(ValueError, match=r"train\.src and .*train\.src are the same file: a model trained on them "
                                         r"learns to copy"):
        read_parallel_files(data["train.src"], data["train.src"])
    shutil.copy(data["train.src"], tmp_path / "copy.en")
    with pytest.raises(ValueError, match=r"have identical contents"):
        read_parallel_files(data["train.src"], tmp_path / "copy.en")
    argv = command(data, tmp_path / "run")
    argv[argv.index("--train_target") + 1] = str(data["train.src"])
    with pytest.raises(RunRefused, match="are the same file"):
        train(argv)


def test_an_edited_file_of_the_same_size_and_time_is_read_again(tmp_path):
    source, target = pair_files(tmp_path, b"eins\nzwei\n", b"one\ntwo\n")
    assert list(read_parallel_files(source, target)["target"]) == ["one", "two"]
    stat = target.stat()
    target.write_bytes(b"One\nTwo\n")  # a corrected file: same size, modification time put back
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert list(read_parallel_files(source, target)["target"]) == ["One", "Two"]


def write_pair_file(path: Path, pairs, kind: str):
    import gzip
    import lzma

    if kind == "jsonl":
        text = "".join(json.dumps({"translation": {"de": source, "en": target}}, ensure_ascii=False) + "\n"
                       for source, target in pairs)
    else:
        text = "".join(f"{source}\t{target}\n" for source, target in pairs)
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "wb") as handle:
        handle.write(text.encode("utf-8"))
    return path


def test_json_lines_and_tsv_files_compressed_or_not_train_as_the_text_files(data, tmp_path):
    text = read_parallel_files(data["train.src"], data["train.tgt"])
    pairs = list(zip(text["source"], text["target"]))
    valid = read_parallel_files(data["valid.src"], data["valid.tgt"])
    for name, kind in (("train.jsonl", "jsonl"), ("train.jsonl.xz", "jsonl"), ("train.tsv.gz", "tsv")):
        read = read_pairs(PairFiles(file=write_pair_file(tmp_path / name, pairs, kind)))
        assert list(zip(read.dataset["source"], read.dataset["target"])) == pairs, name
    write_pair_file(tmp_path / "valid.tsv", zip(valid["source"], valid["target"]), "tsv")
    argv = [flag for flag in command(data, tmp_path / "run", "--max_steps", "1")]
    for flag in ("--train_source", "--train_target", "--valid_source", "--valid_target"):
        del argv[argv.index(flag):argv.index(flag) + 2]
    metrics = train([*argv, "--train_file", str(tmp_path / "train.jsonl.xz"), "--validation_file",
                     str(tmp_path / "valid.tsv")])
    assert metrics["train_pairs"] == 200
    identity = json.loads((tmp_path / "run" / "run_manifest.json").read_text())["identity"]
    assert {"--train_file", "--validation_file"} <= set(identity)


def test_json_lines_or_tsv_given_as_plain_text_is_refused_with_a_hint(data, tmp_path):
    pairs = [("ein hund .", "a dog ."), ("eine katze .", "a cat .")]
    jsonl = write_pair_file(tmp_path / "train.de", pairs, "jsonl")
    tsv = write_pair_file(tmp_path / "other.de", pairs, "tsv")
    (tmp_path / "train.en").write_text("a dog .\na cat .\n")
    with pytest.raises(ValueError, match=r"train\.de looks like JSON lines .* \(the training command's --train_file"):
        read_parallel_files(jsonl, tmp_path / "train.en")
    with pytest.raises(ValueError, match=r"other\.de looks like TSV .* \(the training command's --train_file"):
        read_parallel_files(tsv, tmp_path / "train.en")


def test_a_bad_line_of_a_pair_file_is_named(tmp_path):
    (tmp_path / "bad.tsv").write_text("ein hund .\ta dog .\nkein tab hier\n")
    with pytest.raises(ValueError, match=r"bad\.tsv, line 2: 1 tab-separated fields"):
        read_pairs(PairFiles(file=tmp_path / "bad.tsv"))
    (tmp_path / "bad.jsonl").write_text('{"translation": {"de": "ein hund .", "en": "a dog ."}}\n'
                                        '{"translation": {"de": "eine katze ."}}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: expected \{\"translation\": \{\"de\": \"\.\.\.\", "
                                         r"\"en\": \"\.\.\.\"\}\}"):
        read_pairs(PairFiles(file=tmp_path / "bad.jsonl"))
    with pytest.raises(SystemExit):  # a name that says no format
        parse_args(["--train_file", str(tmp_path / "bad.txt"), "--output_dir", str(tmp_path / "run")])


def test_train_results_count_the_pairs_used_and_skipped(data, tmp_path):
    sources = data["train.src"].read_text(encoding="utf-8").splitlines()
    targets = data["train.tgt"].read_text(encoding="utf-8").splitlines()
    sources[5], targets[9] = "", "   "
    holey = dict(data, **{"train.src": tmp_path / "holey.de", "train.tgt": tmp_path / "holey.en"})
    holey["train.src"].write_text("\n".join(sources) + "\n", encoding="utf-8")
    holey["train.tgt"].write_text("\n".join(targets) + "\n", encoding="utf-8")
    train(command(holey, tmp_path / "run", "--max_steps", "1"))
    results = json.loads((tmp_path / "run" / "train_results.json").read_text())
    assert (results["train_pairs"], results["train_pairs_read"], results["train_pairs_skipped_empty"],
            results["train_pairs_held_out"]) == (198, 200, 2, 0)


def test_a_vocabulary_smaller_than_the_alphabet_says_what_it_trained(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_headattn.tokenization"):
        tokenizer = train_tokenizer(texts=["abcdefghij klmnop"], vocab_size=8)
    # 17 characters: 16 letters and the word-start mark "▁" that stands for the space
    assert (f"vocab_size=8 is smaller than the training text's alphabet (17 characters and 3 special tokens): "
            f"trained a vocabulary of {len(tokenizer)} instead") in caplog.text


# ------------------------------------------------------------------------------------------------ model and tokenizer
def test_a_model_is_evaluated_only_with_the_tokenizer_it_was_trained_with(data, old_model, new_model, tmp_path,
                                                                         caplog):
    arguments = dict(source_path=data["test.src"], reference_path=data["test.tgt"], num_beams=1, device="cpu")
    with pytest.raises(ValueError, match=rf"the tokenizer of {new_model} is not the one {old_model} was trained with"):
        evaluate_model(old_model, output_dir=tmp_path / "a", tokenizer=new_model, **arguments)
    with caplog.at_level(logging.WARNING, logger="hf_headattn.loading"):
        evaluate_model(old_model, output_dir=tmp_path / "b", tokenizer=new_model, force=True, **arguments)
    assert "going on (--force)" in caplog.text
    mixed = copy_of(old_model, tmp_path)  # another run's tokenizer copied over the folder's
    shutil.copy(new_model / "tokenizer.json", mixed / "tokenizer.json")
    with pytest.raises(ValueError, match="its token ids would mean other words to the model"):
        load_model_and_tokenizer(mixed)


def test_loading_a_folder_of_one_family_with_the_other_familys_class_names_both(tmp_path):
    rnn = HeadAttnRNNForConditionalGeneration(HeadAttnRNNConfig(vocab_size=64, embedding_size=16, hidden_size=32))
    rnn.save_pretrained(tmp_path / "rnn")
    HeadAttnForConditionalGeneration(tiny_config()).save_pretrained(tmp_path / "transformer")
    with pytest.raises(ValueError, match=r"model type 'headattn_rnn', and HeadAttnConfig reads model type 'headattn'"):
        HeadAttnForConditionalGeneration.from_pretrained(tmp_path / "rnn")
    with pytest.raises(ValueError, match=r"model type 'headattn', and HeadAttnRNNConfig reads model type "
                                         r"'headattn_rnn'"):
        HeadAttnRNNForConditionalGeneration.from_pretrained(tmp_path / "transformer")


def test_loading_warns_of_other_code_only_when_the_folders_own_copy_runs(old_model, tmp_path, caplog):
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from hf_headattn.loading import report_code_differences

    folder = copy_of(old_model, tmp_path)
    with open(folder / "modeling_headattn.py", "a") as code:
        code.write("\n# saved by another version\n")
    with caplog.at_level(logging.WARNING, logger="hf_headattn.loading"):
        model, _ = load_model_and_tokenizer(folder)  # this package's model type: the installed runtime runs it
        assert type(model) is HeadAttnForConditionalGeneration
        assert "model code differs" not in caplog.text
        own_code = get_class_from_dynamic_module("modeling_headattn.HeadAttnForConditionalGeneration", folder)
        assert own_code is not HeadAttnForConditionalGeneration
        report_code_differences(folder, own_code.from_pretrained(folder))  # the folder's copy runs
    assert f"{folder}'s model code differs from the installed hf_headattn" in caplog.text
    assert "runtime in modeling_headattn.py: the model runs its own copy" in caplog.text


# ------------------------------------------------------------------------------------------------ the evaluation command
def test_the_evaluation_command_exits_0_and_checks_every_argument_before_translating(data, old_model, tmp_path,
                                                                                   monkeypatch, capsys):
    argv = ["--model", str(old_model), "--source", str(data["test.src"]), "--reference", str(data["test.tgt"]),
            "--output_dir", str(tmp_path / "eval"), "--num_beams", "1", "--device", "cpu", "--length_buckets", "5"]
    with pytest.raises(SystemExit) as done:
        sys.exit(evaluate.main(argv))  # as the console script calls it
    assert done.value.code is None

    import hf_headattn.translation

    monkeypatch.setattr(hf_headattn.translation, "translate_sentences",
                        lambda *args, **kwargs: pytest.fail("translated before refusing an argument"))
    (tmp_path / "a-file").write_text("")
    for extra, error in ((["--length_buckets", "10", "5"], "Bucket boundaries must be strictly increasing"),
                         (["--output_dir", str(tmp_path / "a-file")], "a-file is a file, not a folder"),
                         (["--test_name", "../elsewhere"], "test_name '../elsewhere' must be a plain file name"),
                         ([], "already hold a result")):
        with pytest.raises(SystemExit) as refused:  # a one-line error, exit status 1
            evaluate.main([*argv, *extra])
        assert refused.value.code == 1 and error in capsys.readouterr().err


def test_two_test_sets_of_one_file_name_never_overwrite_each_others_results(data, old_model, tmp_path):
    first, second = tmp_path / "2016" / "test.src", tmp_path / "2017" / "test.src"
    for path, lines in ((first, slice(0, 6)), (second, slice(6, 12))):
        path.parent.mkdir()
        for name in ("test.src", "test.tgt"):
            text = data[name].read_text(encoding="utf-8").splitlines()[lines]
            (path.parent / name).write_text("\n".join(text) + "\n", encoding="utf-8")
    arguments = dict(num_beams=1, device="cpu", output_dir=tmp_path / "eval")
    evaluate_model(old_model, first, first.with_suffix(".tgt"), **arguments)
    with pytest.raises(FileExistsError, match=rf"test\.greedy\.metrics\.json already hold.* \(of {first.resolve()}\); "
                                              "pass overwrite=True"):
        evaluate_model(old_model, second, second.with_suffix(".tgt"), **arguments)
    assert json.loads((tmp_path / "eval" / "test.greedy.metrics.json").read_text())["test_set"]["source"] == str(
        first.resolve())
    evaluate_model(old_model, second, second.with_suffix(".tgt"), test_name="test-2017", **arguments)
    assert (tmp_path / "eval" / "test-2017.greedy.metrics.json").is_file()


def test_a_damaged_drop_cache_is_detected_and_rebuilt(data, old_model, tmp_path, caplog):
    arguments = dict(num_beams=1, device="cpu", output_dir=tmp_path / "eval", train_source=data["train.src"],
                     train_target=data["train.tgt"], drop_runs=1, drop_cache_dir=tmp_path / "cache", overwrite=True)
    first = evaluate_model(old_model, data["test.src"], data["test.tgt"], **arguments)
    (alignments,) = (tmp_path / "cache").glob("alignments-*.json")
    alignments.write_text(alignments.read_text()[:-40])  # cut short, as by a full disk
    (aligner,) = (tmp_path / "cache").glob("aligner-*.json")
    aligner.write_text('{"pairs": "many"}')  # valid JSON, wrong contents
    with caplog.at_level(logging.WARNING, logger="hf_headattn.metrics"):
        again = evaluate_model(old_model, data["test.src"], data["test.tgt"], **arguments)
    assert f"{alignments}: damaged DROP cache entry; computing it again" in caplog.text
    assert f"{aligner}: damaged DROP cache entry; computing it again" in caplog.text
    how = again["metric_settings"]["drop_alignment"]
    assert (how["aligner"], how["alignments"]) == ("trained", "aligned") and 0 <= again["drop"] <= 100
    third = evaluate_model(old_model, data["test.src"], data["test.tgt"], **arguments)  # from the rebuilt cache
    assert third["metric_settings"]["drop_alignment"]["alignments"] == "cached" and third["drop"] == again["drop"]
    assert first["metric_settings"]["drop_alignment"]["alignments"] == "aligned"


def test_the_translation_command_refuses_a_tokenizer_the_model_was_not_trained_with(data, old_model, new_model,
                                                                                   tmp_path, capsys):
    from hf_headattn.commands import translate as translate_command

    argv = ["--model", str(old_model), "--input", str(data["test.src"]), "--output", str(tmp_path / "out.en"),
            "--tokenizer", str(new_model), "--device", "cpu"]
    with pytest.raises(SystemExit) as refused:
        translate_command.main(argv)
    assert refused.value.code == 1
    assert f"is not the one {old_model} was trained with" in capsys.readouterr().err
    translate_command.main([*argv, "--force", "--num_beams", "1"])
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").splitlines()) == 12
