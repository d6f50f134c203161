"""Everything the tooling writes, written as a transaction: whole or not at all, with the permissions the user's
umask gives, replacing only what the same command wrote.

Folders (a trained model, an average, an export, a Space):

* `new_folder` — a context manager that checks the output (`check_output_folder`), removes this output's stale
  staging leftovers (`remove_stale_staging`), yields a new staging sibling (``runs/.avg.<random>.partial``), and
  when the block ends without an error records which command wrote it (`OUTPUT_RECORD`), gives every file the
  permissions open() would have (`with_default_permissions`: safetensors and tempfile write 0600), and puts it in
  the output's place (`replace_folder`).
* `check_output_folder` — ``--overwrite`` replaces only an empty folder or one the same command wrote (its
  record says so), never a folder that is, holds or lies inside one of the command's inputs.
* `replace_folder` — one atomic exchange (``renameat2(RENAME_EXCHANGE)`` on Linux), then the old folder is
  deleted. Killed at any moment, the path holds the old complete folder or the new complete one. Where the exchange
  is not available the swap is two renames, and a process killed between them leaves the old folder at
  ``runs/.de-en.replaced``, which `recover_interrupted_swap` puts back (or deletes once the new one is in place).

Files (translations, evaluation results, cards, plots, caches):

* `new_file` — a context manager yielding a text (or bytes) handle on a staging sibling (``.out.txt.<random>.partial``),
  renamed over the file when the block ends without an error, deleted otherwise.
* `write_text` — `new_file` for a string.

A staging folder or file is locked (flock) by the process writing it for as long as it writes it; the kernel drops
the lock of a killed process, so a later command can tell an interrupted write's leftovers (unlocked: removed at its
next start) from a write in progress (locked: left alone).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no flock, so leftovers are never taken for stale
    fcntl = None

logger = logging.getLogger(__name__)

__all__ = ["OUTPUT_RECORD", "TRAIN_COMMAND", "OutputExists", "OutputRefused", "check_output_folder", "new_file",
           "new_folder", "recover_interrupted_swap", "remove_stale_staging", "replace_folder", "sibling",
           "with_default_permissions", "write_record", "write_text", "written_by"]

OUTPUT_RECORD = ".hf_headattn_output.json"  # {"command": ..., "hf_headattn_version": ..., "written": ...}
TRAIN_COMMAND = "hf-headattn-train"  # the record of a training run's folder, which no other command replaces
_STAGING_NAME = r"\.{name}\.[a-z0-9_]{{8}}\.partial"  # tempfile's random part: 8 of [a-z0-9_]


class OutputRefused(ValueError):
    """An output that would delete or mix with something the command did not write; the message says what and
    what to do."""


class OutputExists(OutputRefused, FileExistsError):
    """An output that exists, without ``--overwrite``: caught as either kind of error."""


def sibling(output_dir: str | Path, role: str) -> Path:
    """``runs/de-en`` -> ``runs/.de-en.<role>``: a hidden neighbour of an output (its staging folder, the old
    folder moved aside, the training run's lock file), on the same file system so that renames between them are
    atomic."""
    output_dir = Path(output_dir).resolve()
    return output_dir.parent / f".{output_dir.name}.{role}"


def with_default_permissions(path: str | Path) -> Path:
    """`path` with the permissions open() or mkdir() would have given it under the user's umask: tempfile's
    staging files and folders and safetensors' weights are private (0600, 0700), and an output renamed into place
    from one would stay so, unreadable to the group and others where every other tool's output is not. A folder's
    whole tree gets them."""
    path = Path(path)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
    if path.is_dir() and not path.is_symlink():
        for root, folders, files in os.walk(path):
            for name in folders:
                os.chmod(os.path.join(root, name), 0o777 & ~umask)
            for name in files:
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o666 & ~umask)
    return path


# --- who wrote a folder ---------------------------------------------------------------------------------------------

def write_record(folder: str | Path, command: str) -> None:
    """Record in `folder` that `command` (``hf-headattn-average``, ...) wrote it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package_version = version("hf_headattn")
    except PackageNotFoundError:
        package_version = None
    (Path(folder) / OUTPUT_RECORD).write_text(json.dumps(
        {"command": command, "hf_headattn_version": package_version,
         "written": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=2) + "\n", encoding="utf-8")


def written_by(folder: str | Path) -> str | None:
    """The command `folder`'s record names, or None (no record, or one that cannot be read)."""
    try:
        command = json.loads((Path(folder) / OUTPUT_RECORD).read_text(encoding="utf-8"))["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return command if isinstance(command, str) else None


def check_output_folder(output_dir: str | Path, *, command: str, overwrite: bool,
                        inputs: Iterable[str | Path] = ()) -> None:
    """Refuse an output folder that `command` may not write (the module docstring says which).

    Raises:
        OutputRefused: the folder is, holds or lies inside an input; it is a file; or `overwrite` would replace a
            folder another command (or the user) wrote.
        OutputExists: it exists and not `overwrite` (a FileExistsError too).
    """
    output_dir = Path(output_dir)
    resolved = output_dir.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if resolved == source or resolved in source.parents:
            raise OutputRefused(f"{output_dir} {'is' if resolved == source else 'holds'} the input {given}: "
                                "writing there would delete it; choose a folder of its own")
        if source in resolved.parents:
            raise OutputRefused(f"{output_dir} lies inside the input {given}; choose a folder of its own")
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise OutputRefused(f"{output_dir} is a file, not a folder; choose another path")
    if not overwrite:
        raise OutputExists(f"{output_dir} exists; choose another folder or pass --overwrite to replace it")
    if not any(output_dir.iterdir()):
        return
    writer = written_by(output_dir)
    if writer != command:
        what = (f"has no {OUTPUT_RECORD} saying which command wrote it" if writer is None
                else "holds a training run" if writer == TRAIN_COMMAND else f"was written by {writer}")
        raise OutputRefused(f"--overwrite replaces only a folder {command} wrote, and {output_dir} {what}; delete it "
                            "yourself if you mean to, or choose another folder")


# --- staging and leftovers ------------------------------------------------------------------------------------------

def _lock(descriptor: int) -> bool:
    """Take the flock of an open file or folder without waiting; False if another process holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def remove_stale_staging(output: str | Path) -> list[Path]:
    """Remove the staging folders and files of `output` (``.NAME.<random>.partial`` beside it) that no process is
    writing: what a command killed while writing it left behind. Returns what was removed."""
    output = Path(output).resolve()
    if fcntl is None or not output.parent.is_dir():
        return []
    pattern = re.compile(_STAGING_NAME.format(name=re.escape(output.name)))
    removed = []
    for candidate in sorted(output.parent.iterdir()):
        if not pattern.fullmatch(candidate.name):
            continue
        try:
            descriptor = os.open(candidate, os.O_RDONLY)
        except OSError:  # removed meanwhile, or not ours to read
            continue
        try:
            if not _lock(descriptor):  # a write in progress
                continue
            if candidate.is_dir() and not candidate.is_symlink():
                shutil.rmtree(candidate)
            else:
                candidate.unlink()
            removed.append(candidate)
        finally:
            os.close(descriptor)
    for leftover in removed:
        logger.info(f"removed {leftover}, left by a command interrupted while writing {output}")
    return removed


def recover_interrupted_swap(output_dir: str | Path) -> None:
    """Undo what a two-rename swap killed between its renames left (`replace_folder`): the old folder moved aside
    goes back if the new one never took its place, and is deleted if it did."""
    output_dir = Path(output_dir).resolve()
    replaced = sibling(output_dir, "replaced")
    if not replaced.exists():
        return
    if output_dir.exists():
        shutil.rmtree(replaced)
    else:
        logger.warning(f"{output_dir}: a previous command was killed while replacing it; its previous contents are "
                       f"restored from {replaced}")
        os.rename(replaced, output_dir)


@contextlib.contextmanager
def new_folder(output_dir: str | Path, *, command: str, overwrite: bool = False,
               inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Write a folder as a transaction (the module docstring): yields the staging folder to write into; `output_dir`
    takes its place, recorded as `command`'s, when the block ends without an error. Raises what
    `check_output_folder` raises before anything is written."""
    output_dir = Path(output_dir)
    check_output_folder(output_dir, command=command, overwrite=overwrite, inputs=inputs)
    output_dir.resolve().parent.mkdir(parents=True, exist_ok=True)
    recover_interrupted_swap(output_dir)
    remove_stale_staging(output_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.resolve().name}.", suffix=".partial",
                                    dir=output_dir.resolve().parent))
    descriptor = os.open(staging, os.O_RDONLY)
    try:
        _lock(descriptor)
        yield staging
        write_record(staging, command)
        with_default_permissions(staging)
        replace_folder(output_dir, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def new_file(path: str | Path, *, binary: bool = False, encoding: str = "utf-8",
             newline: str | None = None) -> Iterator[IO]:
    """Write a file as a transaction (the module docstring): yields a handle (text, or bytes with `binary`) on a
    locked staging sibling, renamed over `path` with the default permissions when the block ends without an error,
    deleted otherwise. Opened at once, so an unwritable path fails before any work."""
    path = Path(path)
    remove_stale_staging(path)
    handle = tempfile.NamedTemporaryFile("wb" if binary else "w", encoding=None if binary else encoding,
                                         newline=None if binary else newline, dir=path.resolve().parent,
                                         delete=False, prefix=f".{path.name}.", suffix=".partial")
    try:
        _lock(handle.fileno())
        yield handle
        handle.flush()
        os.replace(with_default_permissions(handle.name), path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    finally:
        handle.close()


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all (`new_file`); returns the path."""
    with new_file(path) as handle:
        handle.write(text)
    return Path(path)


# --- the swap -------------------------------------------------------------------------------------------------------

def replace_folder(output_dir: str | Path, staging: str | Path) -> None:
    """Put the complete folder `staging` at `output_dir` in one step (module docstring), and delete the old one."""
    output_dir, staging = Path(output_dir).resolve(), Path(staging).resolve()
    if not output_dir.exists():
        os.rename(staging, output_dir)
        return
    if _exchange(staging, output_dir):
        shutil.rmtree(staging)  # now the old folder
        return
    replaced = sibling(output_dir, "replaced")
    os.rename(output_dir, replaced)
    os.rename(staging, output_dir)
    shutil.rmtree(replaced)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system or file system
    cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):  # not glibc >= 2.28 (macOS, Windows, musl)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: a kernel or file system without exchange
        return False
    raise OSError(error, f"cannot swap {first} and {second}: {os.strerror(error)}")
