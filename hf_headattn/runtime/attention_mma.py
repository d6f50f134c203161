"""Mixed multi-head self-attention (Cui et al., 2019): every head gets a hard mask of one kind (Eq. 7) —
global (Eq. 8), local |i - j| <= w (Eq. 9), forward j >= i (Eq. 10) or backward j <= i (Eq. 11). No new
parameters: the per-head masks join the padding/causal mask in the form the attention backend takes (an additive
mask for eager and sdpa, a BlockMask for flex attention; see `attention_backends`)."""

import itertools

import torch

from .attention_base import (
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    AttentionMask,
    AttentionResult,
    AttentionVariant,
)


HEAD_KINDS = ("global", "local", "forward", "backward")


def default_head_kinds(num_heads: int) -> list[str]:
    """The paper's split: equal contiguous groups [global, local, forward, backward]."""
    group = num_heads // len(HEAD_KINDS)
    return [kind for kind in HEAD_KINDS for _ in range(group)]


class HeadKindMask:
    """The heads' masks of one MMA module for `num_queries` queries over `num_keys` keys, as the attention backends take
    them (`attention_backends.softmax_attention`): `dense()` for eager and sdpa, `allows` for flex attention's
    mask_mod. Query i sits at absolute position i + (num_keys - num_queries), so that decoding steps with a cache see
    the same masks as a full pass."""

    def __init__(self, head_kinds, window: int, num_queries: int, num_keys: int, device):
        self.key = ("mma", tuple(head_kinds), window)  # what layers sharing a forward pass share
        self.window = window
        self.num_queries, self.num_keys = num_queries, num_keys
        self.device = device
        # Filled run by run on the device rather than copied from a Python list: a copy from host memory waits for
        # the device to catch up, at every forward (and every decoding step).
        self.kinds = torch.empty(len(head_kinds), dtype=torch.long, device=device)
        start = 0
        for kind, run in itertools.groupby(head_kinds):
            stop = start + len(list(run))
            self.kinds[start:stop] = HEAD_KINDS.index(kind)
            start = stop

    def allows(self, head, query_position, key_position):
        """True where `head` may attend from `query_position` to `key_position` (tensors that broadcast together)."""
        kind = self.kinds[head]
        return (
            (kind == 0)  # global, Eq. 8
            | ((kind == 1) & ((query_position - key_position).abs() <= self.window))  # local, Eq. 9
            | ((kind == 2) & (key_position >= query_position))  # forward, Eq. 10
            | ((kind == 3) & (key_position <= query_position))  # backward, Eq. 11
        )

    def dense(self) -> torch.Tensor:
        """Bool [heads, queries, keys], True where the head may attend."""
        heads = torch.arange(len(self.kinds), device=self.device)[:, None, None]
        query_positions = torch.arange(self.num_keys - self.num_queries, self.num_keys, device=self.device)[:, None]
        key_positions = torch.arange(self.num_keys, device=self.device)[None, :]
        return self.allows(heads, query_positions, key_positions)


def head_kind_masks(head_kinds, window: int, num_queries: int, num_keys: int, device) -> torch.Tensor:
    """Bool [heads, queries, keys], True where the head may attend (`HeadKindMask.dense`)."""
    return HeadKindMask(head_kinds, window, num_queries, num_keys, device).dense()


class MixedMultiHeadAttention(AttentionVariant):
    name = "mma"
    description = "mixed multi-head self-attention: heads with global, local, forward and backward hard masks"
    paper = ("Cui, Iida, Hung, Utsuro & Nagata (2019), *Mixed Multi-Head Self-Attention for Neural Machine "
             "Translation*: `mma`, heads with global, local, forward and backward hard masks.")
    options = {"window": 1, "head_kinds": None}
    sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    prunable = False  # each head's mask kind is tied to its index
    per_head_masks = True

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

    @classmethod
    def placement(cls, site, num_heads):
        """The paper's four groups, with backward heads for the forward ones at the causal decoder, which cannot
        have forward heads."""
        if site != DECODER_SELF_ATTENTION:
            return cls.name
        kinds = ["backward" if kind == "forward" else kind for kind in default_head_kinds(num_heads)]
        return {"type": cls.name, "head_kinds": kinds}

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
        # Built once per forward pass and shared by every MMA layer with the same heads and window (the lengths are the
        # same for every layer that shares `attention_mask`).
        head_mask = HeadKindMask(self.head_kinds, self.window, query.shape[-2], key.shape[-2], query.device)
        output, weights = self.softmax_heads(query, key, value, attention_mask, output_attentions, head_mask=head_mask)
        return AttentionResult(output=output, weights=weights)
