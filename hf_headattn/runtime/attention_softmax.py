"""Standard scaled dot-product attention (Vaswani et al., 2017, Eq. 1), the default at every site."""

import torch

from .attention_base import AttentionMask, AttentionResult, AttentionVariant


class SoftmaxAttention(AttentionVariant):
    """softmax(Q K^T / sqrt(d_k)) V per head. Uses PyTorch's fused SDPA kernel unless the config asks for
    the eager implementation or the caller wants the attention weights (which SDPA does not return)."""

    name = "softmax"
    no_attention_function = "it is Transformers' own eager / sdpa attention"
    description = "scaled dot-product attention, softmax over the keys (Vaswani et al., 2017)"
    exportable = True

    def normalize(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """softmax over the keys `allowed` lets through (float32 for half-precision scores), for the LSTM's source
        attention (`attention_registry.source_attention_transforms`); this module's own attention goes through
        `softmax_heads`."""
        scores = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=-1)

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
        output, weights = self.softmax_heads(query, key, value, attention_mask, output_attentions)
        return AttentionResult(output=output, weights=weights)
