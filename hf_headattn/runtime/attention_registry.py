"""The one map from attention-variant name to class. Adding a variant: one module, one line here."""

from typing import Any

from .attention_base import CROSS_ATTENTION, AttentionVariant
from .attention_dhicm import DynamicHeadImportanceAttention
from .attention_entmax import AlphaEntmaxAttention, Entmax15Attention
from .attention_mma import MixedMultiHeadAttention
from .attention_multihop import MultiHopAttention
from .attention_running_sum import RunningSumAttention
from .attention_softmax import SoftmaxAttention
from .attention_sparse import ConstrainedSoftmaxAttention, ConstrainedSparsemaxAttention, SparsemaxAttention


ATTENTION_VARIANTS: dict[str, type[AttentionVariant]] = {
    SoftmaxAttention.name: SoftmaxAttention,
    RunningSumAttention.name: RunningSumAttention,
    MixedMultiHeadAttention.name: MixedMultiHeadAttention,
    DynamicHeadImportanceAttention.name: DynamicHeadImportanceAttention,
    SparsemaxAttention.name: SparsemaxAttention,
    MultiHopAttention.name: MultiHopAttention,
    ConstrainedSoftmaxAttention.name: ConstrainedSoftmaxAttention,
    ConstrainedSparsemaxAttention.name: ConstrainedSparsemaxAttention,
    Entmax15Attention.name: Entmax15Attention,
    AlphaEntmaxAttention.name: AlphaEntmaxAttention,
}


def source_attention_transforms() -> tuple[str, ...]:
    """The variants the LSTM's source attention takes (its config's `attention_transform`), in registry order: those
    at cross-attention whose weights are a map of each query's scores (`normalize(scores, allowed)`: softmax,
    sparsemax, the entmax variants) or that bound them by the source fertilities (`needs_fertility`, with their
    `transform`: csoftmax, csparsemax)."""
    return tuple(name for name, variant in ATTENTION_VARIANTS.items() if CROSS_ATTENTION in variant.sites
                 and (callable(getattr(variant, "normalize", None)) or variant.needs_fertility))


def every_site_placement(name: str, num_heads: int) -> dict[str, Any]:
    """Config fields that place variant `name` at every site it declares (`sites`), each by its `placement`."""
    variant = get_attention_variant(name)
    return {site: variant.placement(site, num_heads) for site in variant.sites}


def get_attention_variant(name: str) -> type[AttentionVariant]:
    if name not in ATTENTION_VARIANTS:
        raise ValueError(
            f"Unknown attention variant {name!r}; registered variants are: {', '.join(sorted(ATTENTION_VARIANTS))}"
        )
    return ATTENTION_VARIANTS[name]
