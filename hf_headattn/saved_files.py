"""The files of a saved model folder or training checkpoint, checked before anything reads them: each must be there,
not empty, and parse (JSON files through `json.load`, safetensors files through their header, PyTorch's zip archives
through their central directory); the weights, once loaded, must be finite. A file that fails raises `DamagedFile`,
which names the file, what is wrong with it and what to do.

Without these checks Transformers fails on such files without naming them (a truncated model.safetensors: "incomplete
metadata, file not fully covered"; a missing tokenizer.json: advice to install sentencepiece), or ignores them (a
truncated generation_config.json: the model decodes with its config's defaults), and a model whose weights are NaN
translates every sentence as nothing.

`write_failure` says what a failed save was: a full disk (`errno` ENOSPC or EDQUOT, which safetensors' writer
reports as "os error 28") or PyTorch's zip writer stopping, which reports no cause ("inline_container.cc ...
unexpected pos") and is a full disk in practice.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import zipfile
from pathlib import Path

__all__ = ["DamagedFile", "JSON", "SAFETENSORS", "TORCH", "check_file", "check_model_folder", "check_tokenizer_folder",
           "check_weights", "file_problem", "refuse_non_finite_weights", "weights_files", "write_failure"]

JSON, SAFETENSORS, TORCH = "JSON", "safetensors", "a PyTorch archive"  # what `file_problem` reads a file as

# what to do about a damaged model folder, when the caller knows nothing better
COPY_AGAIN = "copy the folder again from where it came from, or write it again with the command that wrote it"
# ... and about weights that are not finite
DIVERGED = "use an earlier checkpoint of its run (training diverged before this one was saved?), or train it again"

# files of a slow (non-tokenizer.json) tokenizer: a folder with one of them needs no tokenizer.json
SLOW_TOKENIZER_FILES = ("*.spm", "*.model", "vocab.json", "vocab.txt", "merges.txt")
# a tokenizer's JSON files, each checked where present (config.json: AutoTokenizer reads its model type)
TOKENIZER_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json")


class DamagedFile(ValueError):
    """A file that a saved folder needs is missing, empty or does not parse, or its weights are not finite; the
    message names the file (`path`) and what to do."""

    def __init__(self, path: str | Path, problem: str, remedy: str):
        self.path = Path(path)
        super().__init__(f"{path} {problem}; {remedy}")


def file_problem(path: str | Path, kind: str) -> str | None:
    """What is wrong with the file at `path`, read as `kind` (JSON, SAFETENSORS or TORCH): None when it is there, not
    empty, and parses."""
    path = Path(path)
    if not path.is_file():
        return "is missing"
    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    try:
        if kind == JSON:
            with open(path, encoding="utf-8") as handle:
                json.load(handle)
        elif kind == SAFETENSORS:
            from safetensors import safe_open

            with safe_open(path, framework="pt"):  # reads the header, which maps every tensor inside the file
                pass
        else:
            with open(path, "rb") as handle:
                legacy = handle.read(2) == b"\x80\x02"  # a pickle (torch.save before PyTorch 1.6): nothing to check
            if not legacy:
                zipfile.ZipFile(path).close()  # torch.save's archive: its directory is written last
    except Exception as error:  # JSONDecodeError, BadZipFile, safetensors' SafetensorError (no subclass of either)
        return f"is cut short or overwritten: it does not parse as {kind} ({error})"
    return None


def check_file(path: str | Path, kind: str, remedy: str = COPY_AGAIN) -> None:
    """Raise `DamagedFile` if the file at `path` is missing, empty or does not parse as `kind`."""
    if (problem := file_problem(path, kind)) is not None:
        raise DamagedFile(path, problem, remedy)


def weights_files(folder: str | Path, remedy: str = COPY_AGAIN) -> list[Path]:
    """The weights files a saved folder holds: model.safetensors, or the shards its index lists (`DamagedFile` for an
    index that does not parse), or a pytorch_model.bin; none when it holds none of them."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        check_file(index, JSON, remedy)
        shards = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()
        return [folder / name for name in sorted(set(shards))]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).exists():
            return [folder / name]
    return []


def check_weights(folder: str | Path, remedy: str = COPY_AGAIN) -> None:
    """Raise `DamagedFile` for a folder without weights, or with a weights file that is empty or cut short."""
    files = weights_files(folder, remedy)
    if not files:
        raise DamagedFile(Path(folder) / "model.safetensors", "is missing (the folder holds no weights)", remedy)
    for path in files:
        check_file(path, SAFETENSORS if path.suffix == ".safetensors" else TORCH, remedy)


def check_model_folder(folder: str | Path, remedy: str = COPY_AGAIN) -> None:
    """Check what loading a saved model reads: config.json, generation_config.json (where there is one) and the
    weights."""
    folder = Path(folder)
    check_file(folder / "config.json", JSON, remedy)
    if (folder / "generation_config.json").exists():
        check_file(folder / "generation_config.json", JSON, remedy)
    check_weights(folder, remedy)


def check_tokenizer_folder(folder: str | Path, remedy: str = COPY_AGAIN) -> None:
    """Check what loading a saved tokenizer reads: its JSON files where present, and tokenizer.json unless the
    folder holds a slow tokenizer's vocabulary instead."""
    folder = Path(folder)
    for name in TOKENIZER_JSON_FILES:
        if (folder / name).exists():
            check_file(folder / name, JSON, remedy)
    if (folder / "tokenizer.json").exists() or not any(any(folder.glob(pattern)) for pattern in SLOW_TOKENIZER_FILES):
        check_file(folder / "tokenizer.json", JSON, remedy)


def refuse_non_finite_weights(state, where: str | Path, remedy: str = DIVERGED) -> None:
    """Raise `DamagedFile` naming the tensors of `state` (a state dict: name -> tensor) that hold NaN or infinite
    values (saved after training diverged, or damaged): such a model translates every sentence as nothing, or as
    noise. `where` is the file or folder the message names."""
    import torch

    tensors = {name: tensor for name, tensor in state.items() if tensor.is_floating_point() and tensor.numel()}
    if not tensors:
        return
    # a tensor's min and max are finite iff all of it is (both propagate NaN): one read of the weights, where
    # isfinite().all() also writes a mask of each tensor's size (2-10x the time at load)
    finite = torch.stack([torch.stack(torch.aminmax(tensor)).isfinite().all() for tensor in tensors.values()])
    finite = finite.cpu()  # one device sync
    if finite.all():
        return
    bad = [name for name, ok in zip(tensors, finite.tolist()) if not ok]
    raise DamagedFile(where, f"holds NaN or infinite values in {len(bad)} of its {len(tensors)} tensors "
                             f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): the model would translate "
                             "nothing", remedy)


def write_failure(error: BaseException, folder: str | Path) -> str | None:
    """What a failed write into `folder` was, for a message that says what to do: a full disk or quota (an OSError of
    ENOSPC or EDQUOT, safetensors' "os error 28/122"), or PyTorch's zip writer stopping (its "inline_container" or
    "PytorchStreamWriter" errors, which give no cause); None for any other error."""
    folder = Path(folder)
    free = _free_space(folder)
    full_errors = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    text = str(error)
    if isinstance(error, OSError) and error.errno in full_errors or any(
            f"os error {number}" in text for number in full_errors):
        return f"the disk holding {folder} is full ({free} free; {text})"
    if "inline_container" in text or "PytorchStreamWriter" in text:
        if _nearly_full(folder):  # what PyTorch's writer does not say, the disk does
            return f"the disk holding {folder} is full ({free} free; PyTorch's writer stopped: {text})"
        return (f"PyTorch could not write into {folder} ({text}): its writer stops like this when the disk is full "
                f"({free} free there now)")
    return None


NEARLY_FULL_BYTES = 256 << 20  # less free than a checkpoint of this package's models takes: the disk is full


def _disk_usage(folder: Path):
    """`shutil.disk_usage` of the disk of `folder` (or of its nearest existing parent)."""
    return shutil.disk_usage(next((path for path in (folder, *folder.parents) if path.exists()), Path(os.sep)))


def _nearly_full(folder: Path) -> bool:
    usage = _disk_usage(folder)
    return usage.free < min(NEARLY_FULL_BYTES, usage.total // 100)


def _free_space(folder: Path) -> str:
    """The free space on the disk of `folder` (or of its nearest existing parent), as "12.5 MiB"."""
    free = float(_disk_usage(folder).free)
    for unit in ("bytes", "KiB", "MiB"):
        if free < 1024:
            return f"{free:,.0f} bytes" if unit == "bytes" else f"{free:,.1f} {unit}"
        free /= 1024
    return f"{free:,.1f} GiB"
