"""Mixed multi-head self-attention (Cui et al., 2019): every head gets a hard mask of one kind (Eq. 7) —
global (Eq. 8), local |i - j| <= w (Eq. 9), forward j >= i (Eq. 10) or backward j <= i (Eq. 11). No new
parameters: the per-head masks join the padding/causal mask into one additive mask for the fused kernel."""

import torch

from .attention_base import (
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    AttentionMask,
    AttentionResult,
    AttentionVariant,
    dot_product_attention,
    to_additive,
)


HEAD_KINDS = ("global", "local", "forward", "backward")


def default_head_kinds(num_heads: int) -> list[str]:
    """The paper's split: equal contiguous groups [global, local, forward, backward]."""
    group = num_heads // len(HEAD_KINDS)
    return [kind for kind in HEAD_KINDS for _ in range(group)]


def head_kind_masks(head_kinds, window: int, num_queries: int, num_keys: int, device) -> torch.Tensor:
    """Bool [heads, queries, keys], True where the head may attend. Query i sits at absolute position
    i + (num_keys - num_queries), so that decoding steps with a cache see the same masks as a full pass."""
    query_positions = torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]
    key_positions = torch.arange(num_keys, device=device)[None, :]
    by_kind = {
        "global": torch.ones(num_queries, num_keys, dtype=torch.bool, device=device),  # Eq. 8
        "local": (query_positions - key_positions).abs() <= window,  # Eq. 9
        "forward": key_positions >= query_positions,  # Eq. 10
        "backward": key_positions <= query_positions,  # Eq. 11
    }
    return torch.stack([by_kind[kind] for kind in head_kinds])


class MixedMultiHeadAttention(AttentionVariant):
    name = "mma"
    options = {"window": 1, "head_kinds": None}
    sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    prunable = False  # each head's mask kind is tied to its index

    def __init__(self, config, site, layer_idx, num_heads, head_dim, **options):
        super().__init__(config, site, layer_idx, num_heads, head_dim, **options)
        self.head_kinds = tuple(self.head_kinds) if self.head_kinds is not None else tuple(default_head_kinds(num_heads))

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        window = options.get("window", cls.options["window"])
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"mma option `window` must be a non-negative integer (the paper's best is 1), got {window!r}")
        head_kinds = options.get("head_kinds")
        if head_kinds is None:
            if num_heads % len(HEAD_KINDS) != 0:
                raise ValueError(
                    f"mma splits heads equally into {', '.join(HEAD_KINDS)}, but {num_heads} heads are not divisible "
                    f"by 4 at `{site}`; give `head_kinds`, a list of {num_heads} kinds"
                )
            head_kinds = default_head_kinds(num_heads)
        elif not isinstance(head_kinds, (list, tuple)) or len(head_kinds) != num_heads:
            raise ValueError(
                f"mma option `head_kinds` must list one kind per head ({num_heads} at `{site}`), got {head_kinds!r}"
            )
        unknown = sorted({kind for kind in head_kinds if kind not in HEAD_KINDS}, key=str)
        if unknown:
            raise ValueError(f"Unknown mma head kind(s) {unknown}; accepted: {', '.join(HEAD_KINDS)}")
        if site == DECODER_SELF_ATTENTION and "forward" in head_kinds:
            raise ValueError(
                "mma at `decoder_self_attention` cannot have 'forward' heads: a forward head attends to later "
                "positions (j >= i), which the causal decoder never sees, so its rows would be empty; use global, "
                "local or backward heads (give `head_kinds`)"
            )

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
        num_queries, num_keys = query.shape[-2], key.shape[-2]

        def combined_mask():
            allowed = head_kind_masks(self.head_kinds, self.window, num_queries, num_keys, query.device)[None]
            if attention_mask.allowed is not None:
                allowed = allowed & attention_mask.allowed
            return to_additive(allowed, query.dtype)

        # Built once per forward pass and shared by every MMA layer with the same heads and window. (The lengths are
        # the same for every layer that shares `attention_mask`, so they are not part of the key; under torch.export
        # they may be symbolic, which cannot be hashed.)
        additive = attention_mask.derived(("mma", self.head_kinds, self.window, query.dtype), combined_mask)
        output, weights = dot_product_attention(
            query,
            key,
            value,
            additive,
            self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            need_weights=output_attentions,
            use_sdpa=self.config._attn_implementation != "eager",
        )
        return AttentionResult(output=output, weights=weights)
