"""Sparse and constrained attention (Malaviya, Ferreira & Martins, 2018) as attention variants.

`sparsemax` (Eq. 3) replaces softmax at any site. `csoftmax` (Eq. 4) and `csparsemax` (Eq. 6) bound, at
cross-attention, the attention each source token may still receive: u_t = f - beta_t (Eq. 5), with f the
source token's fertility (computed by the encoder from the source ids, see `fertility.py`) and
beta_t = sum_{tau < t} alpha_tau its cumulative attention. beta is per layer and head; in training it is a scan
over target positions, in generation it lives in the cache so that beam search reorders it. A learned
<SINK> key with unbounded fertility (Sec. 4) keeps every step feasible; the exhaustion bonus z' = z + c u
(Sec. 4, c = 0.2) favours source tokens with credit left.
"""

import math

import torch
from torch import nn

from .attention_base import (
    CROSS_ATTENTION,
    AttentionMask,
    AttentionResult,
    AttentionVariant,
    check_number,
    unrolled_length,
)
from .sparse_attention import csoftmax, csparsemax, kernel_backend, sparsemax


MALAVIYA_2018 = ("Malaviya, Ferreira & Martins (2018), *Sparse and Constrained Attention for Neural Machine "
                 "Translation*: sparsemax, constrained softmax and constrained sparsemax attention with fertility "
                 "bounds, and the REP and DROP metrics.")


def with_sink_column(allowed: torch.Tensor) -> torch.Tensor:
    """A [..., sources] mask of allowed source tokens, extended by an always-allowed <SINK> column."""
    return torch.cat([allowed, allowed.new_ones(*allowed.shape[:-1], 1)], dim=-1)


def constrained_attention_step(transform, scores, fertility, cumulative, *, exhaustion, sink=False, allowed=None,
                               backend="auto"):
    """One decoding step of constrained attention: alpha_t = transform(z + c u, u) with u = max(f - beta, 0)
    (Eq. 5 and the exhaustion bonus of Sec. 4), `transform` being csoftmax (Eq. 4) or csparsemax (Eq. 6).

    scores z: [..., keys]; cumulative beta: [..., sources]; fertility f broadcasts to beta. With `sink`, the last
    key is the <SINK>, with unbounded fertility and no bonus (keys = sources + 1), and `allowed` (bool, True where
    a key may be attended) must include it (see `with_sink_column`). Returns alpha_t [..., keys]. Shared by the
    Transformer variants below and the LSTM model's source attention. Scores [batch, heads, keys] (the LSTM's
    decoding step) go, where `backend` (`sparse_attention.kernel_backend`) takes Triton, through the scan's kernel
    with one target position; other shapes, and the torch backend, through the transform itself."""
    if scores.dim() == 3 and _scan_backend(transform, scores, backend) == "triton":
        weights, _ = _triton_scan(transform, scores[:, :, None], fertility, cumulative, exhaustion=exhaustion,
                                  sink=sink, allowed=allowed)
        return weights[:, :, 0]
    bound = (fertility - cumulative).clamp(min=0.0)
    if sink:
        if exhaustion:
            scores = torch.add(scores, nn.functional.pad(bound, (0, 1)), alpha=exhaustion)
        bound = nn.functional.pad(bound, (0, 1), value=math.inf)
    elif exhaustion:
        scores = torch.add(scores, bound, alpha=exhaustion)
    return transform(scores, bound, dim=-1, mask=allowed)


def _scan_backend(transform, scores, backend):
    """The backend of a constrained scan or step: Triton's kernels exist for csoftmax and csparsemax only."""
    if transform is not csoftmax and transform is not csparsemax:
        return "torch"
    return kernel_backend(scores, backend, keys=scores.shape[-1])


def _triton_scan(transform, scores, fertility, cumulative, *, exhaustion, sink, allowed):
    from .triton_kernels import constrained_scan  # imports triton: only where a kernel runs

    return constrained_scan(scores, fertility, cumulative, allowed, exhaustion=exhaustion, sink=sink,
                            sparse=transform is csparsemax)


def constrained_attention_scan(transform, scores, fertility, *, exhaustion, sink, allowed, cumulative=None,
                               backend="auto"):
    """Constrained attention over every target position of a layer (Eq. 5): for t = 1..T,
    alpha_t = `constrained_attention_step`(z_t, beta_t) and beta_{t+1} = beta_t + alpha_t (its source keys).

    scores z: [batch, heads, targets, keys]; fertility f: [batch, 1 or heads, sources]; allowed: [batch, 1 or heads,
    keys] bool or None (with `sink`, its last column the <SINK>'s, see `with_sink_column`); cumulative: beta before
    the first position, [batch, heads, sources], None for zeros. Returns (weights [batch, heads, targets, keys],
    beta after the last position), in the scores' dtype, with gradients to the scores, the fertility and the
    starting cumulative attention.

    `backend` (`sparse_attention.kernel_backend`): "torch" loops over the positions in Python, one
    `constrained_attention_step` each (the reference, and the CPU's path); "triton" runs the loop as one kernel
    forward and one backward (`triton_kernels.constrained_scan`; csoftmax and csparsemax); "auto" takes Triton on
    CUDA where triton is installed, or where HF_HEADATTN_KERNELS=triton says so."""
    if _scan_backend(transform, scores, backend) == "triton":
        return _triton_scan(transform, scores, fertility, cumulative, exhaustion=exhaustion, sink=sink,
                            allowed=allowed)
    batch, heads, num_queries, keys = scores.shape
    num_sources = keys - 1 if sink else keys
    if cumulative is None:
        cumulative = scores.new_zeros(batch, heads, num_sources)
    # beta_t depends on every earlier step's attention, so this loop over target positions is inherent to the
    # math (Eq. 5); it is vectorised over batch, heads and source tokens.
    step_weights = []
    for t in range(unrolled_length(num_queries, "constrained attention's loop over target positions (Eq. 5)")):
        weights_t = constrained_attention_step(transform, scores[:, :, t], fertility, cumulative,
                                               exhaustion=exhaustion, sink=sink, allowed=allowed, backend="torch")
        cumulative = cumulative + weights_t[..., :num_sources]
        step_weights.append(weights_t)
    weights = step_weights[0][:, :, None] if num_queries == 1 else torch.stack(step_weights, dim=2)
    return weights, cumulative


class NormalizedAttention(AttentionVariant):
    """normalize(Q K^T / sqrt(d_k)) V per head: the variants that differ from softmax attention only in the map from
    a query's scores to its weights over the keys (`normalize`, masked keys exactly 0), and so share everything
    else: sparsemax here, entmax15 and entmax_alpha (attention_entmax.py)."""

    exact_zeros = True

    def normalize(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """Weights [batch, heads, queries, keys] of `scores` (same shape), over the keys `allowed` lets through."""
        raise NotImplementedError

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
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
        weights = self.normalize(scores, attention_mask.allowed)
        dropped = nn.functional.dropout(weights, p=self.attention_dropout, training=self.training)
        output = torch.matmul(dropped, value).transpose(1, 2)
        return AttentionResult(output=output, weights=weights if output_attentions else None)


class SparsemaxAttention(NormalizedAttention):
    """sparsemax(Q K^T / sqrt(d_k)) V per head (Eq. 3): exactly zero weight on low-scoring keys."""

    name = "sparsemax"
    description = "sparsemax over the keys: exactly zero weight on low-scoring keys (Malaviya et al., 2018)"
    paper = MALAVIYA_2018
    kernel = "sparsemax"

    def normalize(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        return sparsemax(scores, dim=-1, mask=allowed)  # Eq. 3


class ConstrainedAttention(AttentionVariant):
    """Shared by `csoftmax` and `csparsemax`. Options:
    exhaustion: c of z' = z + c u (0 turns the bonus off).
    sink: append a learned <SINK> key/value per head with unbounded fertility.

    Returned attention weights cover the source tokens only; a row's missing mass went to the sink."""

    exact_zeros = True

    options = {"exhaustion": 0.2, "sink": True}
    sites = (CROSS_ATTENTION,)
    stateful = True
    no_attention_function = ("it keeps each source token's cumulative attention from one decoding step to the next "
                             "(and needs the source fertilities), which an attention function has nowhere to keep "
                             "nor beam search to reorder")
    needs_fertility = True
    prunable = False  # the sink key and value are per head
    transform = None  # csoftmax or csparsemax, set by the subclasses

    def __init__(self, config, site, layer_idx, num_heads, head_dim, **options):
        super().__init__(config, site, layer_idx, num_heads, head_dim, **options)
        if self.sink:
            self.sink_key = nn.Parameter(torch.zeros(num_heads, head_dim))
            self.sink_value = nn.Parameter(torch.zeros(num_heads, head_dim))

    @classmethod
    def check_options(cls, options, *, site, num_heads, config):
        check_number(f"{cls.name} option `exhaustion` (c of z' = z + c u)",
                     options.get("exhaustion", cls.options["exhaustion"]), at_least=0)
        sink = options.get("sink", cls.options["sink"])
        if not isinstance(sink, bool):
            raise ValueError(f"{cls.name} option `sink` must be true or false, got {sink!r}")

    def cross_keys_and_values(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The source tokens' keys and values with the <SINK>'s appended (one more key a head), so that each step's
        scores and output take one product each."""
        if not self.sink:
            return key, value
        batch, heads, _, head_dim = key.shape
        sink_key = self.sink_key.to(key.dtype)[None, :, None, :].expand(batch, heads, 1, head_dim)
        sink_value = self.sink_value.to(value.dtype)[None, :, None, :].expand(batch, heads, 1, head_dim)
        return torch.cat([key, sink_key], dim=-2), torch.cat([value, sink_value], dim=-2)

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
        """key and value come from `cross_keys_and_values`: with the sink, their last key is the <SINK>'s."""
        if attention_mask.fertility is None:
            raise ValueError(f"{self.name} attention needs the source fertilities; the encoder computes them from "
                             "`input_ids` (encoder outputs made elsewhere must carry `fertility`)")
        num_sources = key.shape[-2] - 1 if self.sink else key.shape[-2]
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling  # z: [batch, heads, queries, keys]
        fertility = attention_mask.fertility[:, None, :].to(scores.dtype)  # f: [batch, 1, sources]
        allowed = None
        if attention_mask.allowed is not None:
            allowed = attention_mask.derived(  # [batch, 1, keys], made once a step for every layer
                ("constrained", self.sink),
                lambda: with_sink_column(attention_mask.allowed[:, :, 0, :]) if self.sink
                else attention_mask.allowed[:, :, 0, :])
        weights, cumulative = constrained_attention_scan(  # every target position; one in a generation step
            self.transform, scores, fertility, exhaustion=self.exhaustion, sink=self.sink, allowed=allowed,
            cumulative=None if state is None else state["cumulative"])
        source_weights = weights[..., :num_sources] if self.sink else weights
        if output_attentions and self.sink:
            # The returned source weights must be the tensor the output is computed from (not a slice taken beside
            # it), so that gradients reach them (retain_grad on outputs.cross_attentions).
            weights = torch.cat([source_weights, weights[..., num_sources:]], dim=-1)
        dropped = nn.functional.dropout(weights, p=self.attention_dropout, training=self.training)
        output = torch.matmul(dropped, value)  # the sink's share of the attention brings in its value
        return AttentionResult(
            output=output.transpose(1, 2),
            weights=source_weights if output_attentions else None,
            state={"cumulative": cumulative},
        )


class ConstrainedSoftmaxAttention(ConstrainedAttention):
    """Constrained softmax (Eq. 4): the distribution closest to softmax(z) in KL with alpha <= u."""

    name = "csoftmax"
    description = "constrained softmax: each source token's attention over time bounded by its fertility"
    paper = MALAVIYA_2018
    kernel = "csoftmax"
    transform = staticmethod(csoftmax)


class ConstrainedSparsemaxAttention(ConstrainedAttention):
    """Constrained sparsemax (Eq. 6): alpha = clip(z - tau, 0, u), sparse over source tokens and over time."""

    name = "csparsemax"
    description = "constrained sparsemax: sparse, each source token's attention over time bounded by its fertility"
    paper = MALAVIYA_2018
    kernel = "csparsemax"
    transform = staticmethod(csparsemax)
