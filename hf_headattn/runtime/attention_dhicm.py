"""Dynamic Head Importance Computation Mechanism (Goindani & Shrivastava, 2021): a second-level attention over
the heads' outputs. Each query token x weighs the per-head outputs O^h (before any output projection) by an
importance G(x, O^h) (Eq. 1-2) and the weighted sum, projected by V and W_s, replaces the concatenation and
output projection of multi-head attention (Eq. 3). Training adds -lambda * KL(G || uniform) (Eq. 4-5) so that
the importances do not go uniform.

Shapes: W, V in R^{d_m x d_k}, U in R^{d_m x d}, W_s in R^{d x d_m}, no biases (the paper's equations have
none), so a module adds exactly 2 d_m d_k + 2 d_m d weights ("dot" score; "mlp" adds a d_m score vector).
"""

import math

import torch
from torch import nn

from .attention_base import AttentionMask, AttentionResult, AttentionVariant, check_number


SCORES = ("dot", "mlp")


class DynamicHeadImportanceAttention(AttentionVariant):
    """Options:
    d_m: size of the second-level attention (default: the head dimension d_k).
    dropout: dropout after U x in Eq. 2 (default: the model's `dropout`).
    kl_weight: lambda of Eq. 5 (default 0.1, the paper's value).
    score: "dot", the paper's s(x, O^h) of Eq. 2, or "mlp", the additive score v^T tanh(W O^h + U x) of
        Bahdanau et al., the alternative the paper names in Sec. 2.1.
    """

    name = "dhicm"
    no_attention_function = ("it changes the attention module, not the function: a second attention over the heads' "
                             "outputs (new weights U, V, W, W_s) replaces the output projection")
    description = "a second-level attention over the heads' outputs (dynamic head importance), with a KL term"
    paper = ("Goindani & Shrivastava (2021), *A Dynamic Head Importance Computation Mechanism for Neural Machine "
             "Translation*: `dhicm`, a second-level attention over the heads' outputs with a KL term that keeps "
             "the head importances from being uniform.")
    weighs_heads = True
    options = {"d_m": None, "dropout": None, "kl_weight": 0.1, "score": "dot"}
    default_layers = (-1,)  # the paper's best placement: the last layer
    combines_heads = True
    weight_read_linears = ("w",)  # Eq. 2's W^T U x multiplies by W's matrix, once for all heads

    def __init__(self, config, site, layer_idx, num_heads, head_dim, **options):
        super().__init__(config, site, layer_idx, num_heads, head_dim, **options)
        self.d_m = self.d_m if self.d_m is not None else head_dim
        self.dropout = self.dropout if self.dropout is not None else config.dropout
        self.w = nn.Linear(head_dim, self.d_m, bias=False)  # W (Eq. 2)
        self.u = nn.Linear(config.d_model, self.d_m, bias=False)  # U (Eq. 2)
        self.v = nn.Linear(head_dim, self.d_m, bias=False)  # V (Eq. 3)
        self.w_s = nn.Linear(self.d_m, config.d_model, bias=False)  # W_s (Eq. 3)
        self.score_vector = nn.Linear(self.d_m, 1, bias=False) if self.score == "mlp" else None

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        d_m = options.get("d_m")
        if d_m is not None and (not isinstance(d_m, int) or isinstance(d_m, bool) or d_m < 1):
            raise ValueError(f"dhicm option `d_m` must be a positive integer or None (= head dimension), got {d_m!r}")
        dropout = options.get("dropout")
        if dropout is not None and (not isinstance(dropout, (int, float)) or isinstance(dropout, bool)
                                    or not 0.0 <= dropout < 1.0):
            raise ValueError(f"dhicm option `dropout` must be a number in [0, 1) or None (= the model's dropout), "
                             f"got {dropout!r}")
        check_number("dhicm option `kl_weight` (lambda of Eq. 5)", options.get("kl_weight", cls.options["kl_weight"]),
                     at_least=0)
        score = options.get("score", cls.options["score"])
        if score not in SCORES:
            raise ValueError(f"Unknown dhicm `score` {score!r}; accepted: {', '.join(SCORES)}")

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
        # O^h: [batch, queries, heads, d_k]
        head_outputs, weights = self.softmax_heads(query, key, value, attention_mask, output_attentions)
        projected_input = nn.functional.dropout(self.u(hidden_states), p=self.dropout, training=self.training)
        if self.score_vector is None:
            # Eq. 2, s = (O^h)^T W^T (U x) / sqrt(d_m); W^T U x is computed once for all heads.
            head_query = torch.matmul(projected_input, self.w.weight)
            scores = torch.einsum("bthd,btd->bth", head_outputs, head_query) / math.sqrt(self.d_m)
        else:
            # s = v^T tanh(W O^h + U x), the MLP alternative of Sec. 2.1
            hidden = torch.tanh(self.w(head_outputs) + projected_input.unsqueeze(2))
            scores = self.score_vector(hidden).squeeze(-1)
        # half-precision scores are normalised in float32
        log_importances = torch.log_softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
        importances = log_importances.exp()  # Eq. 1, G(x, O^h): [batch, queries, heads]
        # Eq. 3, W_s sum_h G_h V O^h; V is shared by the heads, so it is applied once after the weighted sum.
        combined = torch.einsum("bth,bthd->btd", importances.to(head_outputs.dtype), head_outputs)
        output = self.w_s(self.v(combined))
        # Eq. 4, KL(a || b) = sum_h a_h ln(a_h / b_h) with b_h = 1 / H
        head_kl = (importances * (log_importances + math.log(self.num_heads))).sum(-1)
        return AttentionResult(
            output=output,
            weights=weights,
            aux_loss=-self.kl_weight * head_kl,  # Eq. 5, L = L_ce - lambda * L_KL
            head_kl=head_kl,
            head_importances=importances if output_head_importances else None,
        )
