"""hf_headattn: Transformers-compatible NMT models with pluggable attention variants."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .attention_base import SITES, AttentionMask, AttentionResult, AttentionVariant
from .attention_registry import ATTENTION_VARIANTS, get_attention_variant
from .cache_headattn import HeadAttnCache
from .configuration_headattn import HeadAttnConfig
from .modeling_headattn import (
    HeadAttnForConditionalGeneration,
    HeadAttnModel,
    HeadAttnPreTrainedModel,
    HeadAttnSeq2SeqLMOutput,
    HeadAttnSeq2SeqModelOutput,
)
from .pipeline_headattn import TranslationPipeline
from .sparse_attention import csoftmax, csparsemax, sparsemax
from .tokenization import train_tokenizer


AutoConfig.register(HeadAttnConfig.model_type, HeadAttnConfig, exist_ok=True)
AutoModel.register(HeadAttnConfig, HeadAttnModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(HeadAttnConfig, HeadAttnForConditionalGeneration, exist_ok=True)

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
    "HeadAttnSeq2SeqLMOutput",
    "HeadAttnSeq2SeqModelOutput",
    "TranslationPipeline",
    "csoftmax",
    "csparsemax",
    "get_attention_variant",
    "sparsemax",
    "train_tokenizer",
]
