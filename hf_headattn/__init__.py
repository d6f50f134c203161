"""hf_headattn: neural machine translation models for Transformers whose attention is pluggable.

Commands (each with `--help` and `--version`; `python -m hf_headattn` lists them):
    hf-headattn-train, -translate, -evaluate, -average, -export, -plot, -hub, -demo, -app
Guides: README.md, then docs/ (installation, training, translating, evaluating, publishing, deploying, variants,
reproducing) in the repository.
Python: `HeadAttnConfig` / `HeadAttnForConditionalGeneration` (the Transformer), `HeadAttnRNNConfig` /
`HeadAttnRNNForConditionalGeneration` (the LSTM), `ATTENTION_VARIANTS` (the registry), the kernels `sparsemax`,
`csoftmax`, `csparsemax`, `entmax15`, `entmax_bisect`, and `hf_headattn.translation.translate` (a model) and
`load_translator` (a model or a CTranslate2 export, one translator).

The package's names load on first use (a module-level `__getattr__`, as Transformers does), so
`import hf_headattn` and every command's `--help` start without importing torch, Transformers, datasets,
sacrebleu or matplotlib. The first model class used also registers both families with the Auto classes
(`hf_headattn.auto_classes`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version as _installed_version
from typing import TYPE_CHECKING

try:
    __version__ = _installed_version("hf_headattn")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.1.0+unknown"

# public name -> the submodule that defines it
_LAZY_ATTRIBUTES = {
    "SITES": ".runtime.attention_base",
    "AttentionMask": ".runtime.attention_base",
    "AttentionResult": ".runtime.attention_base",
    "AttentionVariant": ".runtime.attention_base",
    "ATTENTION_VARIANTS": ".runtime.attention_registry",
    "register_attention_functions": ".runtime.attention_functions",
    "get_attention_variant": ".runtime.attention_registry",
    "HeadAttnCache": ".runtime.cache_headattn",
    "HeadAttnConfig": ".runtime.configuration_headattn",
    "HeadAttnRNNConfig": ".runtime.configuration_headattn_rnn",
    "HeadAttnForConditionalGeneration": ".runtime.modeling_headattn",
    "HeadAttnModel": ".runtime.modeling_headattn",
    "HeadAttnPreTrainedModel": ".runtime.modeling_headattn",
    "HeadAttnSeq2SeqLMOutput": ".runtime.modeling_headattn",
    "HeadAttnSeq2SeqModelOutput": ".runtime.modeling_headattn",
    "HeadAttnRNNForConditionalGeneration": ".runtime.modeling_headattn_rnn",
    "HeadAttnRNNModel": ".runtime.modeling_headattn_rnn",
    "HeadAttnRNNPreTrainedModel": ".runtime.modeling_headattn_rnn",
    "coverage_penalty": ".runtime.modeling_headattn_rnn",
    "TranslationPipeline": ".runtime.pipeline_headattn",
    "csoftmax": ".runtime.sparse_attention",
    "csparsemax": ".runtime.sparse_attention",
    "entmax15": ".runtime.sparse_attention",
    "entmax_bisect": ".runtime.sparse_attention",
    "sparsemax": ".runtime.sparse_attention",
    "train_tokenizer": ".tokenization",
}

__all__ = sorted(_LAZY_ATTRIBUTES)


def __getattr__(name: str):
    if name not in _LAZY_ATTRIBUTES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_ATTRIBUTES[name], __name__), name)
    # whoever uses a model class from the package expects the Auto classes to know it, as before lazy loading
    importlib.import_module(".auto_classes", __name__)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_ATTRIBUTES))


if TYPE_CHECKING:  # what static analysers and IDEs see
    from .runtime.attention_base import SITES, AttentionMask, AttentionResult, AttentionVariant
    from .runtime.attention_functions import register_attention_functions
    from .runtime.attention_registry import ATTENTION_VARIANTS, get_attention_variant
    from .runtime.cache_headattn import HeadAttnCache
    from .runtime.configuration_headattn import HeadAttnConfig
    from .runtime.configuration_headattn_rnn import HeadAttnRNNConfig
    from .runtime.modeling_headattn import (
        HeadAttnForConditionalGeneration,
        HeadAttnModel,
        HeadAttnPreTrainedModel,
        HeadAttnSeq2SeqLMOutput,
        HeadAttnSeq2SeqModelOutput,
    )
    from .runtime.modeling_headattn_rnn import (
        HeadAttnRNNForConditionalGeneration,
        HeadAttnRNNModel,
        HeadAttnRNNPreTrainedModel,
        coverage_penalty,
    )
    from .runtime.pipeline_headattn import TranslationPipeline
    from .runtime.sparse_attention import csoftmax, csparsemax, entmax15, entmax_bisect, sparsemax
    from .tokenization import train_tokenizer
