"""A training run's --output_dir as a transaction: one run at a time, and a finished model that replaces the old
one whole.

* `RunLock` — an OS file lock (`filelock`, flock on POSIX) held by the training command for its whole life, on a
  hidden sibling file (``runs/.de-en.lock`` for ``runs/de-en``: the folder itself is swapped at the end, and may
  not exist yet). A second run fails at once, naming the folder and the holder's pid, host and start time (which
  the holder writes into the lock file); the kernel drops the lock of a killed process, so a run killed with
  ``kill -9`` never blocks the next one.
* The finished model is saved into a staging sibling (``runs/.de-en.partial``), the old folder's other contents
  (checkpoints kept with --keep_checkpoints, logs, the user's own files, but not its model files) are hard-linked
  into it (`carry_over`), and `output_files.replace_folder` swaps it into the folder's place in one step; a run
  killed between the two renames of a system without an atomic exchange leaves the old folder at
  ``runs/.de-en.replaced``.
* `clean_leftovers` — run under the lock before anything else: removes what an interrupted swap left behind.
* `check_run_folder` — a folder another command wrote (its `output_files` record says which) is no run folder.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..output_files import TRAIN_COMMAND, recover_interrupted_swap, sibling, written_by

logger = logging.getLogger(__name__)

# What a saved model consists of (save_pretrained of a model and a tokenizer, the training command's records):
# the old folder's files of these names are replaced by the new model's, never kept beside them.
MODEL_FILE_PATTERNS = (
    "config.json", "generation_config.json", "model.safetensors", "model-*.safetensors", "*.safetensors.index.json",
    "pytorch_model*.bin", "pytorch_model.bin.index.json", "*.py", "tokenizer*.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "*.spm", "*.model", "chat_template.*", "training_args.bin",
    "train_results.json", "run_manifest.json",
)
TOKENIZER_SCRATCH = ".tokenizer-in-training"  # the run's trained tokenizer until its first checkpoint holds it


class RunRefused(RuntimeError):
    """A training run that must not start or go on; the command prints it without a traceback and exits 1."""


class RunLock:
    """Exclusive use of `output_dir` by this process, as a context manager (see the module docstring)."""

    def __init__(self, output_dir: str | Path):
        from filelock import FileLock

        self.output_dir = Path(output_dir).resolve()
        self.path = sibling(self.output_dir, "lock")
        self._lock = FileLock(self.path, timeout=0)

    def __enter__(self) -> RunLock:
        from filelock import Timeout

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise RunRefused(f"--output_dir {self.output_dir} is in use by another training run ({self._holder()}; "
                             f"lock file {self.path}); wait for it to end, or choose another --output_dir") from None
        # the lock file's contents, not its lock, say who holds it (a run killed holding it leaves them stale)
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}, handle)
        return self

    def __exit__(self, *exc_info) -> None:
        self._lock.release()

    def _holder(self) -> str:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            return f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
        except (OSError, ValueError, KeyError, TypeError):  # caught between the holder's lock and its write
            return "its pid and host are not written yet"


def clean_leftovers(output_dir: str | Path) -> None:
    """Undo what a swap killed midway left (call it holding the lock): an old folder moved aside goes back if the
    new one never took its place (`output_files.recover_interrupted_swap`), and the staging folder, which then
    holds a model never swapped in or the old folder swapped out, is deleted."""
    output_dir = Path(output_dir).resolve()
    recover_interrupted_swap(output_dir)
    staging = sibling(output_dir, "partial")
    if staging.exists():
        logger.info(f"removing {staging}, left by a run killed while saving its model")
        shutil.rmtree(staging)


def check_run_folder(output_dir: str | Path) -> None:
    """Refuse an --output_dir that another command wrote (an average, an export, a Space): a run would mix its
    checkpoints and model into it."""
    writer = written_by(output_dir)
    if writer not in (None, TRAIN_COMMAND):
        raise RunRefused(f"--output_dir {output_dir} was written by {writer}, not by a training run; choose another "
                         "--output_dir")


def is_model_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def carry_over(output_dir: str | Path, staging: str | Path, keep_checkpoints: bool) -> list[str]:
    """Hard-link into `staging` what of `output_dir` outlives the swap: everything but its model files, the run's
    tokenizer scratch and, unless `keep_checkpoints`, its checkpoints. Returns the names carried over besides
    checkpoints (a previous model's card, evaluations, logs), which the caller reports."""
    output_dir, staging = Path(output_dir), Path(staging)
    if not output_dir.is_dir():
        return []
    others = []
    for entry in sorted(output_dir.iterdir()):
        checkpoint = entry.is_dir() and entry.name.startswith(f"{PREFIX_CHECKPOINT_DIR}-")
        if (checkpoint and not keep_checkpoints) or entry.name == TOKENIZER_SCRATCH or (
                not checkpoint and not entry.is_dir() and is_model_file(entry.name)):
            continue
        if (staging / entry.name).exists():  # the new model wrote a file of that name (a model card, say)
            continue
        _link(entry, staging / entry.name)
        if not checkpoint:
            others.append(entry.name)
    return others


def _link(source: Path, destination: Path) -> None:
    """Hard links (no data copied: a checkpoint costs nothing to keep); copies where the file system has none."""
    def link_or_copy(source_file, destination_file):
        try:
            os.link(source_file, destination_file)
        except OSError:
            shutil.copy2(source_file, destination_file)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, destination, symlinks=True, copy_function=link_or_copy)
    elif source.is_symlink():
        os.symlink(os.readlink(source), destination)
    else:
        link_or_copy(source, destination)
