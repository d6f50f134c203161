"""`hf-headattn-average`: the mean of a run's checkpoints, the folder it writes, and what it refuses."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from hf_headattn.averaging import average_checkpoints, average_state_dicts, averaging_warnings, last_checkpoints
from hf_headattn.commands.average import main

from helpers import REPO, WITHOUT_PACKAGE, toy_data, train_tiny_model


def test_mean_is_accumulated_in_float32_and_cast_back():
    states = [{"w": torch.tensor([1.0, 2.0]), "h": torch.tensor([0.1], dtype=torch.bfloat16),
               "ids": torch.tensor([0, 1])},
              {"w": torch.tensor([3.0, 6.0]), "h": torch.tensor([0.2], dtype=torch.bfloat16),
               "ids": torch.tensor([0, 1])},
              {"w": torch.tensor([5.0, 1.0]), "h": torch.tensor([0.4], dtype=torch.bfloat16),
               "ids": torch.tensor([0, 1])}]
    averaged = average_state_dicts(states)
    assert torch.equal(averaged["w"], torch.tensor([3.0, 3.0]))
    expected = sum(state["h"].float() for state in states) / 3
    assert averaged["h"].dtype == torch.bfloat16 and torch.equal(averaged["h"], expected.to(torch.bfloat16))
    assert torch.equal(averaged["ids"], torch.tensor([0, 1]))


@pytest.mark.parametrize("other, message", [
    ({"w": torch.zeros(2), "extra": torch.zeros(1)}, "'extra' is in b only"),
    ({"w": torch.zeros(3)}, r"'w' has shape \(2,\) against \(3,\)"),
])
def test_states_of_different_models_are_refused(other, message):
    with pytest.raises(ValueError, match=message):
        average_state_dicts([{"w": torch.zeros(2)}, other], ["a", "b"])
    with pytest.raises(ValueError, match="integer tensor 'ids' differs"):
        average_state_dicts([{"ids": torch.tensor([1])}, {"ids": torch.tensor([2])}])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("average")
    data = toy_data(directory / "data")
    train_tiny_model(data, directory / "other", "transformer", "--cross_attention", "sparsemax")
    return train_tiny_model(data, directory / "run", "transformer", "--save_steps", "1", "--save_total_limit", "3",
                            "--keep_checkpoints")


def test_last_checkpoints_are_the_newest_by_step(tmp_path):
    for step in (9, 10, 100, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-last").mkdir()
    assert [folder.name for folder in last_checkpoints(tmp_path, 3)] == ["checkpoint-9", "checkpoint-10",
                                                                         "checkpoint-100"]
    with pytest.raises(ValueError, match=r"--last 5: .* holds 4 checkpoint folder\(s\)"):
        last_checkpoints(tmp_path, 5)


def test_averaged_folder_holds_the_mean_and_loads_without_the_package(run_dir, tmp_path, capsys):
    main(["--last", "3", str(run_dir), "--output_dir", str(tmp_path / "avg")])
    assert "averaged 3 checkpoints (checkpoint-1, checkpoint-2, checkpoint-3)" in capsys.readouterr().out
    inputs = [load_file(folder / "model.safetensors") for folder in last_checkpoints(run_dir, 3)]
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    assert set(averaged) == set(inputs[0])
    for key, value in averaged.items():
        torch.testing.assert_close(value, sum(state[key] for state in inputs) / 3, rtol=0, atol=1e-7)
    assert json.loads((tmp_path / "avg" / "averaged_from.json").read_text())["checkpoints"][-1].endswith(
        "checkpoint-3")
    assert not list(tmp_path.glob(".avg*"))  # the staging folder was renamed
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "avg").stat().st_mode & 0o777 == 0o777 & ~umask  # not tempfile's private 0700
    script = WITHOUT_PACKAGE + f"""
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from safetensors.torch import load_file
folder = {str(tmp_path / "avg")!r}
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
saved = load_file(folder + "/model.safetensors")
state = model.state_dict()
print(all(bool((state[key] == value).all()) for key, value in saved.items()))
"""
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "True"


def test_averaging_refuses_what_it_cannot_average(run_dir, tmp_path, capsys):
    checkpoints = last_checkpoints(run_dir, 3)
    with pytest.raises(ValueError, match="their configs differ \\(cross_attention: 'softmax' against 'sparsemax'"):
        average_checkpoints([checkpoints[0], run_dir.parent / "other"], tmp_path / "out")
    with pytest.raises(ValueError, match="average lies inside the input .*checkpoint-2"):
        average_checkpoints(checkpoints, checkpoints[1] / "average")
    with pytest.raises(ValueError, match="checkpoint-3 is the input .*checkpoint-3: writing there would delete it"):
        average_checkpoints(checkpoints, checkpoints[2], overwrite=True)
    with pytest.raises(ValueError, match="named twice"):
        average_checkpoints([checkpoints[0], checkpoints[0]], tmp_path / "out")
    (tmp_path / "exists").mkdir()
    with pytest.raises(SystemExit):
        main(["--checkpoints", *map(str, checkpoints), "--output_dir", str(tmp_path / "exists")])
    assert "exists; choose another folder or pass --overwrite" in capsys.readouterr().err
    main(["--checkpoints", *map(str, checkpoints), "--output_dir", str(tmp_path / "exists"), "--overwrite"])
    assert (tmp_path / "exists" / "model.safetensors").is_file()
    with pytest.raises(SystemExit):
        main(["--last", "x", str(run_dir), "--output_dir", str(tmp_path / "x")])
    assert "N must be a positive whole number" in capsys.readouterr().err


def _snapshot(folder):
    return {path.relative_to(folder): path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def test_overwrite_never_replaces_the_run_or_a_folder_it_did_not_write(run_dir, tmp_path, capsys):
    before = _snapshot(run_dir)
    with pytest.raises(SystemExit):  # the run folder holds the checkpoints: data loss before issue 44
        main(["--last", "2", str(run_dir), "--output_dir", str(run_dir), "--overwrite"])
    assert "holds the input" in capsys.readouterr().err
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit):
        main(["--last", "2", str(run_dir), "--output_dir", str(theirs), "--overwrite"])
    assert "has no .hf_headattn_output.json saying which command wrote it" in capsys.readouterr().err
    sibling_run = run_dir.parent / "other"  # written by the training command
    with pytest.raises(SystemExit):
        main(["--last", "2", str(run_dir), "--output_dir", str(sibling_run), "--overwrite"])
    assert "holds a training run" in capsys.readouterr().err
    assert _snapshot(run_dir) == before and (theirs / "notes.txt").read_text() == "mine\n"
    assert (sibling_run / "model.safetensors").is_file()
    # an average replaces an average
    main(["--last", "2", str(run_dir), "--output_dir", str(tmp_path / "avg")])
    main(["--last", "3", str(run_dir), "--output_dir", str(tmp_path / "avg"), "--overwrite"])
    assert "checkpoint-1" in (tmp_path / "avg" / "averaged_from.json").read_text()


def test_written_files_are_readable_as_the_umask_says(run_dir, tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    average_checkpoints(last_checkpoints(run_dir, 2), tmp_path / "avg")
    for folder in (tmp_path / "avg", run_dir, run_dir / "checkpoint-3"):  # averaged, trained, checkpoint
        assert oct((folder / "model.safetensors").stat().st_mode & 0o777) == oct(0o666 & ~umask), folder


def test_checkpoints_of_different_runs_are_refused_unless_asked_for(run_dir, tmp_path, capsys):
    other_seed = train_tiny_model(toy_data(tmp_path / "data"), tmp_path / "seed2", "transformer", "--seed", "2")
    mixed = [last_checkpoints(run_dir, 1)[0], other_seed]
    with pytest.raises(SystemExit):
        main(["--checkpoints", *map(str, mixed), "--output_dir", str(tmp_path / "soup")])
    error = capsys.readouterr().err
    assert "checkpoints of different runs (--seed: 42 there, 2 now)" in error and "--allow_different_runs" in error
    main(["--checkpoints", *map(str, mixed), "--output_dir", str(tmp_path / "soup"), "--allow_different_runs"])
    assert (tmp_path / "soup" / "model.safetensors").is_file()
    # another tokenizer of the same size: two token ids swapped
    retokenized = tmp_path / "retokenized"
    shutil.copytree(other_seed, retokenized)
    tokenizer = json.loads((retokenized / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (retokenized / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="their tokenizers differ"):
        average_checkpoints([other_seed, retokenized], tmp_path / "never", allow_different_runs=True)


def _edited_copy(checkpoint, destination, *, warmup_steps=None, eval_loss=None):
    shutil.copytree(checkpoint, destination)
    if warmup_steps is not None:
        manifest = json.loads((destination / "run_manifest.json").read_text())
        manifest["identity"]["--warmup_steps"] = warmup_steps
        (destination / "run_manifest.json").write_text(json.dumps(manifest))
    if eval_loss is not None:
        state = json.loads((destination / "trainer_state.json").read_text())
        state["log_history"].append({"step": state["global_step"], "eval_loss": eval_loss})
        (destination / "trainer_state.json").write_text(json.dumps(state))
    return destination


def test_warm_up_checkpoints_and_far_apart_losses_are_warned_about(run_dir, tmp_path, caplog):
    checkpoints = last_checkpoints(run_dir, 3)
    assert averaging_warnings(checkpoints[1:]) == []  # steps 2 and 3, after a 1-step warm-up
    assert "checkpoint-1 (step 1) was saved during the learning-rate warm-up (steps 1-1)" in \
        averaging_warnings(checkpoints)[0]
    ratio = [_edited_copy(checkpoint, tmp_path / checkpoint.name, warmup_steps=0.5) for checkpoint in checkpoints]
    assert "checkpoint-1 (step 1), checkpoint-2 (step 2) were saved during" in averaging_warnings(ratio)[0]
    close = [_edited_copy(checkpoint, tmp_path / "close" / checkpoint.name, eval_loss=loss)
             for checkpoint, loss in zip(checkpoints[1:], (2.00, 2.15))]
    assert averaging_warnings(close) == []
    apart = [_edited_copy(checkpoint, tmp_path / "apart" / checkpoint.name, eval_loss=loss)
             for checkpoint, loss in zip(checkpoints[1:], (2.0, 4.3))]
    with caplog.at_level(logging.WARNING, logger="hf_headattn"):
        main(["--checkpoints", *map(str, apart), "--output_dir", str(tmp_path / "avg")])
    assert "validation losses differ widely (checkpoint-2 (step 2): 2, checkpoint-3 (step 3): 4.3)" in caplog.text
