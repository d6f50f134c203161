"""Standard scaled dot-product attention (Vaswani et al., 2017, Eq. 1), the default at every site."""

import torch

from .attention_base import AttentionMask, AttentionResult, AttentionVariant, dot_product_attention


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
        output_head_importances: bool = False,
    ) -> AttentionResult:
        use_sdpa = self.config._attn_implementation != "eager" and not output_attentions
        use_causal_kernel = use_sdpa and attention_mask.is_causal and query.shape[-2] == key.shape[-2]
        output, weights = dot_product_attention(
            query,
            key,
            value,
            None if use_causal_kernel else attention_mask.additive(query.dtype),
            self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            need_weights=output_attentions,
            use_sdpa=use_sdpa,
            is_causal=use_causal_kernel,
        )
        return AttentionResult(output=output, weights=weights)
