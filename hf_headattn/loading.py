"""How the tools load a saved model, and when they let it run its own code.

A saved model of this package runs the Python files saved next to its weights (Transformers'
``trust_remote_code``). The tools (``hf_headattn.plotting``, ``examples/dhicm_head_pruning.py``, ...) load:

* a local folder without asking: the user named a path on their own disk, where its code can be read, and such
  folders are normally written by this package's training command;
* a Hugging Face Hub repository id only with ``--trust-remote-code`` (``trust_remote_code=True``): loading it
  downloads a stranger's code and runs it, which the user should decide after reading that repository's code.

(``hf_headattn.evaluation`` accepts local folders only.)

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path


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
        "pass --trust-remote-code (trust_remote_code=True); if you meant a local folder, check the path."
    )


def load_model_and_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False, **model_kwargs):
    """(model in eval mode, tokenizer) of a saved folder or, with `trust_remote_code`, a Hub repository id; checked
    with :func:`remote_code_allowed` before anything is downloaded or run. `model_kwargs` go to the model's
    ``from_pretrained`` (e.g. ``dtype``)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from . import auto_classes  # noqa: F401  (a folder's model type resolves as after `import hf_headattn` used to)

    allowed = remote_code_allowed(name_or_path, trust_remote_code)
    model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, trust_remote_code=allowed, **model_kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=allowed)
    return model, tokenizer


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


def add_trust_remote_code_argument(parser: argparse.ArgumentParser, flag: str = "--trust-remote-code") -> None:
    """The tools' ``--trust-remote-code`` flag (off by default; `flag` spells it)."""
    parser.add_argument(flag, action="store_true", help=TRUST_REMOTE_CODE_HELP)
