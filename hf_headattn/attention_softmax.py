"""Standard scaled dot-product attention (Vaswani et al., 2017, Eq. 1), the default at every site."""

import torch
from torch import nn

from .attention_base import AttentionMask, AttentionResult, AttentionVariant, masked_softmax_attention


class SoftmaxAttention(AttentionVariant):
    """softmax(Q K^T / sqrt(d_k)) V per head. Uses PyTorch's fused SDPA kernel unless the config asks for
    the eager implementation or the caller wants the attention weights (which SDPA does not return)."""

    name = "softmax"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: AttentionMask,
        *,
        hidden_states: torch.Tensor,
        state=None,
        output_attentions: bool = False,
        output_diagnostics: bool = False,
    ) -> AttentionResult:
        dropout = self.dropout if self.training else 0.0
        if output_attentions or self.config._attn_implementation == "eager":
            output, weights = masked_softmax_attention(
                query, key, value, attention_mask, self.scaling, dropout, self.training
            )
            return AttentionResult(output=output, weights=weights if output_attentions else None)
        use_causal_kernel = attention_mask.is_causal and query.shape[-2] == key.shape[-2]
        output = nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=None if use_causal_kernel else attention_mask.additive(query.dtype),
            dropout_p=dropout,
            is_causal=use_causal_kernel,
            scale=self.scaling,
        )
        return AttentionResult(output=output.transpose(1, 2))
