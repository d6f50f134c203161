"""A minimal stateful variant that exists to test the seam: softmax attention whose scores are lowered by
the attention each source position has already received, z'_t = z_t - penalty * beta_t with
beta_t = sum_{tau < t} alpha_tau (the cumulative attention of Malaviya et al., 2018, Sec. 3.2, used here as a
plain coverage penalty). Its output depends on every earlier decoding step, so any mistake in carrying or
beam-reordering the per-step state changes the translation. With `aux_weight` > 0 it also returns an auxiliary
loss per target token (aux_weight times the mean squared coverage after that token), which exercises the model's
auxiliary-loss path."""

import torch

from .attention_base import (
    CROSS_ATTENTION,
    AttentionMask,
    AttentionResult,
    AttentionVariant,
    check_number,
    unrolled_length,
)


class RunningSumAttention(AttentionVariant):
    name = "running_sum"
    description = ("the seam's test variant: softmax cross-attention lowered by the attention each source position "
                   "has already received")
    kernel = "running_sum"  # softmax whose scores change step by step with the coverage
    options = {"penalty": 1.0, "aux_weight": 0.0}
    sites = (CROSS_ATTENTION,)
    stateful = True
    no_attention_function = ("it keeps the coverage from one decoding step to the next, which an attention function "
                             "has nowhere to keep nor beam search to reorder")

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        # Any finite penalty (a negative one rewards attending again); the auxiliary loss is a penalty, so >= 0.
        check_number("running_sum option `penalty`", options.get("penalty", cls.options["penalty"]))
        check_number("running_sum option `aux_weight`", options.get("aux_weight", cls.options["aux_weight"]),
                     at_least=0)

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
        batch, heads, num_queries, _ = query.shape
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
        additive = attention_mask.additive(scores.dtype)
        if additive is not None:
            scores = scores + additive
        coverage = scores.new_zeros(batch, heads, key.shape[-2]) if state is None else state["coverage"]
        # The scores of step t depend on the attention of steps < t, so this loop over target positions is
        # inherent to the math; generation with a cache runs it once per step.
        step_weights, step_coverages = [], []
        for t in range(unrolled_length(num_queries, "running_sum attention's loop over target positions")):
            weights_t = torch.softmax(scores[:, :, t] - self.penalty * coverage, dim=-1)
            coverage = coverage + weights_t
            step_weights.append(weights_t)
            step_coverages.append(coverage)
        weights = torch.stack(step_weights, dim=2)
        aux_loss = None
        if self.aux_weight:
            aux_loss = self.aux_weight * torch.stack(step_coverages, dim=1).pow(2).mean(dim=(2, 3))
        output = torch.matmul(weights, value).transpose(1, 2)
        return AttentionResult(
            output=output,
            weights=weights if output_attentions else None,
            aux_loss=aux_loss,
            state={"coverage": coverage},
        )
