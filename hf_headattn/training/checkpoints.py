"""A run's checkpoints: the ``checkpoint-N`` folders Trainer writes into --output_dir, which one a run resumes from
(`find_checkpoint`), whether its files are whole (`check_checkpoint_files`), and the refusal to resume a checkpoint
of another model (`check_checkpoint_config`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from ..saved_files import JSON, TORCH, check_file, check_tokenizer_folder, check_weights, file_problem

# the names Trainer gives a checkpoint's files (constants of transformers.trainer, which would import Trainer)
TRAINER_STATE_NAME, OPTIMIZER_NAME, SCHEDULER_NAME = "trainer_state.json", "optimizer.pt", "scheduler.pt"

logger = logging.getLogger(__name__)


def find_checkpoint(run_args, training_args, *, warn: bool = True) -> str | None:
    """The checkpoint the run of these RunArguments and Seq2SeqTrainingArguments resumes from:
    --resume_from_checkpoint, else the last complete checkpoint in --output_dir (none with --overwrite_output_dir).
    Refuses an --output_dir that already holds a finished model, --overwrite_output_dir with a checkpoint of the
    --output_dir it would delete, a checkpoint with a damaged or missing file (`check_checkpoint_files`) and one
    without optimizer state unless --reset_optimizer. `warn`: log the incomplete checkpoints passed over
    (`last_complete_checkpoint`); the flags' check, which the run repeats under its lock, does not, so that the
    warning is printed once."""
    output_dir = Path(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None:
        if not (Path(checkpoint) / TRAINER_STATE_NAME).is_file():
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: not a checkpoint folder (it has no "
                             f"{TRAINER_STATE_NAME})")
        if run_args.overwrite_output_dir and output_dir.resolve() in Path(checkpoint).resolve().parents:
            raise ValueError(f"--overwrite_output_dir would delete --resume_from_checkpoint {checkpoint} with the other "
                             f"checkpoints of --output_dir {output_dir}; resume without --overwrite_output_dir, or copy "
                             "the checkpoint elsewhere first")
    elif run_args.overwrite_output_dir or not output_dir.is_dir():
        return None
    else:
        checkpoint = last_complete_checkpoint(output_dir, warn=warn)
        if checkpoint is None and any((output_dir / name).exists() for name in ("config.json", "train_results.json")):
            raise ValueError(f"--output_dir {output_dir} already holds a trained model and no checkpoint to resume "
                             "from; add --overwrite_output_dir to train again there, or choose another --output_dir")
    if checkpoint is not None:
        check_checkpoint_files(checkpoint, reset_optimizer=run_args.reset_optimizer)
    missing = [name for name in (OPTIMIZER_NAME, SCHEDULER_NAME)
               if checkpoint is not None and not (Path(checkpoint) / name).is_file()]
    if missing and not run_args.reset_optimizer:
        raise ValueError(f"{checkpoint} has no {' or '.join(missing)} (saved with --save_only_model, or deleted): "
                         "resuming it would restart the optimizer's moments and the learning-rate schedule; add "
                         "--reset_optimizer to resume it so, or --overwrite_output_dir to start over")
    return checkpoint


def last_complete_checkpoint(output_dir: str | Path, before_step: int | None = None, *,
                             warn: bool = True) -> str | None:
    """The highest-numbered checkpoint-N folder (below `before_step`, if given) that was written to the end:
    Trainer writes trainer_state.json last, so a run killed or out of disk space while saving leaves a folder
    without it, or with one cut short. `warn`: log each incomplete one passed over (only without `before_step`)."""
    checkpoints = sorted(checkpoint_folders(output_dir), key=_step, reverse=True)
    for checkpoint in checkpoints:
        if before_step is not None and _step(checkpoint) >= before_step:
            continue
        problem = file_problem(checkpoint / TRAINER_STATE_NAME, JSON)
        if problem is None:
            return str(checkpoint)
        if before_step is None and warn:
            logger.warning(f"{checkpoint} is incomplete (killed while saving?): its {TRAINER_STATE_NAME}, which "
                           f"Trainer writes last, {problem}; not resuming from it")
    return None


def check_checkpoint_files(checkpoint: str | Path, reset_optimizer: bool = False) -> None:
    """Refuse (`saved_files.DamagedFile`, a ValueError) a checkpoint with a file a resume reads that is missing, empty
    or cut short: trainer_state.json, the weights, config.json and the tokenizer's files, optimizer.pt and
    scheduler.pt where there (unless `reset_optimizer`, which reads neither) and the RNG states; the message says which
    checkpoint to resume from instead."""
    checkpoint = Path(checkpoint)
    earlier = last_complete_checkpoint(checkpoint.parent, before_step=_step(checkpoint))
    remedy = (f"resume from {earlier} instead (delete {checkpoint.name}, or pass --resume_from_checkpoint {earlier}), "
              "or start over with --overwrite_output_dir" if earlier is not None else
              f"start over with --overwrite_output_dir (no checkpoint before {checkpoint.name} is whole)")
    check_file(checkpoint / TRAINER_STATE_NAME, JSON, remedy)
    check_weights(checkpoint, remedy)
    check_file(checkpoint / CONFIG_NAME, JSON, remedy)
    check_tokenizer_folder(checkpoint, remedy)
    optimizer_files = () if reset_optimizer else (OPTIMIZER_NAME, SCHEDULER_NAME)
    for path in [checkpoint / name for name in optimizer_files] + sorted(checkpoint.glob("rng_state*.pth")):
        if path.exists():  # a missing optimizer is find_checkpoint's to explain (--save_only_model)
            check_file(path, TORCH, remedy)


def _step(checkpoint: Path) -> int:
    match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", checkpoint.name)
    return int(match.group(1)) if match else -1


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return [path for path in output_dir.iterdir()
            if path.is_dir() and re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-\d+", path.name)]


def check_checkpoint_config(config, checkpoint: str) -> None:
    """Refuse to resume a checkpoint of another model than the flags describe."""
    saved = type(config).from_pretrained(checkpoint).to_dict()
    ignored = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path", "auto_map",
               "custom_pipelines", "use_cache"}  # Trainer turns the cache off while training
    differences = [f"{key}: {saved.get(key)!r} there, {value!r} now" for key, value in config.to_dict().items()
                   if key not in ignored and saved.get(key) != value]
    if differences:
        raise ValueError(f"{checkpoint} holds a different model than these flags describe ({'; '.join(differences)}); "
                         "pass the flags it was trained with to resume, or --overwrite_output_dir to start over")
