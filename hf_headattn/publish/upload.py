"""Upload of a checked model folder to the Hub: only what a user of the model needs, in one commit.

:func:`check_model_folder` lists what an upload needs and is missing; :func:`push_to_hub` runs it, then
``HfApi.create_repo`` and ``HfApi.upload_folder`` (:func:`upload_checked_files`). Only what a user of the model needs
goes up (:func:`files_to_upload`: config, safetensors weights, the code the config names and what it imports,
tokenizer, card, train_results.json); every other file of the folder is named in a warning (:func:`files_left_out`).
Pickle weights (``pytorch_model.bin``) are refused: loading them can run arbitrary code, and ``save_pretrained``
writes safetensors. Only regular files inside the folder go up: a symbolic link out of it is never followed (one the
model needs is refused), and uploaded files that look like they hold a secret (an access token, a private key) are
warned about (:func:`secrets_in`). A repository id is validated before anything is sent.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import fnmatch
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

from huggingface_hub import HfApi, ModelCard
from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from ..output_files import OUTPUT_RECORD

# transformers is imported where it is used, so that the command's `--help` is instant.

__all__ = [
    "UPLOADED_FILES",
    "check_model_folder",
    "files_left_out",
    "files_to_upload",
    "links_out_of",
    "missing_code_files",
    "needed_code_files",
    "push_to_hub",
    "secrets_in",
    "upload_checked_files",
]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# Pickle formats (torch.save): loading them runs whatever they hold, so they are never uploaded, and a folder whose
# only weights are pickled is refused.
PICKLE_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "source.spm", "spiece.model", "sentencepiece.bpe.model", "vocab.json")
# What goes up, at the folder's top level, besides the weights' shards and the code files the config needs: model
# and generation config, tokenizer (this package's tokenizer.json, or a Marian one's sentencepiece models and
# vocabulary), card, and the training command's train_results.json (its numbers). Everything else stays home:
# Trainer's byproducts quietly (TRAINER_BYPRODUCTS), notes and stray files with a warning that names them.
UPLOADED_FILES = (
    "config.json", "generation_config.json", *WEIGHT_FILES, *TOKENIZER_VOCAB_FILES, "target.spm",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "README.md", "train_results.json",
)

# The training command writes these into the output folder (checkpoints only with --keep_checkpoints); no model
# user needs them, and run_manifest.json names the training files by their paths on this machine.
TRAINER_BYPRODUCTS = ("training_args.bin", "checkpoint-*", "run_manifest.json")


def _folder_files(model_dir: Path) -> list[str]:
    """Every file of the folder (relative paths, sorted) but what ``upload_folder`` never sends (``.git``, caches)
    and symbolic links out of the folder (:func:`links_out_of`), nor the folder's record of the command that wrote it."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model folder not found: {model_dir}")
    outside = links_out_of(model_dir)
    relative = [path.relative_to(model_dir).as_posix() for path in sorted(model_dir.glob("**/*")) if path.is_file()]
    return [name for name in filter_repo_objects(relative, ignore_patterns=list(DEFAULT_IGNORE_PATTERNS))
            if name not in outside and name != OUTPUT_RECORD]  # which command wrote the folder: this machine's


def links_out_of(model_dir: str | Path) -> dict[str, str]:
    """The folder's files (relative paths) that lead out of it through a symbolic link, with where they lead: never
    uploaded, since they would send a file from elsewhere on this machine."""
    model_dir = Path(model_dir).resolve()
    return {path.relative_to(model_dir).as_posix(): str(path.resolve())
            for path in sorted(model_dir.glob("**/*")) if path.is_file() and not path.resolve().is_relative_to(model_dir)}


# What an access token or a private key looks like; a file to upload that holds one is warned about.
SECRET_PATTERNS = {
    "a Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "an AWS access key": r"\bAKIA[0-9A-Z]{16}\b",
    "a GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{36,}",
    "an API key (sk-...)": r"\bsk-[A-Za-z0-9_-]{32,}",
    "a Slack token": r"\bxox[abpors]-[A-Za-z0-9-]{10,}",
    "a private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
}


def secrets_in(model_dir: str | Path, names: Sequence[str]) -> list[str]:
    """For each of the folder's files `names` (weights are skipped) that holds what looks like a secret, a line
    naming the file, the line and the kind of secret."""
    found = []
    for name in names:
        if name.endswith(".safetensors"):
            continue
        text = (Path(model_dir) / name).read_text(encoding="utf-8", errors="replace")
        for kind, pattern in SECRET_PATTERNS.items():
            if match := re.search(pattern, text):
                found.append(f"{name}, line {text.count(chr(10), 0, match.start()) + 1}: {kind}")
    return found


def files_to_upload(model_dir: str | Path) -> list[str]:
    """The files (paths relative to `model_dir`, sorted) that :func:`push_to_hub` uploads: those of
    :data:`UPLOADED_FILES` the folder has, the safetensors shards its index names, and the code files its config
    names with every module they import (:func:`needed_code_files`)."""
    model_dir = Path(model_dir)
    files = _folder_files(model_dir)
    wanted = set(UPLOADED_FILES)
    if "model.safetensors.index.json" in files:
        index = json.loads((model_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
        wanted |= set(index.get("weight_map", {}).values())
    if "config.json" in files:
        wanted |= set(needed_code_files(model_dir, json.loads((model_dir / "config.json").read_text(encoding="utf-8"))))
    return [name for name in files if name in wanted]


def files_left_out(model_dir: str | Path) -> list[str]:
    """The folder's files that :func:`push_to_hub` does not upload (relative paths, sorted)."""
    uploaded = set(files_to_upload(model_dir))
    return [name for name in _folder_files(Path(model_dir)) if name not in uploaded]


def needed_code_files(model_dir: Path, config: dict) -> list[str]:
    """The code files (sorted) that the modules named in `config`'s ``auto_map`` and ``custom_pipelines`` need,
    directly or through their relative imports, as far as the folder's files show (a missing file's own imports
    are unknown)."""
    from transformers.dynamic_module_utils import get_relative_imports

    entries = [reference.split(".")[0] for reference in (config.get("auto_map") or {}).values()]
    entries += [spec["impl"].split(".")[0] for spec in (config.get("custom_pipelines") or {}).values() if "impl" in spec]
    needed, to_visit = set(), [f"{entry}.py" for entry in entries]
    while to_visit:
        name = to_visit.pop()
        if name in needed:
            continue
        needed.add(name)
        if (model_dir / name).is_file():
            to_visit += [f"{module}.py" for module in get_relative_imports(model_dir / name)]
    return sorted(needed)


def missing_code_files(model_dir: Path, config: dict) -> list[str]:
    """The code files of :func:`needed_code_files` that `model_dir` lacks."""
    return [name for name in needed_code_files(model_dir, config) if not (model_dir / name).is_file()]


def check_model_folder(model_dir: str | Path) -> list[str]:
    """Check that `model_dir` holds everything a Hub user needs, and return :func:`files_to_upload`.

    Needed: config.json with ``auto_map`` (AutoConfig, AutoModelForSeq2SeqLM) and the ``translation`` custom
    pipeline, safetensors weights (with every shard an index names; pickle weights such as ``pytorch_model.bin``
    are refused), the code those entries name
    and every module it imports (:func:`missing_code_files`), a tokenizer (tokenizer_config.json and its
    vocabulary, e.g. tokenizer.json) and README.md with card metadata (:func:`write_model_card`).

    Raises:
        FileNotFoundError: if `model_dir` does not exist.
        ValueError: naming everything missing or wrong, all at once.
    """
    model_dir = Path(model_dir)
    files = set(files_to_upload(model_dir))
    problems = [f"{name} as a file of the folder (it is a symbolic link to {target}, outside it; copy the file in)"
                for name, target in links_out_of(model_dir).items()
                if name in UPLOADED_FILES or name.endswith((".py", ".safetensors"))]

    if "config.json" not in files:
        problems.append("config.json")
    else:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        auto_map = config.get("auto_map") or {}
        for auto_class in ("AutoConfig", "AutoModelForSeq2SeqLM"):
            if auto_class not in auto_map:
                problems.append(f"config.json auto_map entry {auto_class} (re-save the model with save_pretrained)")
        if "translation" not in (config.get("custom_pipelines") or {}):
            problems.append("config.json custom_pipelines entry 'translation' (re-save the model with save_pretrained)")
        missing_code = missing_code_files(model_dir, config)
        if missing_code:  # e.g. a folder whose code was copied by hand
            problems.append(f"runtime code file(s) {', '.join(missing_code)} (re-save the model with save_pretrained, "
                            "which copies the code it runs)")

    weights = [name for name in WEIGHT_FILES if name in files]
    if not weights:
        pickled = [name for name in PICKLE_WEIGHT_FILES if (model_dir / name).is_file()]
        problems.append("weights as model.safetensors" + (
            f" (the folder has only pickle weights, {', '.join(pickled)}, which can run arbitrary code when loaded "
            "and are never uploaded; load the model and save_pretrained it again, which writes safetensors)"
            if pickled else ""))
    for index in (name for name in weights if name.endswith(".index.json")):
        shards = set(json.loads((model_dir / index).read_text(encoding="utf-8")).get("weight_map", {}).values())
        problems += [f"weight shard {shard} (named in {index})" for shard in sorted(shards - files)]


    if "tokenizer_config.json" not in files:
        problems.append("tokenizer_config.json (save the tokenizer into the folder)")
    if not any(name in files for name in TOKENIZER_VOCAB_FILES):
        problems.append(f"tokenizer vocabulary ({' or '.join(TOKENIZER_VOCAB_FILES)})")
    elif (model_dir / "run_manifest.json").is_file():
        from ..loading import check_tokenizer
        from ..tokenization import load_tokenizer

        try:
            check_tokenizer(model_dir, load_tokenizer(model_dir), model_dir)
        except ValueError as error:
            problems.append(f"the tokenizer the model was trained with ({error})")

    if "README.md" not in files:
        problems.append("README.md (write the model card with hf_headattn.publish.write_model_card)")
    else:
        try:
            metadata = ModelCard.load(model_dir / "README.md").data.to_dict()
        except Exception as error:  # the Hub would reject the card too; say why
            problems.append(f"README.md with valid metadata ({error})")
        else:
            if not metadata:
                problems.append("README.md metadata (the card has no YAML front matter; write it with "
                                "write_model_card)")

    if problems:
        raise ValueError(f"{model_dir} is not ready to upload; missing: " + "; ".join(problems))
    return sorted(files)


def push_to_hub(
    model_dir: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload hf_headattn model, tokenizer, code, translation pipeline and model card",
):
    """Upload a saved model folder (model, tokenizer, runtime code, pipeline and card) to the Hub in one commit.

    Runs :func:`check_model_folder` first, so nothing is created on the Hub for an incomplete folder; then
    ``HfApi.create_repo(repo_id, exist_ok=True)`` and ``HfApi.upload_folder`` of :func:`files_to_upload` alone.
    Warns naming the folder's other files (:func:`files_left_out`), and when the card's loading snippets name
    another repository than `repo_id`.

    Returns:
        What ``upload_folder`` returns (a ``CommitInfo``).
    """
    validate_repo_id(repo_id)
    model_dir = Path(model_dir)
    uploaded = check_model_folder(model_dir)
    left_out = [name for name in files_left_out(model_dir)
                if not any(fnmatch.fnmatch(name.split("/")[0], pattern) for pattern in TRAINER_BYPRODUCTS)]
    if left_out:
        warnings.warn(f"Not uploading {len(left_out)} file(s) of {model_dir} that a user of the model does not need: "
                      f"{', '.join(left_out)}", stacklevel=2)
    if outside := links_out_of(model_dir):
        warnings.warn(f"Not uploading symbolic links out of {model_dir}: "
                      f"{', '.join(f'{name} -> {target}' for name, target in outside.items())}", stacklevel=2)
    if secrets := secrets_in(model_dir, uploaded):
        warnings.warn(f"Files to upload look like they hold secrets: {'; '.join(secrets)}. Remove them from the "
                      "files before pushing (an uploaded secret must be revoked)", stacklevel=2)
    if f'"{repo_id}"' not in (model_dir / "README.md").read_text(encoding="utf-8"):
        warnings.warn(f"The model card's loading snippets do not name {repo_id!r}; rewrite it with "
                      f"write_model_card(..., repo_id={repo_id!r}) so that they work for users", stacklevel=2)
    return upload_checked_files(model_dir, repo_id, uploaded, token=token, private=private,
                                commit_message=commit_message)


def upload_checked_files(folder: str | Path, repo_id: str, files: Sequence[str], *, token: str | None = None,
                         private: bool = False, commit_message: str, repo_type: str = "model", **create_options):
    """Upload `files` (paths relative to `folder`, already checked) in one commit: ``HfApi.create_repo(repo_id,
    exist_ok=True)`` with `create_options` (a Space's ``space_sdk``), then ``upload_folder`` of those files alone.

    Returns:
        What ``upload_folder`` returns (a ``CommitInfo``).
    """
    api = HfApi(token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type=repo_type, **create_options)
    return api.upload_folder(
        repo_id=getattr(repo_url, "repo_id", repo_id),  # the full id when a bare name was given
        folder_path=str(folder),
        repo_type=repo_type,
        commit_message=commit_message,
        allow_patterns=list(files),  # file names, each matching only itself
    )
