"""How the tools load a saved model, and when they let it run its own code.

A saved model of this package runs the Python files saved next to its weights (Transformers'
``trust_remote_code``). The tools (``hf_headattn.plotting``, ``examples/dhicm_head_pruning.py``, ...) load:

* a local folder without asking: the user named a path on their own disk, where its code can be read, and such
  folders are normally written by this package's training command;
* a Hugging Face Hub repository id only with ``--trust_remote_code`` (``trust_remote_code=True``): loading it
  downloads a stranger's code and runs it, which the user should decide after reading that repository's code.

(``hf_headattn.evaluation`` accepts local folders only.)

A folder's model and tokenizer belong together: a folder written by the training command records its tokenizer's
fingerprint in ``run_manifest.json``, and loading it with another tokenizer (``tokenizer=``, or tokenizer files
replaced in the folder) is refused, or only warned about with ``force``.

A local folder's files are checked before they are read (`saved_files`): a missing, empty or cut-short file is
refused naming it, and so are weights that hold NaN or infinite values, naming the tensors.

Which code runs: this package registers its model types with the Auto classes (`auto_classes`), and Transformers
then builds them from the installed package's runtime, not from the copy saved in the folder; a folder of another
model type runs its own code. Loading warns when the code that runs is the folder's copy and it differs from the
installed runtime.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .saved_files import (DIVERGED, check_model_folder, check_tokenizer_folder, refuse_non_finite_weights,
                          weights_files)

logger = logging.getLogger(__name__)


__all__ = ["DEVICES", "add_trust_remote_code_argument", "load_model_and_tokenizer", "remote_code_allowed", "resolve_device"]

DEVICES = ("auto", "cpu", "cuda")

TRUST_REMOTE_CODE_HELP = (
    "allow a Hugging Face Hub repository id to run the code it ships (read it first); local folders are "
    "trusted without this flag"
)


def remote_code_allowed(name_or_path: str | Path, trust_remote_code: bool = False) -> bool:
    """True if loading `name_or_path` may run its code: a local folder, or anything with `trust_remote_code`.

    Raises:
        ValueError: for a name that is not a local folder (so a Hub repository id, or a mistyped path) without
            `trust_remote_code`, naming it and the flag that allows it.
    """
    if Path(name_or_path).is_dir() or trust_remote_code:
        return True
    raise ValueError(
        f"{str(name_or_path)!r} is not a local folder, so it would be downloaded from the Hugging Face Hub and the "
        "Python code it ships would run on this machine. If you have read that repository's code and trust it, "
        "pass --trust_remote_code (trust_remote_code=True); if you meant a local folder, check the path."
    )


def load_model_and_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False,
                             tokenizer: str | Path | None = None, force: bool = False, **model_kwargs):
    """(model in eval mode, tokenizer) of a saved folder or, with `trust_remote_code`, a Hub repository id; checked
    with :func:`remote_code_allowed` before anything is downloaded or run. `tokenizer` names another tokenizer
    (folder or Hub id) than the model's own; one that is not the tokenizer the folder was trained with
    (:func:`check_tokenizer`) is refused, or with `force` warned about. `model_kwargs` go to the model's
    ``from_pretrained`` (e.g. ``dtype``).

    Raises:
        saved_files.DamagedFile (a ValueError): a local folder's file that is missing, empty or cut short, or
            weights that hold NaN or infinite values, named with what to do.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from . import auto_classes  # noqa: F401  (a folder's model type resolves as after `import hf_headattn` used to)

    allowed = remote_code_allowed(name_or_path, trust_remote_code)
    tokenizer_source = name_or_path if tokenizer is None else tokenizer
    tokenizer_allowed = allowed if tokenizer is None else remote_code_allowed(tokenizer, trust_remote_code)
    if Path(name_or_path).is_dir():
        check_model_folder(name_or_path)
    if Path(tokenizer_source).is_dir():
        check_tokenizer_folder(tokenizer_source)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=tokenizer_allowed)
    check_tokenizer(name_or_path, loaded_tokenizer, tokenizer_source, force=force)
    model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, trust_remote_code=allowed, **model_kwargs).eval()
    _refuse_non_finite_weights(model, name_or_path, model_kwargs.get("dtype"))
    report_code_differences(name_or_path, model)
    return model, loaded_tokenizer


def _refuse_non_finite_weights(model, name_or_path: str | Path, dtype) -> None:
    """`saved_files.refuse_non_finite_weights` on the loaded model, naming its weights file."""
    import torch

    files = weights_files(name_or_path) if Path(name_or_path).is_dir() else []
    remedy = DIVERGED
    if dtype not in (None, "auto", torch.float32):  # a weight beyond float16's range becomes infinite when cast
        remedy = (f"loaded as {str(dtype).removeprefix('torch.')}, which may not hold them: load it in float32, "
                  f"or {remedy}")
    refuse_non_finite_weights(model.state_dict(), files[0] if len(files) == 1 else name_or_path, remedy)


def check_tokenizer(model_dir: str | Path, tokenizer, tokenizer_source: str | Path, force: bool = False) -> None:
    """Refuse (ValueError) a tokenizer whose fingerprint is not the one `model_dir`'s run manifest records, or with
    `force` warn; nothing to compare for a folder without a manifest (not written by the training command, or a
    Hub id)."""
    from .training.run_manifest import read_manifest
    from .tokenization import tokenizer_fingerprint

    if not Path(model_dir).is_dir():
        return
    manifest = read_manifest(model_dir)
    if manifest is None:
        return
    recorded, given = manifest["identity"]["tokenizer"]["sha256"], tokenizer_fingerprint(tokenizer)
    if recorded == given:
        return
    message = (f"the tokenizer of {tokenizer_source} is not the one {model_dir} was trained with (fingerprint "
               f"{given[:12]}, its run_manifest.json records {recorded[:12]}): its token ids would mean other words "
               "to the model")
    if not force:
        raise ValueError(f"{message}; use the folder's own tokenizer, or --force to go on anyway")
    logger.warning(f"{message}; going on (--force)")


RUNTIME = Path(__file__).resolve().parent / "runtime"


def code_differences(model_dir: str | Path) -> list[str]:
    """The Python files saved in the folder `model_dir` that are not the installed package's runtime files byte for
    byte (or that it has no file of that name for): the code a user of the folder runs, through `trust_remote_code`,
    where it is not what this package runs."""
    return [path.name for path in sorted(Path(model_dir).glob("*.py"))
            if not (RUNTIME / path.name).is_file() or (RUNTIME / path.name).read_bytes() != path.read_bytes()]


def report_code_differences(model_dir: str | Path, model) -> None:
    """Warn, naming the files, when the loaded `model` runs its folder's own code (the runtime modules saved with it)
    and that code is not the installed package's runtime. A model of this package's types runs the installed
    runtime instead (`auto_classes` registers them), whatever its folder holds: nothing to warn about."""
    import inspect
    from importlib.metadata import version

    model_dir = Path(model_dir)
    if not model_dir.is_dir() or Path(inspect.getfile(type(model))).resolve().parent == RUNTIME:
        return
    differing = code_differences(model_dir)
    if differing:
        logger.warning(f"{model_dir}'s model code differs from the installed hf_headattn {version('hf_headattn')}'s "
                       f"runtime in {', '.join(differing)}: the model runs its own copy, saved with it by another "
                       "version of the package")


def resolve_device(device: str) -> "torch.device":
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` -> a torch device."""
    import torch

    if not isinstance(device, str) or not (device in DEVICES or device.startswith("cuda:")):
        raise ValueError(f"Unknown device {device!r}; accepted: auto, cpu, cuda, cuda:N")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} was asked for, but this PyTorch sees no CUDA device; use cpu or auto")
        resolved = torch.device(device)
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return resolved
    return torch.device("cpu")


def add_trust_remote_code_argument(parser: argparse.ArgumentParser, flag: str = "--trust_remote_code") -> None:
    """The tools' ``--trust_remote_code`` flag (off by default; `flag` spells it; an `UnderscoreArgumentParser` also
    takes ``--trust-remote-code``)."""
    parser.add_argument(flag, action="store_true", help=TRUST_REMOTE_CODE_HELP)
