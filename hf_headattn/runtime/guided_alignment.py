"""Guided alignment (Garg et al., 2019, *Jointly Learning to Align and Translate with Transformer Models*): a cost
between the cross-attention of chosen heads and a word aligner's links, which the model adds to its loss.

The links come as `alignment_links` [batch, target_len, source_len]: for each target position (the decoder position
that predicts that label) a distribution over the source positions it is linked to, or a row of zeros where the
target token has no link (those positions are left out of the cost). `hf_headattn.training.data` builds it from
word links mapped to subwords.

The attention compared with the links is the mean over the guided heads of their weights over the source tokens
(`guided_attention`). For variants whose attention has exact zeros (sparsemax, entmax15, entmax_alpha, csoftmax,
csparsemax: `AttentionVariant.exact_zeros`, the LSTM's sparse transforms) it is instead the softmax of the same
heads' scores before the variant normalises them (z = q k / sqrt(d), over the source tokens). Why: at a zero the
cross-entropy is infinite, and with log(attention + eps) it is finite but useless: sparsemax's and entmax's Jacobians
vanish outside the support, so a link to a token outside the support sends no gradient to its score, and a head that
attends wholly elsewhere is never pulled to its link. softmax(z) has full support, so every link pulls its score up;
and sparsemax and entmax keep the order of the scores, so the token that softmax(z) peaks on is the one the sparse
attention peaks on: aligning softmax(z) aligns the argmax that `--alignments` reads. (For csoftmax and csparsemax
the fertility bounds may still move attention away from a token whose budget is spent.)

Costs (`GUIDED_ALIGNMENT_COSTS`), per aligned target position t with links q_t and attention a_t:
    "ce": KL(q_t || a_t) = -sum_j q_tj log(a_tj + eps) - H(q_t): Garg et al.'s cross-entropy less the links' own
        entropy, which the model cannot change (same gradient), so that the cost is 0 when attention equals the
        links' distribution. eps = 1e-9 only keeps an underflowed (float16) weight finite.
    "mse": sum_j (a_tj - q_tj)^2, Marian's squared error: bounded (at most 2), gentler than "ce" on far-off heads.
    "mult": -log(sum_{j linked} a_tj + eps), after Marian's "mult": minus the log of the attention on linked
        tokens; 0 when all of it is there, whatever its split between them.
The cost is summed over aligned target positions and divided by the batch's real target tokens (`alignment_loss`,
logged as is); the loss adds `guided_alignment_weight` times it, scaled as the cross-entropy is when Trainer
normalises by the tokens of the whole optimizer step (`weighted_for_step`), so gradient accumulation stays exact.

Runtime code: imports only torch and the runtime's own modules.
"""

import torch


GUIDED_ALIGNMENT_COSTS = {
    "ce": "KL(links || attention): Garg et al.'s cross-entropy less the links' entropy",
    "mse": "squared error between attention and links (Marian's mse)",
    "mult": "minus the log of the attention on linked source tokens (Marian's mult)",
}
DEFAULT_GUIDED_LAYER = -2  # Garg et al. supervise the penultimate decoder layer (a one-layer decoder: its only) ...
DEFAULT_GUIDED_HEADS = (0,)  # ... and one of its heads
_EPS = 1e-9


def check_guided_alignment_config(config, num_layers: int | None, num_heads: int, pruned_heads=()) -> None:
    """Raise ConfigFieldError, naming the field, its value and what is accepted, unless `config`'s guided-alignment
    fields are usable: a weight >= 0, a known cost, heads that are distinct indices below `num_heads` and not pruned, and
    (`num_layers` given: the Transformer's decoder layers) a layer in [-num_layers, num_layers)."""
    from .attention_base import ConfigFieldError, check_number

    check_number("`guided_alignment_weight`", config.guided_alignment_weight, at_least=0,
                 field="guided_alignment_weight")
    if config.guided_alignment_cost not in GUIDED_ALIGNMENT_COSTS:
        raise ConfigFieldError(f"Unknown guided_alignment_cost {config.guided_alignment_cost!r}; accepted: "
                               + "; ".join(f"{name!r} ({meaning})" for name, meaning in GUIDED_ALIGNMENT_COSTS.items()),
                               "guided_alignment_cost")
    if num_layers is not None and config.guided_alignment_layer is not None:
        layer = config.guided_alignment_layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not -num_layers <= layer < num_layers:
            raise ConfigFieldError(f"`guided_alignment_layer`={layer!r} is not a decoder layer: give an index in "
                                   f"[{-num_layers}, {num_layers}) (negative indices count from the top)",
                                   "guided_alignment_layer")
    heads = config.guided_alignment_heads
    if (not isinstance(heads, (list, tuple)) or not heads
            or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < num_heads for h in heads)
            or len(set(heads)) != len(heads)):
        raise ConfigFieldError(f"`guided_alignment_heads`={heads!r}: give a non-empty list of distinct "
                               f"cross-attention head indices in [0, {num_heads})", "guided_alignment_heads")
    removed = sorted(set(heads) & set(pruned_heads))
    if removed:
        raise ConfigFieldError(f"`guided_alignment_heads` {removed} of the guided layer were pruned "
                               "(`pruned_heads`); guide heads the model still has", "guided_alignment_heads",
                               "pruned_heads")


def scores_softmax(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dimension of `scores`, in float32, where `allowed` (bool, broadcastable) lets through."""
    scores = scores.float()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def guided_alignment_sum(attention: torch.Tensor, links: torch.Tensor, cost: str) -> torch.Tensor:
    """The cost summed over the aligned target positions of the batch (a float32 scalar).

    attention: [batch, heads, target, sources], the guided heads' distributions (`guided_attention`); averaged over
    heads. links: [batch, target, sources], each aligned row a distribution, unaligned rows all zero."""
    if links.dim() != 3 or tuple(links.shape) != (attention.shape[0], *attention.shape[2:]):
        raise ValueError(f"`alignment_links` has shape {tuple(links.shape)}; it must be [batch, target, source] = "
                         f"{(attention.shape[0], *attention.shape[2:])}, the labels' and the source's shapes")
    attention = attention.float().mean(dim=1)
    links = links.to(attention.device, torch.float32)
    aligned = links.sum(-1) > 0  # [batch, target]
    if cost == "ce":
        entropy = -torch.xlogy(links, links).sum(-1)
        per_position = -(links * torch.log(attention + _EPS)).sum(-1) - entropy
    elif cost == "mse":
        per_position = (attention - links).square().sum(-1)
    elif cost == "mult":
        per_position = -torch.log((attention * (links > 0)).sum(-1) + _EPS)  # the mass on linked tokens
    else:
        raise ValueError(f"Unknown guided_alignment_cost {cost!r}; accepted: {', '.join(GUIDED_ALIGNMENT_COSTS)}")
    return torch.where(aligned, per_position, 0.0).sum()


def guided_alignment_loss(attention, links, cost, labels) -> torch.Tensor:
    """The cost per real target token of the batch: `guided_alignment_sum` over the labels that are not -100."""
    return guided_alignment_sum(attention, links, cost) / labels.ne(-100).sum().clamp(min=1).to(attention.device)


def weighted_for_step(alignment_loss, weight, labels, num_items_in_batch=None) -> torch.Tensor:
    """What the loss adds: `weight` times the batch's per-token cost times the batch's share of the optimizer step's
    label tokens (`num_items_in_batch`), which makes it a sum over target tokens divided by the step's tokens, as
    `seq2seq_loss` divides the cross-entropy: gradient accumulation stays exact."""
    if num_items_in_batch is None:
        return weight * alignment_loss
    share = labels.ne(-100).sum().to(alignment_loss.device) / torch.as_tensor(num_items_in_batch).to(alignment_loss.device)
    return weight * share * alignment_loss


__all__ = ["GUIDED_ALIGNMENT_COSTS", "check_guided_alignment_config", "guided_alignment_loss", "guided_alignment_sum",
           "scores_softmax", "weighted_for_step"]
