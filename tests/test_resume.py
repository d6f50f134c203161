"""Killed and resumed: a training run stopped with SIGKILL after a checkpoint, then started again with the same
command, ends with the weights and optimizer state of a run that was never interrupted, bit for bit."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from helpers import toy_data


STEPS = 48  # 4 steps an epoch with sentence batches of 16: the runs cross many epoch boundaries

BATCHING = {
    "sentence batches": ["--per_device_train_batch_size", "16"],
    "max_tokens": ["--max_tokens", "160"],
    "max_tokens in pools": ["--max_tokens", "160", "--bucket_pool_pairs", "24"],  # pools differ every epoch
}


def command(data, output_dir, batching: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "hf_headattn.commands.train",
        "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
        "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
        "--max_train_pairs", "64", "--output_dir", str(output_dir), "--vocab_size", "150", "--d_model", "32",
        "--layers", "1", "--heads", "4", "--ffn_dim", "64", "--max_length", "24", "--dropout", "0.1",
        "--cross_attention", "dhicm",  # an auxiliary loss (-0.1 KL of the head importances)
        "--max_steps", str(STEPS), "--save_steps", "3", "--save_total_limit", "3", "--keep_checkpoints",
        "--eval_strategy", "no", "--logging_steps", "4", "--warmup_steps", "4", "--seed", "7", *batching,
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_to_the_end(data, output_dir, batching):
    done = subprocess.run(command(data, output_dir, batching), env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def kill_after_checkpoint(data, output_dir, batching, step: int):
    """Start the run and SIGKILL it once checkpoint-`step` is complete (mid-epoch: 4 steps an epoch)."""
    process = subprocess.Popen(command(data, output_dir, batching), env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    marker = output_dir / f"checkpoint-{step}" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (output_dir / "train_results.json").exists()


def assert_same_state(straight, resumed):
    final = f"checkpoint-{STEPS}"
    for name in ("model.safetensors", f"{final}/model.safetensors"):
        expected, got = load_file(straight / name), load_file(resumed / name)
        assert expected.keys() == got.keys()
        for key in expected:
            assert torch.equal(expected[key], got[key]), f"{name}: {key} differs"
    expected = torch.load(straight / final / "optimizer.pt", weights_only=True)
    got = torch.load(resumed / final / "optimizer.pt", weights_only=True)
    assert expected["param_groups"] == got["param_groups"]
    for index, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(value, got["state"][index][key]), f"optimizer state {index}.{key} differs"


@pytest.mark.parametrize("batching", sorted(BATCHING))
def test_a_killed_run_resumes_to_the_same_weights_and_optimizer_state(batching, tmp_path):
    data = toy_data(tmp_path / "data")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_to_the_end(data, straight, BATCHING[batching])
    kill_after_checkpoint(data, resumed, BATCHING[batching], step=6)
    last = max(resumed.glob("checkpoint-*/trainer_state.json"), key=lambda path: int(path.parent.name.split("-")[1]))
    clock = json.loads(last.read_text())["stateful_callbacks"]["TrainingClockCallback"]["attributes"]
    log = run_to_the_end(data, resumed, BATCHING[batching])  # the same command again
    assert f"resuming from {last.parent}" in log
    assert "| real_token_ratio " in log  # logged with the loss
    assert_same_state(straight, resumed)

    # the recorded training time is the checkpoint's part plus the resumed part, not the last part alone
    straight_metrics = json.loads((straight / "train_results.json").read_text())
    assert straight_metrics["train_runtime_total"] == straight_metrics["train_runtime"]
    metrics = json.loads((resumed / "train_results.json").read_text())
    assert clock["seconds_before"] > 0
    assert metrics["train_runtime_total"] == pytest.approx(clock["seconds_before"] + metrics["train_runtime"], abs=1e-3)


def test_ctrl_c_says_in_one_line_which_checkpoint_the_same_command_resumes(tmp_path):
    """Ctrl-C (SIGINT) during training: no traceback, one line naming the last complete checkpoint and the command
    that resumes from it, and the shell's status for an interrupted command (130)."""
    data = toy_data(tmp_path / "data")
    output_dir = tmp_path / "run"
    argv = command(data, output_dir, BATCHING["sentence batches"])
    # SIGINT as a terminal delivers it: a child inherits an ignored SIGINT (from whatever in the test process set it
    # so), and Python started with SIGINT ignored raises no KeyboardInterrupt; in the whole suite the run then
    # trained on to its end, exit 0
    process = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    marker = output_dir / "checkpoint-6" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last_line = stderr.splitlines()[-1]
    checkpoints = sorted(output_dir.glob("checkpoint-*/trainer_state.json"),
                         key=lambda path: int(path.parent.name.split("-")[1]))
    assert last_line.startswith("hf-headattn-train: interrupted; `hf-headattn-train --train_source ")
    assert last_line.endswith(f"` resumes from {checkpoints[-1].parent}"), last_line
