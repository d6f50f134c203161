"""Every loader names the damaged or missing file, and what to do about it (issue 44, item 4).

The files of a trained folder and of its checkpoints are cut short, emptied or deleted, as a full disk or an
interrupted copy leaves them, and the tools that read them must refuse naming the file: loading
(`loading.load_model_and_tokenizer`, which every command loads through), the translation and evaluation commands, a
resumed training run, averaging. Weights that hold NaN are refused naming the tensors. A save that finds the disk
full says so, naming the folder, and the same command resumes once there is room.
"""

import errno
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hf_headattn.averaging import average_checkpoints
from hf_headattn.commands import evaluate as evaluate_command
from hf_headattn.commands import train as train_command
from hf_headattn.commands import translate as translate_command
from hf_headattn.loading import load_model_and_tokenizer
from hf_headattn.saved_files import DamagedFile, write_failure
from hf_headattn.training import train

from helpers import FAMILIES, WITHOUT_PACKAGE, random_model, random_rnn_model, rnn_config, tiny_config, toy_data

STEPS, SAVE_STEPS = 4, 2


def command(data, output_dir, *extra) -> list[str]:
    """A tiny run of `STEPS` steps that keeps its checkpoints (every `SAVE_STEPS`)."""
    return [*FAMILIES["transformer"],
            "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
            "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
            "--output_dir", str(output_dir), "--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS),
            "--keep_checkpoints", "--vocab_size", "200", "--max_length", "24", "--per_device_train_batch_size", "16",
            "--warmup_steps", "1", "--eval_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true",
            "--seed", "1", *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A finished run with its checkpoints, checkpoint-2 and checkpoint-4."""
    output_dir = tmp_path_factory.mktemp("run") / "run"
    train(command(data, output_dir))
    return output_dir


def copy_of(folder, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    return copy


def cut_short(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


FAULTS = {"cut short": cut_short, "emptied": lambda path: path.write_bytes(b""), "deleted": lambda path: path.unlink()}
SAID = {"cut short": "is cut short or overwritten: it does not parse as", "emptied": "is empty (0 bytes)",
        "deleted": "is missing"}


def same_weights(folder, reference) -> bool:
    first, second = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    return first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


# ------------------------------------------------------------------------------------------------ a model folder
MODEL_FILE_FAULTS = [("model.safetensors", "cut short"), ("model.safetensors", "emptied"),
                     ("model.safetensors", "deleted"), ("tokenizer.json", "cut short"), ("tokenizer.json", "deleted"),
                     ("generation_config.json", "cut short"), ("config.json", "cut short")]


@pytest.mark.parametrize("name, fault", MODEL_FILE_FAULTS)
def test_loading_a_model_folder_names_its_damaged_file(name, fault, run, tmp_path):
    folder = copy_of(run, tmp_path)
    FAULTS[fault](folder / name)
    with pytest.raises(DamagedFile) as refused:
        load_model_and_tokenizer(folder)
    assert refused.value.path == folder / name
    assert str(refused.value).startswith(f"{folder / name} {SAID[fault]}")
    assert str(refused.value).endswith("; copy the folder again from where it came from, or write it again with the "
                                       "command that wrote it")


def test_the_translation_command_names_the_damaged_file(data, run, tmp_path, capsys):
    folder = copy_of(run, tmp_path)
    cut_short(folder / "model.safetensors")
    with pytest.raises(SystemExit) as refused:
        translate_command.main(["--model", str(folder), "--input", str(data["test.src"]), "--output",
                                str(tmp_path / "out.en"), "--device", "cpu"])
    assert refused.value.code == 1
    assert (f"cannot load --model {folder}: {folder / 'model.safetensors'} is cut short or overwritten: it does not "
            "parse as safetensors") in capsys.readouterr().err
    assert not (tmp_path / "out.en").exists()


def with_non_finite_weights(folder):
    """Two weights of the folder's model made NaN and infinite, as a diverged run would have saved them."""
    weights = load_file(folder / "model.safetensors")
    nan, inf = "model.encoder.layers.0.ffn.fc1.weight", "model.decoder.layers.1.ffn.fc2.bias"
    weights[nan] = torch.full_like(weights[nan], float("nan"))
    weights[inf][3] = float("inf")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return nan, inf


def test_a_model_with_nan_weights_is_refused_naming_them_before_it_is_evaluated(data, run, tmp_path, monkeypatch,
                                                                                 capsys):
    import hf_headattn.translation

    folder = copy_of(run, tmp_path)
    nan, inf = with_non_finite_weights(folder)
    monkeypatch.setattr(hf_headattn.translation, "translate_sentences",
                        lambda *args, **kwargs: pytest.fail("translated with NaN weights"))
    with pytest.raises(SystemExit) as refused:  # one line, not a traceback
        evaluate_command.main(["--model", str(folder), "--source", str(data["test.src"]), "--reference",
                               str(data["test.tgt"]), "--output_dir", str(tmp_path / "eval"), "--device", "cpu"])
    assert refused.value.code == 1
    message = capsys.readouterr().err.splitlines()[-1].removeprefix("hf-headattn-evaluate: error: ")
    assert message.startswith(f"{folder / 'model.safetensors'} holds NaN or infinite values in 2 of its ")
    assert f"tensors ({nan}, {inf}): the model would translate nothing; use an earlier checkpoint" in message
    assert not (tmp_path / "eval").exists()


def test_the_weight_check_finds_one_bad_value_in_any_dtype_and_passes_large_finite_ones(tmp_path):
    """One NaN, +inf or -inf among finite values is found in float32, bfloat16 and float64 (the check reads each
    tensor's min and max); huge but finite float64 values pass; empty tensors, which hold no value, are not counted."""
    from hf_headattn.saved_files import refuse_non_finite_weights

    def state(bad_value, dtype):
        tensor = torch.randn(64, 33, dtype=dtype)
        tensor[17, 5] = bad_value
        return {"fine": torch.ones(3), "empty": torch.empty(0), "steps": torch.arange(4), "bad": tensor}

    for bad_value in (float("nan"), float("inf"), float("-inf")):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            with pytest.raises(DamagedFile, match=r"holds NaN or infinite values in 1 of its 2 tensors \(bad\)"):
                refuse_non_finite_weights(state(bad_value, dtype), tmp_path / "model.safetensors")
    refuse_non_finite_weights(state(1e300, torch.float64), tmp_path / "model.safetensors")


# ------------------------------------------------------------------------------------------------ resuming a run
CHECKPOINT_FILE_FAULTS = [("model.safetensors", "cut short"), ("model.safetensors", "emptied"),
                          ("model.safetensors", "deleted"), ("tokenizer.json", "cut short"),
                          ("config.json", "cut short"), ("optimizer.pt", "cut short"), ("scheduler.pt", "emptied"),
                          ("rng_state.pth", "cut short")]


@pytest.mark.parametrize("name, fault", CHECKPOINT_FILE_FAULTS)
def test_resuming_from_a_damaged_checkpoint_names_the_file_and_the_checkpoint_before_it(name, fault, data, run,
                                                                                       tmp_path, capsys):
    output_dir = copy_of(run, tmp_path)
    FAULTS[fault](output_dir / "checkpoint-4" / name)
    with pytest.raises(SystemExit) as refused:
        train_command.main(command(data, output_dir, "--max_steps", "6"))
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert f"error: {output_dir / 'checkpoint-4' / name} {SAID[fault]}" in error
    assert (f"resume from {output_dir / 'checkpoint-2'} instead (delete checkpoint-4, or pass --resume_from_checkpoint "
            f"{output_dir / 'checkpoint-2'}), or start over with --overwrite_output_dir") in error
    if name == "model.safetensors":
        assert "optimizer" not in error  # a checkpoint that lost its weights is not about its optimizer


def test_a_checkpoint_whose_trainer_state_is_cut_short_is_refused_by_name_or_passed_over(data, run, tmp_path,
                                                                                         capsys, caplog):
    output_dir = copy_of(run, tmp_path)
    state = output_dir / "checkpoint-4" / "trainer_state.json"
    cut_short(state)
    with pytest.raises(SystemExit):
        train_command.main(command(data, output_dir, "--resume_from_checkpoint", str(output_dir / "checkpoint-4")))
    assert f"error: {state} is cut short or overwritten: it does not parse as JSON" in capsys.readouterr().err
    with caplog.at_level(logging.INFO, logger="hf_headattn"):
        train(command(data, output_dir))  # Trainer writes trainer_state.json last: the save was interrupted
    assert (f"{output_dir / 'checkpoint-4'} is incomplete (killed while saving?): its trainer_state.json, which "
            "Trainer writes last, is cut short or overwritten") in caplog.text
    assert caplog.text.count("is incomplete (killed while saving?)") == 1  # the flags' check does not warn too
    assert f"resuming from {output_dir / 'checkpoint-2'}" in caplog.text
    assert same_weights(output_dir, run)


def test_averaging_refuses_a_damaged_or_nan_checkpoint_naming_it(run, tmp_path):
    output_dir = copy_of(run, tmp_path)
    nan, _ = with_non_finite_weights(output_dir / "checkpoint-4")
    with pytest.raises(DamagedFile, match=rf"checkpoint-4/model\.safetensors holds NaN or infinite values in 2 .*"
                                          rf"{nan}.*; leave this checkpoint out of the average"):
        average_checkpoints([output_dir / "checkpoint-2", output_dir / "checkpoint-4"], tmp_path / "average")
    cut_short(output_dir / "checkpoint-2" / "model.safetensors")
    with pytest.raises(DamagedFile, match=r"checkpoint-2/model\.safetensors is cut short or overwritten"):
        average_checkpoints([output_dir / "checkpoint-2", output_dir / "checkpoint-4"], tmp_path / "average")


# ------------------------------------------------------------------------------------------------ a full disk
def test_a_full_disk_while_saving_is_named_and_the_same_command_resumes_once_there_is_room(data, run, tmp_path,
                                                                                         monkeypatch):
    from transformers import modeling_utils

    output_dir, checkpoint = tmp_path / "run", tmp_path / "run" / "checkpoint-4"
    argv = command(data, output_dir)
    save, save_weights = torch.save, modeling_utils.safe_save_file

    def disk_full_in(folder_name, original):
        def writing(obj, path, *args, **kwargs):
            if folder_name in str(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return original(obj, path, *args, **kwargs)
        return writing

    monkeypatch.setattr(torch, "save", disk_full_in("checkpoint-4", save))  # the optimizer's state, after the weights
    with pytest.raises(SystemExit) as stopped:
        train_command.main(argv)
    assert str(stopped.value.code).startswith(
        f"hf-headattn-train: error: {checkpoint} could not be written and is removed: the disk holding {output_dir} "
        "is full (")
    assert str(stopped.value.code).endswith(
        f"run the same command again: it resumes from {output_dir / 'checkpoint-2'}")
    assert sorted(path.name for path in output_dir.iterdir()) == [".hf_headattn_output.json", "checkpoint-2"]

    monkeypatch.setattr(torch, "save", save)  # room for the checkpoint, not for the finished model
    monkeypatch.setattr(modeling_utils, "safe_save_file", disk_full_in(".partial", save_weights))
    with pytest.raises(SystemExit) as stopped:
        train_command.main(argv)
    assert str(stopped.value.code).startswith(
        f"hf-headattn-train: error: the finished model could not be written: the disk holding {output_dir} is full (")
    assert str(stopped.value.code).endswith(f"run the same command again: it resumes from {checkpoint}")
    assert sorted(path.name for path in output_dir.iterdir()) == [".hf_headattn_output.json", "checkpoint-2", "checkpoint-4"]

    monkeypatch.setattr(modeling_utils, "safe_save_file", save_weights)
    train_command.main(argv)
    assert same_weights(output_dir, run)  # as the uninterrupted run
    load_model_and_tokenizer(output_dir)


@pytest.mark.parametrize("error", [
    # what PyTorch's and safetensors' writers raised on a full 2 MiB tmpfs (torch 2.13, safetensors 0.8)
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
])
def test_the_writers_full_disk_errors_are_recognised(error, tmp_path):
    described = write_failure(error, tmp_path / "checkpoint-4")
    assert described is not None and f"{tmp_path / 'checkpoint-4'}" in described
    assert "disk is full" in described or "is full (" in described
    assert write_failure(RuntimeError("CUDA out of memory"), tmp_path) is None


def test_pytorchs_writer_stopping_on_a_nearly_full_disk_is_called_a_full_disk(tmp_path, monkeypatch):
    """PyTorch's zip writer gives no cause; a disk with 1.5 MiB free is full, and the message says so (issue 75)."""
    from collections import namedtuple

    from hf_headattn import saved_files

    usage = namedtuple("usage", "total used free")
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.setattr(saved_files.shutil, "disk_usage", lambda path: usage(10 << 30, (10 << 30) - (3 << 19), 3 << 19))
    assert write_failure(error, tmp_path).startswith(f"the disk holding {tmp_path} is full (1.5 MiB free; PyTorch's "
                                                     "writer stopped: [enforce fail")
    monkeypatch.setattr(saved_files.shutil, "disk_usage", lambda path: usage(10 << 30, 5 << 30, 5 << 30))
    assert write_failure(error, tmp_path).startswith(f"PyTorch could not write into {tmp_path}")


def test_a_damaged_run_manifest_is_named_with_what_to_do(tmp_path):
    from hf_headattn.training.run_manifest import read_manifest

    (tmp_path / "run_manifest.json").write_text('{"format": 1, "ident')  # cut short
    with pytest.raises(ValueError, match=r"run_manifest\.json is damaged .*Copy it from another checkpoint of the "
                                         "same run"):
        read_manifest(tmp_path)


DAMAGED_DOWNLOAD_SCRIPT = WITHOUT_PACKAGE + """
from transformers import AutoModelForSeq2SeqLM
try:
    AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True)
except OSError as error:
    print("ERROR", error)
"""


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_a_remote_code_user_is_told_which_weights_file_is_damaged(family, tmp_path):
    """Without this package (the folder's own code, through trust_remote_code), a cut-short model.safetensors is
    named with what to do, not safetensors' bare "incomplete metadata" (issue 75)."""
    model = (random_model(tiny_config()) if family == "transformer" else random_rnn_model(rnn_config()))
    model.save_pretrained(tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    done = subprocess.run([sys.executable, "-c", DAMAGED_DOWNLOAD_SCRIPT, str(tmp_path / "model")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                                              "HF_MODULES_CACHE": str(tmp_path / "m")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"ERROR {weights} cannot be read (SafetensorError: "), done.stdout
    assert "it is cut short or damaged, as an interrupted download or copy leaves it; copy or save the folder again" \
        in done.stdout
