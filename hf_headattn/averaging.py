r"""Checkpoint averaging (fairseq's ``scripts/average_checkpoints.py``, OpenNMT's ``onmt_average_models``): the
element-wise mean of the weights of several checkpoints of one run, saved as a model folder of its own. The
command is ``hf-headattn-average`` (`commands/average.py`).

The mean is accumulated in float32 and cast back to each weight's dtype. The folder is written as the training
command writes one: the model through ``save_pretrained`` (weights, config, generation config and the runtime
code, so it loads with ``trust_remote_code``), the tokenizer and the run manifest (which binds the tokenizer to the
weights), all taken from the newest checkpoint, first into a temporary sibling folder that takes the output's place
in one step (`output_files.replace_folder`), so an interrupted run leaves no half-written folder, and ``--overwrite``
replaces an old one whole.

Checkpoints are refused when their configs, parameter names or shapes differ (naming the first difference), and
the output folder may be none of the inputs (nor inside one).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from .output_files import staging_folder
from .saved_files import JSON, SAFETENSORS, check_file, refuse_non_finite_weights

__all__ = ["average_checkpoints", "average_state_dicts", "last_checkpoints"]

# config.json entries that say where or with what a checkpoint was written, not what the model is
CONFIG_BOOKKEEPING = ("_name_or_path", "transformers_version", "auto_map", "custom_pipelines")
LEAVE_OUT = "leave this checkpoint out of the average"  # what to do about a damaged one


def last_checkpoints(run_dir: str | Path, count: int) -> list[Path]:
    """The `count` newest ``checkpoint-<step>`` folders of a training run's output folder, oldest first."""
    from .training.checkpoints import checkpoint_folders

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"Run folder not found: {run_dir}")
    folders = sorted(checkpoint_folders(run_dir), key=lambda folder: int(folder.name.rpartition("-")[2]))
    if count < 1 or len(folders) < count:
        raise ValueError(f"--last {count}: {run_dir} holds {len(folders)} checkpoint folder(s) "
                         f"({', '.join(folder.name for folder in folders) or 'none'}); keep more with "
                         "--save_total_limit, or average fewer")
    return folders[-count:]


def _config_of(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a saved model folder: it has no config.json")
    check_file(path, JSON, LEAVE_OUT)
    config = json.loads(path.read_text(encoding="utf-8"))
    return {key: value for key, value in config.items() if key not in CONFIG_BOOKKEEPING}


def _first_difference(first: dict, other: dict) -> str | None:
    for key in sorted(set(first) | set(other)):
        if first.get(key, "<absent>") != other.get(key, "<absent>"):
            return f"{key}: {first.get(key, '<absent>')!r} against {other.get(key, '<absent>')!r}"
    return None


def _load_weights(folder: Path) -> dict:
    """A checkpoint folder's weights (one safetensors file or a sharded set), by parameter name; a file that is
    empty or cut short, or weights that are not finite, are refused (`saved_files.DamagedFile`) naming them."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights")
    state = {}
    for file in files:
        check_file(file, SAFETENSORS, LEAVE_OUT)
        state.update(load_file(file))
    refuse_non_finite_weights(state, files[0] if len(files) == 1 else folder, LEAVE_OUT)
    return state


def average_state_dicts(states: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """The element-wise mean of state dicts with equal names and shapes, accumulated in float32 and cast back to
    each tensor's dtype (integer tensors, such as position ids, must be equal and are kept).

    Raises:
        ValueError: differing parameter names, shapes or integer buffers, naming the first and the two states
            (`names`, default their positions).
    """
    import torch

    names = list(names) if names is not None else [f"state {k}" for k in range(len(states))]
    if not states:
        raise ValueError("Nothing to average: give at least one checkpoint")
    first = states[0]
    for name, state in zip(names[1:], states[1:]):
        if set(state) != set(first):
            only_first = sorted(set(first) - set(state))
            only_other = sorted(set(state) - set(first))
            difference = (f"{only_first[0]!r} is in {names[0]} only" if only_first
                          else f"{only_other[0]!r} is in {name} only")
            raise ValueError(f"Cannot average {names[0]} and {name}: their parameter names differ ({difference})")
        for key in first:
            if state[key].shape != first[key].shape:
                raise ValueError(f"Cannot average {names[0]} and {name}: {key!r} has shape "
                                 f"{tuple(first[key].shape)} against {tuple(state[key].shape)}")
    averaged = {}
    for key, tensor in first.items():
        if not tensor.is_floating_point():
            for name, state in zip(names[1:], states[1:]):
                if not torch.equal(state[key], tensor):
                    raise ValueError(f"Cannot average {names[0]} and {name}: integer tensor {key!r} differs")
            averaged[key] = tensor.clone()
            continue
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for state in states:
            total += state[key].to(torch.float32)
        averaged[key] = (total / len(states)).to(tensor.dtype)
    return averaged


def _check_output(output_dir: Path, checkpoints: Sequence[Path], overwrite: bool) -> None:
    resolved = output_dir.resolve()
    for checkpoint in checkpoints:
        inside = checkpoint.resolve()
        if resolved == inside or inside in resolved.parents:
            raise ValueError(f"--output_dir {output_dir} is (inside) the input checkpoint {checkpoint}; "
                             "write the average to a folder of its own")
    if output_dir.exists() and not overwrite:
        raise FileExistsError(f"--output_dir {output_dir} exists; choose another folder or pass --overwrite")


def average_checkpoints(checkpoints: Sequence[str | Path], output_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Average the weights of `checkpoints` (model folders of one run: same config, same parameters) and write a
    complete model folder to `output_dir` (see the module's docstring). Returns the folder.

    Raises:
        FileNotFoundError: a missing folder, config.json or weights.
        FileExistsError: `output_dir` exists and not `overwrite`.
        ValueError: fewer than one checkpoint, differing configs / names / shapes, an output among the inputs.
    """
    from transformers import AutoModelForSeq2SeqLM

    from . import auto_classes  # noqa: F401  (the folder's model type resolves)
    from .output_files import replace_folder
    from .training.run_manifest import MANIFEST_NAME
    from .tokenization import load_tokenizer

    checkpoints = [Path(checkpoint) for checkpoint in checkpoints]
    output_dir = Path(output_dir)
    if not checkpoints:
        raise ValueError("Nothing to average: give at least one checkpoint")
    for checkpoint in checkpoints:
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"Checkpoint folder not found: {checkpoint}")
    if len(set(checkpoint.resolve() for checkpoint in checkpoints)) < len(checkpoints):
        raise ValueError("A checkpoint is named twice; each counts once in the mean")
    _check_output(output_dir, checkpoints, overwrite)
    configs = [_config_of(checkpoint) for checkpoint in checkpoints]
    for checkpoint, config in zip(checkpoints[1:], configs[1:]):
        if difference := _first_difference(configs[0], config):
            raise ValueError(f"Cannot average {checkpoints[0]} and {checkpoint}: their configs differ ({difference})")
    states = [_load_weights(checkpoint) for checkpoint in checkpoints]
    averaged = average_state_dicts(states, [str(checkpoint) for checkpoint in checkpoints])
    del states

    newest = checkpoints[-1]
    model = AutoModelForSeq2SeqLM.from_pretrained(newest, trust_remote_code=True)  # local folders of one run
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    # a tied weight (shared embeddings) is saved once, under one of its names; its other names are not missing
    parameters = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(parameters[key]) for key in averaged if key in parameters}
    missing = [key for key in missing if key not in parameters or id(parameters[key]) not in loaded]
    if unexpected or missing:
        raise ValueError(f"{newest}: its weights do not fit its model (unexpected: {unexpected[:3]}, "
                         f"missing: {missing[:3]})")
    tokenizer = load_tokenizer(newest)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(output_dir)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "averaged_from.json").write_text(json.dumps(
            {"checkpoints": [str(checkpoint.resolve()) for checkpoint in checkpoints]}, indent=2) + "\n",
            encoding="utf-8")
        if (newest / MANIFEST_NAME).is_file():  # the run's record: which tokenizer the weights belong with
            shutil.copyfile(newest / MANIFEST_NAME, staging / MANIFEST_NAME)
        replace_folder(output_dir, staging)  # --overwrite: the old folder is swapped out whole, once this is complete
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir
