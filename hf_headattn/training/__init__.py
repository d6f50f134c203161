"""Training a translation model: the library of the training command (`hf-headattn-train`, commands/train.py).

Its names load on first use, so that importing one module (the run manifest, say) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_LAZY_ATTRIBUTES = {
    "DataArguments": ".arguments",
    "ModelArguments": ".arguments",
    "RunArguments": ".arguments",
    "parse_args": ".arguments",
    "checkpoint_folders": ".checkpoints",
    "load_hub_translation_dataset": ".data",
    "multi30k_paths": ".data",
    "tokenize_parallel": ".data",
    "TRAINING_PRESETS": ".presets",
    "run_training": ".run",
    "train": ".run",
    "HeadAttnSeq2SeqTrainer": ".trainer",
}

__all__ = sorted(_LAZY_ATTRIBUTES)


def __getattr__(name: str):
    if name not in _LAZY_ATTRIBUTES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_ATTRIBUTES[name], __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_ATTRIBUTES))


if TYPE_CHECKING:  # what static analysers and IDEs see
    from .arguments import DataArguments, ModelArguments, RunArguments, parse_args
    from .checkpoints import checkpoint_folders
    from .data import load_hub_translation_dataset, multi30k_paths, tokenize_parallel
    from .presets import TRAINING_PRESETS
    from .run import run_training, train
    from .trainer import HeadAttnSeq2SeqTrainer
