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


__all__ = ["add_trust_remote_code_argument", "load_model_and_tokenizer", "remote_code_allowed"]

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


def load_model_and_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False):
    """(model in eval mode, tokenizer) of a saved folder or, with `trust_remote_code`, a Hub repository id; checked
    with :func:`remote_code_allowed` before anything is downloaded or run."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from . import auto_classes  # noqa: F401  (a folder's model type resolves as after `import hf_headattn` used to)

    allowed = remote_code_allowed(name_or_path, trust_remote_code)
    model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, trust_remote_code=allowed).eval()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=allowed)
    return model, tokenizer


def add_trust_remote_code_argument(parser: argparse.ArgumentParser) -> None:
    """The tools' ``--trust-remote-code`` flag (off by default)."""
    parser.add_argument("--trust-remote-code", action="store_true", help=TRUST_REMOTE_CODE_HELP)
