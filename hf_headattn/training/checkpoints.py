"""A run's checkpoints: the ``checkpoint-N`` folders Trainer writes into --output_dir, which one a run resumes from
(`find_checkpoint`), and the refusal to resume a checkpoint of another model (`check_checkpoint_config`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)


def find_checkpoint(run_args, training_args) -> str | None:
    """The checkpoint the run of these RunArguments and Seq2SeqTrainingArguments resumes from:
    --resume_from_checkpoint, else the last complete checkpoint in --output_dir (none with --overwrite_output_dir).
    Refuses an --output_dir that already holds a finished model, --overwrite_output_dir with a checkpoint of the
    --output_dir it would delete, and a checkpoint without optimizer state unless --reset_optimizer."""
    output_dir = Path(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None:
        if not (Path(checkpoint) / "trainer_state.json").is_file():
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: not a checkpoint folder (it has no "
                             "trainer_state.json)")
        if run_args.overwrite_output_dir and output_dir.resolve() in Path(checkpoint).resolve().parents:
            raise ValueError(f"--overwrite_output_dir would delete --resume_from_checkpoint {checkpoint} with the other "
                             f"checkpoints of --output_dir {output_dir}; resume without --overwrite_output_dir, or copy "
                             "the checkpoint elsewhere first")
    elif run_args.overwrite_output_dir or not output_dir.is_dir():
        return None
    else:
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None and any((output_dir / name).exists() for name in ("config.json", "train_results.json")):
            raise ValueError(f"--output_dir {output_dir} already holds a trained model and no checkpoint to resume "
                             "from; add --overwrite_output_dir to train again there, or choose another --output_dir")
    missing = [name for name in ("optimizer.pt", "scheduler.pt")
               if checkpoint is not None and not (Path(checkpoint) / name).is_file()]
    if missing and not run_args.reset_optimizer:
        raise ValueError(f"{checkpoint} has no {' or '.join(missing)} (saved with --save_only_model, or deleted): "
                         "resuming it would restart the optimizer's moments and the learning-rate schedule; add "
                         "--reset_optimizer to resume it so, or --overwrite_output_dir to start over")
    return checkpoint


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The highest-numbered checkpoint-N folder that was written to the end (Trainer writes trainer_state.json
    last, so a run killed while saving leaves a folder without it)."""
    checkpoints = sorted(checkpoint_folders(output_dir), key=lambda path: int(path.name.split("-")[-1]), reverse=True)
    for checkpoint in checkpoints:
        if (checkpoint / "trainer_state.json").is_file():
            return str(checkpoint)
        logger.warning(f"{checkpoint} is incomplete (killed while saving?); not resuming from it")
    return None


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
