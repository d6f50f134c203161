"""Writing a command's output so that it appears whole or not at all, with the permissions the user's umask gives.

* `staging_folder` — a new sibling folder (``runs/.de-en.<random>.partial``) to write an output folder into;
  `with_default_permissions` gives a staged file or folder the permissions open() or mkdir() would have.
* `replace_folder` — puts the complete staging folder at the output's path in one atomic exchange
  (``renameat2(RENAME_EXCHANGE)`` on Linux) and deletes the old folder. Killed at any moment, the path holds the
  old complete folder or the new complete one. Where the exchange is not available the swap is two renames, and a
  process killed between them leaves the old folder at ``runs/.de-en.replaced`` (the training run's
  `run_folder.clean_leftovers` moves it back).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path


def sibling(output_dir: str | Path, role: str) -> Path:
    """``runs/de-en`` -> ``runs/.de-en.<role>``: a hidden neighbour of an output (its staging folder, the old
    folder moved aside, the training run's lock file), on the same file system so that renames between them are
    atomic."""
    output_dir = Path(output_dir).resolve()
    return output_dir.parent / f".{output_dir.name}.{role}"


def with_default_permissions(path: str | Path) -> Path:
    """`path` with the permissions open() or mkdir() would have given it under the user's umask: tempfile's
    staging files and folders are private (0600, 0700), and an output renamed into place from one would stay so,
    unreadable to the group and others where every other tool's output is not."""
    path = Path(path)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
    return path


def staging_folder(output_dir: Path) -> Path:
    """A new, uniquely named sibling folder (``runs/.de-en.<random>.partial``) that an output is written into and
    then renamed to `output_dir`, with the permissions a plain mkdir would give the output."""
    return with_default_permissions(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".partial",
                                                     dir=output_dir.parent))


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
