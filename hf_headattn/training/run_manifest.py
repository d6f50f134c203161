"""The run manifest: what makes a training run the run it is, written as ``run_manifest.json`` into every
checkpoint and into the finished model folder, and compared when a run resumes (fairseq and Marian refuse to
resume across a changed architecture; this refuses any change that makes the resumed run another run).

* Identity — a resume with another value is refused, naming each setting and its two values: every model and
  tokenizer flag, the tokenizer's fingerprint (`tokenization.tokenizer_fingerprint`), the data (files by content
  hash, a --dataset by name, configuration, revision and splits; --max_train_pairs, --max_valid_pairs, languages),
  --max_length, the batching (--per_device_train_batch_size, --gradient_accumulation_steps, --max_tokens,
  --bucket_pool_pairs, the number of processes), the seeds and the optimizer and schedule.
* May change — accepted and logged: how long it trains (--max_steps, --num_train_epochs), logging, saving,
  evaluation, precision, data loading, early stopping, and the paths of files whose contents are the same.
* Versions of this package, Transformers, torch, datasets and tokenizers — recorded; a resume under other
  versions is warned about (the code, not the run, changed).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

logger = logging.getLogger(__name__)

MANIFEST_NAME = "run_manifest.json"
MANIFEST_FORMAT = 1

# Flags whose files are compared by content (their paths may change); --tokenizer's content is the tokenizer's
# fingerprint, whether it was given or trained
FILE_FLAGS = ("train_source", "train_target", "valid_source", "valid_target", "train_file", "validation_file",
              "tokenizer")
# The package's data flags that do not change what is trained on
DATA_FLAGS_MAY_CHANGE = ("preprocessing_num_workers",)
# Trainer's flags that fix the run: the batches (with the data flags) and the optimizer and its schedule
TRAINER_IDENTITY_FLAGS = (
    "seed", "data_seed", "per_device_train_batch_size", "gradient_accumulation_steps", "train_sampling_strategy",
    "optim", "optim_args", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
)
TRAINER_FLAGS_MAY_CHANGE = (
    "max_steps", "num_train_epochs", "logging_steps", "eval_strategy", "eval_steps", "save_strategy", "save_steps",
    "save_total_limit", "save_only_model", "per_device_eval_batch_size", "predict_with_generate",
    "generation_max_length", "generation_num_beams", "load_best_model_at_end", "metric_for_best_model", "bf16",
    "fp16", "dataloader_num_workers",
)
# The package's run flags that change the optimizer steps (manifests written before they were recorded lack them,
# and are not compared on them)
RUN_IDENTITY_FLAGS = ("lr_decay", "lr_decay_factor", "lr_decay_start_at", "loss_normalization")
# Identity flags added since, with the value every run saved before them had (the flag did not exist, so the model
# or data was built that way): a manifest that lacks one is compared as holding that value
IDENTITY_FLAGS_ADDED = {"--attention_dropout": 0.0, "--activation_dropout": 0.0, "--sample_train_pairs": False}
VERSIONED_PACKAGES = ("hf_headattn", "transformers", "torch", "datasets", "tokenizers")


def build_manifest(model_args, data_args, run_args, training_args, *, tokenizer_sha256: str,
                   file_sha256: dict[str, str]) -> dict:
    """The manifest of a run with these parsed arguments, the fingerprint of its tokenizer and the content hashes
    of the files its flags name (flag -> sha256)."""
    identity, may_change = {}, {}
    for arguments in (model_args, data_args):
        for spec in dataclasses.fields(arguments):
            if spec.name in FILE_FLAGS:
                continue
            target = may_change if spec.name in DATA_FLAGS_MAY_CHANGE else identity
            target[f"--{spec.name}"] = _plain(getattr(arguments, spec.name))
    for name, sha256 in file_sha256.items():
        identity[f"--{name}"] = {"sha256": sha256}
    identity["tokenizer"] = {"sha256": tokenizer_sha256}
    for name in TRAINER_IDENTITY_FLAGS:
        identity[f"--{name}"] = _plain(getattr(training_args, name))
    identity["processes"] = training_args.world_size
    for name in RUN_IDENTITY_FLAGS:
        identity[f"--{name}"] = _plain(getattr(run_args, name))
    for name in TRAINER_FLAGS_MAY_CHANGE:
        may_change[f"--{name}"] = _plain(getattr(training_args, name))
    may_change["--early_stopping_patience"] = run_args.early_stopping_patience
    given = {name: getattr(model_args if name == "tokenizer" else data_args, name) for name in FILE_FLAGS}
    files = {f"--{name}": str(Path(value).resolve()) if Path(value).exists() else value  # (a Hub tokenizer id)
             for name, value in given.items() if value is not None}
    return {"format": MANIFEST_FORMAT, "identity": identity, "may_change": may_change, "files": files,
            "versions": package_versions()}


def package_versions() -> dict[str, str | None]:
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return versions


def _plain(value):
    """A flag's value as JSON holds it (Trainer's enums by their value, whole floats as ints: Trainer turns some
    integer flags into floats)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def write_manifest(folder: str | Path, manifest: dict) -> None:
    (Path(folder) / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                              encoding="utf-8")


def read_manifest(folder: str | Path) -> dict | None:
    """The folder's manifest, or None if it has none (saved by a version before manifests)."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is damaged ({error}); it cannot show which run the folder belongs to. Copy it from "
                         "another checkpoint of the same run (every checkpoint holds the same one), or use another "
                         "checkpoint") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path} is not a run manifest of format {MANIFEST_FORMAT} (this version's)")
    return manifest


def manifest_differences(saved: dict, current: dict) -> tuple[list[str], list[str], list[str]]:
    """(identity changes, accepted changes, version changes) from the `saved` manifest to the `current` one, each
    a line naming the setting and both values ("there" = saved, "now" = current)."""
    unrecorded = {f"--{name}" for name in RUN_IDENTITY_FLAGS} - set(saved["identity"])
    current_identity = {key: value for key, value in current["identity"].items() if key not in unrecorded}
    return (_differences({**IDENTITY_FLAGS_ADDED, **saved["identity"]}, current_identity),
            _differences(saved.get("may_change", {}), current["may_change"])
            + _differences(saved.get("files", {}), current["files"]),
            _differences(saved.get("versions", {}), current["versions"]))


def _differences(saved: dict, current: dict) -> list[str]:
    lines = []
    for key in sorted(set(saved) | set(current), key=lambda key: (key not in current, key)):
        before, after = saved.get(key), current.get(key)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict) and "sha256" in before:
            what = "the tokenizer's vocabulary and rules" if key == "tokenizer" else "the file's contents"
            lines.append(f"{key}: {what} differ (sha256 {before['sha256'][:12]} there, {after['sha256'][:12]} now)")
        else:
            lines.append(f"{key}: {json.dumps(before)} there, {json.dumps(after)} now")
    return lines


def check_resume(checkpoint: str | Path, current: dict) -> None:
    """Refuse to resume `checkpoint` as a run with the `current` manifest unless it is the same run (raises
    ValueError naming every changed identity setting); log the accepted changes, warn about other versions."""
    saved = read_manifest(checkpoint)
    if saved is None:
        logger.warning(f"{checkpoint} has no {MANIFEST_NAME} (saved by an older version): only its model config is "
                       "compared with these flags, not its data, tokenizer, batching or optimizer settings")
        return
    changed, accepted, versions = manifest_differences(saved, current)
    if changed:
        raise ValueError(
            f"{checkpoint} belongs to another run than these flags describe:\n  " + "\n  ".join(changed)
            + "\nPass the settings it was trained with to resume it, or --overwrite_output_dir (or another "
              "--output_dir) to start a new run")
    for line in accepted:
        logger.info(f"resuming with a changed setting: {line}")
    if versions:
        logger.warning(f"{checkpoint} was saved under other package versions ({'; '.join(versions)}); the run "
                       "resumes, but may not continue exactly as it would have")
