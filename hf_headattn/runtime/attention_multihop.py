"""Multi-hop attention over heads (Iida et al., 2019, "Attention over Heads"). The first hop is ordinary
multi-head attention: head k's query s^(k) gives its context c^(k) (Eq. 1-2). Each further hop re-weighs the
heads' contexts:

- dependent (Eq. 7-9): e^(k) = v_b^T tanh(W_b s^(k) + U_b^(k) c^(k)), with W_b and v_b shared by the heads,
  beta = softmax over the heads of e (Eq. 8, as corrected), c'^(k) = beta^(k) U_c^(k) c^(k);
- independent (Eq. 19): c'^(k) = U_c^(k) c^(k).

`HeadHops` is the second-level computation, shared by the Transformer cross-attention variant `multihop` below
(per-head size d_k) and by the LSTM encoder-decoder's source attention (`modeling_headattn_rnn.py`, size d).
A dependent hop adds (2N + 1) d^2 + d weights, an independent one N d^2 (no biases).
"""

import torch
from torch import nn

from .attention_base import CROSS_ATTENTION, AttentionMask, AttentionResult, AttentionVariant, ConfigFieldError


HOP_MODES = ("dependent", "independent")
MULTIHOP_PAPER = ("Iida, Kimura, Cui, Hung, Utsuro & Nagata (2019), *A Multi-Hop Attention for RNN based Neural "
                  "Machine Translation*: multi-head source attention and second-level hops over the heads.")


def check_hop_mode(hop_mode) -> None:
    if hop_mode not in HOP_MODES:
        raise ConfigFieldError(f"Unknown `hop_mode` {hop_mode!r}; accepted: {', '.join(HOP_MODES)}", "hop_mode")


class HeadHops(nn.Module):
    """`hops` second-level hops over the contexts of `num_heads` heads of size `dim`."""

    def __init__(self, num_heads: int, dim: int, hops: int, hop_mode: str, init_std: float = 0.02,
                 start_as_identity: bool = False):
        """start_as_identity: U_c^(k) starts as the identity times the inverse of the head weights at the start
        (N for dependent hops, whose beta is about 1/N while the scores are small; 1 for independent ones), so
        that each hop starts by passing the first hop's contexts on at their scale; otherwise every matrix is
        drawn from N(0, init_std^2)."""
        super().__init__()
        check_hop_mode(hop_mode)
        self.hops = hops
        self.hop_mode = hop_mode
        dependent = hop_mode == "dependent"

        def per_head_matrices():
            return nn.Parameter(torch.randn(num_heads, dim, dim) * init_std)

        def context_matrices():
            if not start_as_identity:
                return per_head_matrices()
            return nn.Parameter(torch.eye(dim).repeat(num_heads, 1, 1) * (num_heads if dependent else 1))

        self.u_c = nn.ParameterList([context_matrices() for _ in range(hops)])  # U_c^(k) (Eq. 9, 19)
        self.u_b = nn.ParameterList([per_head_matrices() for _ in range(hops)]) if dependent else None
        self.w_b = nn.ModuleList([nn.Linear(dim, dim, bias=False) for _ in range(hops)]) if dependent else None
        self.v_b = nn.ModuleList([nn.Linear(dim, 1, bias=False) for _ in range(hops)]) if dependent else None

    def forward(self, head_queries: torch.Tensor, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """head_queries s^(k) and contexts c^(k): [..., heads, dim]. Returns the last hop's contexts c'^(k)
        [..., heads, dim] and its head weights beta [..., heads] (None for independent hops or no hop)."""
        head_weights = None
        for hop in range(self.hops):
            projected = torch.einsum("...hd,hed->...he", contexts, self.u_c[hop])  # U_c^(k) c^(k)
            if self.hop_mode == "independent":
                contexts = projected  # Eq. 19
                continue
            keys = torch.einsum("...hd,hed->...he", contexts, self.u_b[hop])  # U_b^(k) c^(k)
            scores = self.v_b[hop](torch.tanh(self.w_b[hop](head_queries) + keys)).squeeze(-1)  # Eq. 7
            # Eq. 8, over the heads (half precision normalised in float32)
            head_weights = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
            contexts = head_weights.to(projected.dtype).unsqueeze(-1) * projected  # Eq. 9
        return contexts, head_weights


class MultiHopAttention(AttentionVariant):
    """Options: `hops` (K, the number of second-level hops after the first; 0 is plain multi-head attention)
    and `hop_mode` ("dependent" or "independent")."""

    name = "multihop"
    no_attention_function = ("it changes the attention module, not the function: its further hops re-weigh the "
                             "heads' contexts with new per-head weights")
    description = "multi-head cross-attention with second-level hops over the heads (Iida et al., 2019)"
    paper = MULTIHOP_PAPER
    weighs_heads = True
    options = {"hops": 1, "hop_mode": "dependent"}
    sites = (CROSS_ATTENTION,)
    prunable = False  # U_b and U_c are per head

    def __init__(self, config, site, layer_idx, num_heads, head_dim, **options):
        super().__init__(config, site, layer_idx, num_heads, head_dim, **options)
        # In a residual Transformer layer, random U_c (std init_std) would shrink the cross-attention output by
        # about beta * init_std * sqrt(d_k) (~35x at d_k = 32, 4 heads) and the decoder would learn to use the
        # source far more slowly; starting as the identity keeps softmax attention's scale.
        self.second_hops = HeadHops(num_heads, head_dim, self.hops, self.hop_mode, init_std=config.init_std,
                                    start_as_identity=True)

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        hops = options.get("hops", cls.options["hops"])
        if not isinstance(hops, int) or isinstance(hops, bool) or hops < 0:
            raise ValueError(f"multihop option `hops` must be an integer >= 0, got {hops!r}")
        check_hop_mode(options.get("hop_mode", cls.options["hop_mode"]))

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
        contexts, weights = self.softmax_heads(query, key, value, attention_mask, output_attentions)  # Eq. 2
        contexts, head_weights = self.second_hops(query.transpose(1, 2), contexts)  # s^(k): [batch, queries, heads, d_k]
        return AttentionResult(
            output=contexts,
            weights=weights,
            head_importances=head_weights if output_head_importances else None,
        )
