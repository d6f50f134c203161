"""`hf-headattn-average`: the mean of a run's checkpoints, the folder it writes, and what it refuses."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from hf_headattn.averaging import average_checkpoints, average_state_dicts, last_checkpoints
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
    with pytest.raises(ValueError, match="is \\(inside\\) the input checkpoint"):
        average_checkpoints(checkpoints, checkpoints[1] / "average")
    with pytest.raises(ValueError, match="is \\(inside\\) the input checkpoint"):
        average_checkpoints(checkpoints, checkpoints[2])
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
