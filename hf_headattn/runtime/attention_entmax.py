"""entmax attention: 1.5-entmax (Peters, Niculae & Martins, 2019) and alpha-entmax with alpha learned per head
(Correia, Niculae & Martins, 2019), in place of softmax at any site.

alpha-entmax maps scores z to p_j = [(alpha - 1) z_j - tau]_+^(1 / (alpha - 1)): alpha -> 1 is softmax, alpha = 2
sparsemax, and between them exact zeros on low-scoring keys with a smoother support than sparsemax's. `entmax15`
fixes alpha = 1.5 (an exact, sort-based kernel); `entmax_alpha` learns one alpha per head, so that each head finds
its own sparsity (Correia et al., Sec. 3), or takes a fixed `alpha`.
"""

import torch
from torch import nn

from .attention_base import check_number
from .attention_sparse import NormalizedAttention
from .sparse_attention import entmax15, entmax_bisect


PETERS_2019 = ("Peters, Niculae & Martins (2019), *Sparse Sequence-to-Sequence Models*: 1.5-entmax attention "
               "(`entmax15`), computed exactly by sorting.")
CORREIA_2019 = ("Correia, Niculae & Martins (2019), *Adaptively Sparse Transformers*: alpha-entmax attention with "
                "alpha learned per head in (1, 2] (`entmax_alpha`), through the gradient with respect to alpha.")

# Learned alphas stay at or above this: 1 + sigmoid(w) rounds to exactly 1 (softmax, outside the kernel's range) in
# float32 once w < -16.6, and the bisection's p = t^(1 / (alpha - 1)) loses precision as alpha nears 1.
LOWEST_LEARNED_ALPHA = 1.001


class Entmax15Attention(NormalizedAttention):
    """1.5-entmax(Q K^T / sqrt(d_k)) V per head: exact zeros on low-scoring keys, a wider support than sparsemax."""

    name = "entmax15"
    description = "1.5-entmax over the keys: sparse like sparsemax, smoother (Peters et al., 2019)"
    paper = PETERS_2019
    kernel = "entmax15"

    def normalize(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        return entmax15(scores, dim=-1, mask=allowed)


class AlphaEntmaxAttention(NormalizedAttention):
    """alpha-entmax(Q K^T / sqrt(d_k)) V per head (Correia et al., 2019). Options:
    alpha: None (the default) learns one alpha per head, alpha_h = 1 + sigmoid(w_h) from w_h = 0, i.e. 1.5 (the
        paper's map into (1, 2) and its start), kept at `LOWEST_LEARNED_ALPHA` or above; a number in (1, 2] fixes
        alpha for every head (2 is sparsemax)."""

    name = "entmax_alpha"
    no_attention_function = ("it changes the attention module, not the function: each head learns its own alpha (a "
                             "new weight per head); with a fixed alpha of 1.5 it is headattn_entmax15")
    description = "alpha-entmax over the keys, alpha learned per head in (1, 2] (Correia et al., 2019)"
    paper = CORREIA_2019
    kernel = "entmax_bisect"
    options = {"alpha": None}
    prunable = False  # each head's alpha is tied to its index

    def __init__(self, config, site, layer_idx, num_heads, head_dim, **options):
        super().__init__(config, site, layer_idx, num_heads, head_dim, **options)
        if self.alpha is None:
            self.alpha_logit = nn.Parameter(torch.zeros(num_heads))

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        alpha = options.get("alpha")
        if alpha is None:
            return
        check_number("entmax_alpha option `alpha` (null: learned per head)", alpha, above=1)
        if alpha > 2:
            raise ValueError(f"entmax_alpha option `alpha` must be a number in (1, 2] (2 is sparsemax; null: learned "
                             f"per head), got {alpha!r}")

    def head_alphas(self) -> torch.Tensor | float:
        """Each head's alpha ([heads], learned), or the fixed alpha."""
        if self.alpha is not None:
            return self.alpha
        return (1 + torch.sigmoid(self.alpha_logit)).clamp(min=LOWEST_LEARNED_ALPHA)

    def normalize(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        alpha = self.head_alphas()
        if torch.is_tensor(alpha):
            alpha = alpha[:, None, None]  # one per head, for every batch row and query
        return entmax_bisect(scores, alpha, dim=-1, mask=allowed)
