"""The one map from attention-variant name to class. Adding a variant: one module, one line here."""

from .attention_base import AttentionVariant
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


def get_attention_variant(name: str) -> type[AttentionVariant]:
    if name not in ATTENTION_VARIANTS:
        raise ValueError(
            f"Unknown attention variant {name!r}; registered variants are: {', '.join(sorted(ATTENTION_VARIANTS))}"
        )
    return ATTENTION_VARIANTS[name]
