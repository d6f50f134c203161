"""Slow: the training command under two processes (torchrun; accelerate launch with a config file; FSDP through
Trainer's --fsdp, gloo) gives the loss curve of one process with the same global batch; --max_tokens batches split
across two ranks; short --bf16 and --torch_compile runs of the variants."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from hf_headattn.training import train

from helpers import toy_data


pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
STEPS = 6
# Accelerate's multi-CPU launcher needs mpirun; its torch.distributed launcher (MULTI_GPU) runs two gloo
# processes on a CPU-only machine, since the command trains with use_cpu there.
ACCELERATE_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: 2
machine_rank: 0
mixed_precision: 'no'
dynamo_backend: 'NO'
"""


def flags(data, output_dir, *extra) -> list[str]:
    return [
        "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
        "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
        "--output_dir", str(output_dir), "--vocab_size", "200", "--d_model", "32", "--layers", "1", "--heads", "4",
        "--ffn_dim", "64", "--max_length", "24", "--dropout", "0", "--cross_attention", "dhicm",
        "--max_steps", str(STEPS), "--logging_steps", "1", "--warmup_steps", "2", "--save_steps", str(STEPS),
        "--keep_checkpoints", "--eval_strategy", "no", *extra,
    ]


def losses(output_dir) -> list[float]:
    state = json.loads((output_dir / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def launch(launcher: list[str], arguments: list[str], output_dir) -> dict:
    done = subprocess.run([*launcher, "-m", "hf_headattn.commands.train", *arguments], env=ENV, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    # DDP searches for unused parameters only where there are some (the PREDICTED fertility tagger's)
    assert "find_unused_parameters=True was specified" not in done.stderr
    return json.loads((output_dir / "train_results.json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def one_process_curve(data, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("one")
    launch([sys.executable], flags(data, output_dir, "--per_device_train_batch_size", "16"), output_dir)
    return losses(output_dir)


def test_torchrun_two_processes_follow_the_one_process_loss_curve(data, one_process_curve, tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    results = launch(["torchrun", "--nproc_per_node", "2"],
                     flags(data, tmp_path, "--per_device_train_batch_size", "8"), tmp_path)
    assert results["world_size"] == 2
    # the same 16 pairs per step, split 8 + 8; gradients averaged across the ranks
    assert losses(tmp_path) == pytest.approx(one_process_curve, rel=1e-4)


def test_accelerate_launch_with_a_config_file_runs_two_processes(data, one_process_curve, tmp_path):
    (tmp_path / "accelerate.yaml").write_text(ACCELERATE_CONFIG)
    output_dir = tmp_path / "run"
    results = launch(["accelerate", "launch", "--config_file", str(tmp_path / "accelerate.yaml")],
                     flags(data, output_dir, "--per_device_train_batch_size", "8"), output_dir)
    assert results["world_size"] == 2
    assert losses(output_dir) == pytest.approx(one_process_curve, rel=1e-4)


def test_fsdp_on_two_cpu_processes_follows_the_one_process_loss_curve(data, one_process_curve, tmp_path):
    fsdp = ["--fsdp", "full_shard auto_wrap",
            "--fsdp_config", '{"transformer_layer_cls_to_wrap": ["HeadAttnEncoderLayer", "HeadAttnDecoderLayer"]}']
    results = launch(["torchrun", "--nproc_per_node", "2"],
                     flags(data, tmp_path, "--per_device_train_batch_size", "8", *fsdp), tmp_path)
    assert results["world_size"] == 2
    assert losses(tmp_path) == pytest.approx(one_process_curve, rel=1e-4)


def test_max_tokens_batches_train_on_two_ranks(data, tmp_path):
    results = launch(["torchrun", "--nproc_per_node", "2"], flags(data, tmp_path, "--max_tokens", "120"), tmp_path)
    assert results["world_size"] == 2 and len(losses(tmp_path)) == STEPS


VARIANTS = {
    "softmax": [],
    "mma": ["--encoder_self_attention", "mma"],
    "dhicm": ["--cross_attention", "dhicm"],
    "csparsemax": ["--cross_attention", "csparsemax"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("precision", ["--bf16", "--torch_compile"])
def test_few_steps_in_bf16_and_compiled(variant, precision, data, tmp_path):
    arguments = flags(data, tmp_path, "--per_device_train_batch_size", "8", precision)
    arguments[arguments.index("--cross_attention") + 1] = "softmax"
    metrics = train([*arguments, "--max_steps", "3", *VARIANTS[variant]])
    assert metrics["train_loss"] > 0 and (tmp_path / "model.safetensors").exists()
