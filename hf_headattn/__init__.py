"""hf_headattn: Transformers-compatible NMT models with pluggable attention variants."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .runtime.attention_base import SITES, AttentionMask, AttentionResult, AttentionVariant
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
from .runtime.sparse_attention import csoftmax, csparsemax, sparsemax
from .tokenization import train_tokenizer


AutoConfig.register(HeadAttnConfig.model_type, HeadAttnConfig, exist_ok=True)
AutoModel.register(HeadAttnConfig, HeadAttnModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(HeadAttnConfig, HeadAttnForConditionalGeneration, exist_ok=True)
AutoConfig.register(HeadAttnRNNConfig.model_type, HeadAttnRNNConfig, exist_ok=True)
AutoModel.register(HeadAttnRNNConfig, HeadAttnRNNModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration, exist_ok=True)

__all__ = [
    "ATTENTION_VARIANTS",
    "SITES",
    "AttentionMask",
    "AttentionResult",
    "AttentionVariant",
    "HeadAttnCache",
    "HeadAttnConfig",
    "HeadAttnForConditionalGeneration",
    "HeadAttnModel",
    "HeadAttnPreTrainedModel",
    "HeadAttnRNNConfig",
    "HeadAttnRNNForConditionalGeneration",
    "HeadAttnRNNModel",
    "HeadAttnRNNPreTrainedModel",
    "HeadAttnSeq2SeqLMOutput",
    "HeadAttnSeq2SeqModelOutput",
    "TranslationPipeline",
    "coverage_penalty",
    "csoftmax",
    "csparsemax",
    "get_attention_variant",
    "sparsemax",
    "train_tokenizer",
]
