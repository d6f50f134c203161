r"""Checkpoint averaging (fairseq's ``scripts/average_checkpoints.py``, OpenNMT's ``onmt_average_models``): the
element-wise mean of the weights of several checkpoints of one run, saved as a model folder of its own. The
command is ``hf-headattn-average`` (`commands/average.py`).

The mean is accumulated in float32 and cast back to each weight's dtype. The folder is written as the training
command writes one: the model through ``save_pretrained`` (weights, config, generation config and the runtime
code, so it loads with ``trust_remote_code``), the tokenizer and the run manifest (which binds the tokenizer to the
weights), all taken from the newest checkpoint, as a transaction (`output_files.new_folder`): an interrupted run
leaves no half-written folder, and ``--overwrite`` replaces only a folder this command wrote, never the run or a
folder that holds a checkpoint.

What it averages must be one model of one run:

* refused: configs, parameter names or shapes that differ (naming the first difference); different tokenizers
  (by `tokenization.tokenizer_fingerprint`); checkpoints of different runs, as their run manifests say (another
  seed, other data, ...), unless ``allow_different_runs`` (a model soup);
* warned about, naming the steps: checkpoints saved during the learning-rate warm-up, and checkpoints whose
  recorded validation losses differ by more than `WIDE_LOSS_SPREAD` of the best.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from .output_files import check_output_folder, new_folder
from .saved_files import JSON, SAFETENSORS, check_file, refuse_non_finite_weights

logger = logging.getLogger(__name__)

__all__ = ["average_checkpoints", "average_state_dicts", "averaging_warnings", "last_checkpoints"]

AVERAGE_COMMAND = "hf-headattn-average"
# validation losses further apart than this share of the best are "widely" different: last-N averaging pays when
# the checkpoints sit near one minimum
WIDE_LOSS_SPREAD = 0.10

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


def _check_one_run(checkpoints: Sequence[Path], allow_different_runs: bool) -> None:
    """Refuse checkpoints with different tokenizers, or (unless `allow_different_runs`) of different runs."""
    from .tokenization import load_tokenizer, tokenizer_fingerprint
    from .training.run_manifest import manifest_differences, read_manifest

    fingerprints = [tokenizer_fingerprint(load_tokenizer(checkpoint)) for checkpoint in checkpoints]
    for checkpoint, fingerprint in zip(checkpoints[1:], fingerprints[1:]):
        if fingerprint != fingerprints[0]:
            raise ValueError(f"Cannot average {checkpoints[0]} and {checkpoint}: their tokenizers differ (sha256 "
                             f"{fingerprints[0][:12]} against {fingerprint[:12]}), so the same weight means another "
                             "word in each")
    manifests = [read_manifest(checkpoint) for checkpoint in checkpoints]
    if any(manifest is None for manifest in manifests):
        unknown = [str(checkpoint) for checkpoint, manifest in zip(checkpoints, manifests) if manifest is None]
        logger.warning(f"{', '.join(unknown)}: no run manifest, so whether these checkpoints are of one run is unknown")
        return
    for checkpoint, manifest in zip(checkpoints[1:], manifests[1:]):
        changed = manifest_differences(manifests[0], manifest)[0]
        if changed and not allow_different_runs:
            raise ValueError(f"Cannot average {checkpoints[0]} and {checkpoint}: they are checkpoints of different "
                             "runs (" + "; ".join(changed[:3]) + (" ..." if len(changed) > 3 else "") + "); pass "
                             "--allow_different_runs (allow_different_runs=True) to average them all the same, as "
                             "a model soup")


def _trainer_state(checkpoint: Path) -> dict | None:
    try:
        return json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def averaging_warnings(checkpoints: Sequence[Path]) -> list[str]:
    """What makes this average likely worse than its newest checkpoint, as the checkpoints' trainer states and run
    manifests show it: checkpoints saved during the learning-rate warm-up, or validation losses far apart."""
    from .training.run_manifest import read_manifest

    states = {checkpoint: _trainer_state(checkpoint) for checkpoint in checkpoints}
    steps = {checkpoint: state["global_step"] for checkpoint, state in states.items()
             if state and isinstance(state.get("global_step"), int)}
    warnings = []
    manifest = read_manifest(checkpoints[-1])
    warmup = (manifest or {}).get("identity", {}).get("--warmup_steps")
    max_steps = (states[checkpoints[-1]] or {}).get("max_steps")
    if isinstance(warmup, (int, float)) and 0 < warmup < 1 and isinstance(max_steps, int):
        warmup = math.ceil(warmup * max_steps)  # a ratio of the run's steps, rounded up as Trainer does
    if isinstance(warmup, (int, float)) and warmup > 0:
        early = [f"{checkpoint.name} (step {step})" for checkpoint, step in steps.items() if step <= warmup]
        if early:
            warnings.append(f"{', '.join(early)} {'was' if len(early) == 1 else 'were'} saved during the learning-rate "
                            f"warm-up (steps 1-{int(warmup):,}), when the weights are far from where "
                            "training ends; average later checkpoints (fewer with --last)")
    losses = {}
    for checkpoint, step in steps.items():
        for entry in states[checkpoint].get("log_history", []):
            if entry.get("step") == step and isinstance(entry.get("eval_loss"), (int, float)):
                losses[checkpoint] = entry["eval_loss"]
    if len(losses) > 1 and max(losses.values()) > min(losses.values()) * (1 + WIDE_LOSS_SPREAD):
        warnings.append("their validation losses differ widely (" + ", ".join(
            f"{checkpoint.name} (step {steps[checkpoint]}): {loss:.4g}" for checkpoint, loss in losses.items())
            + "); an average of checkpoints far apart can be worse than each")
    return warnings


def average_checkpoints(checkpoints: Sequence[str | Path], output_dir: str | Path, *, overwrite: bool = False,
                        allow_different_runs: bool = False) -> Path:
    """Average the weights of `checkpoints` (model folders of one run: same config, same parameters, same
    tokenizer) and write a complete model folder to `output_dir` (see the module's docstring); logs
    `averaging_warnings`. Returns the folder.

    Raises:
        FileNotFoundError: a missing folder, config.json or weights.
        FileExistsError: `output_dir` exists and not `overwrite`.
        ValueError: fewer than one checkpoint; differing configs, names, shapes or tokenizers; checkpoints of
            different runs without `allow_different_runs`; an output that is, holds or lies inside an input, or
            that `overwrite` may not replace (`output_files.OutputRefused`).
    """
    from transformers import AutoModelForSeq2SeqLM

    from . import auto_classes  # noqa: F401  (the folder's model type resolves)
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
    check_output_folder(output_dir, command=AVERAGE_COMMAND, overwrite=overwrite, inputs=checkpoints)
    configs = [_config_of(checkpoint) for checkpoint in checkpoints]
    for checkpoint, config in zip(checkpoints[1:], configs[1:]):
        if difference := _first_difference(configs[0], config):
            raise ValueError(f"Cannot average {checkpoints[0]} and {checkpoint}: their configs differ ({difference})")
    _check_one_run(checkpoints, allow_different_runs)
    for warning in averaging_warnings(checkpoints):
        logger.warning(warning)
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
    with new_folder(output_dir, command=AVERAGE_COMMAND, overwrite=overwrite, inputs=checkpoints) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "averaged_from.json").write_text(json.dumps(
            {"checkpoints": [str(checkpoint.resolve()) for checkpoint in checkpoints]}, indent=2) + "\n",
            encoding="utf-8")
        if (newest / MANIFEST_NAME).is_file():  # the run's record: which tokenizer the weights belong with
            shutil.copyfile(newest / MANIFEST_NAME, staging / MANIFEST_NAME)
    return output_dir
