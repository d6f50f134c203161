"""The stateless attention variants as Transformers attention functions, for any model that calls
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` (Marian, BART, Llama, Qwen2, T5 from Transformers 5.15, ...):

    register_attention_functions()
    model = MarianMTModel.from_pretrained(name, attn_implementation="headattn_sparsemax")

- `headattn_sparsemax`: sparsemax(Q K^T * scaling + bias) V (Malaviya et al., Eq. 3), exact zeros on low-scoring
  keys, at every attention of the model.
- `headattn_entmax15`: 1.5-entmax(Q K^T * scaling + bias) V (Peters et al., 2019), exact zeros on low-scoring keys
  with a smoother support than sparsemax's, at every attention of the model.
- `headattn_mma`: mixed multi-head self-attention (Cui et al., 2019): softmax with each head's mask (global, local
  |i - j| <= window, forward j >= i, backward j <= i), its options from the model config's `headattn_mma` dict
  (`{"window": 1, "head_kinds": [...]}`), by default window 1 and the paper's split of the heads into four equal
  groups. A causal attention cannot have forward heads (they would see nothing), so a decoder needs `head_kinds`; a
  cross-attention has no positions in common with its queries, so a model with one (encoder-decoders) is refused at
  its first cross-attention call, naming the model and the site.

All three take the mask as Transformers builds it for eager attention (float, 0 / finfo.min, with any bias the model adds
in it) or for sdpa (bool, True = attend; the mask function registered with them never leaves a causal mask to
`is_causal`), the model's `position_bias` (T5's relative bias) and grouped key/value heads (`num_key_value_groups`).

The other variants cannot be attention functions (`NOT_REGISTERED` says why): csoftmax, csparsemax and running_sum keep
per-step state across decoding steps, which an attention function has nowhere to keep nor beam search to reorder;
dhicm and multihop change the module (new weights after the heads), not the function, and so does entmax_alpha (a
learned alpha per head).
"""

from typing import TYPE_CHECKING

import torch
from torch import nn

from .attention_backends import to_additive
from .attention_base import DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION
from .attention_mma import HeadKindMask, MixedMultiHeadAttention, default_head_kinds
from .sparse_attention import entmax15, sparsemax
# Transformers before 5.10 copies into its modules cache only the direct imports of a module loaded through
# `get_class_from_dynamic_module` (as this one is: `attention_functions.register_attention_functions`), so it also
# imports the modules its imports need (tests/test_attention_versions.py loads it so on 5.0 and 5.9).
from .sparse_solvers import solve_sparsemax  # noqa: F401

if TYPE_CHECKING:  # named, never imported: sparse_attention imports it only where a Triton kernel runs
    from .triton_kernels import constrained_scan  # noqa: F401


PREFIX = "headattn_"
MMA_OPTIONS_FIELD = "headattn_mma"  # the config field headattn_mma reads its options from
NOT_REGISTERED = {
    "csoftmax": "it keeps each source token's cumulative attention from one decoding step to the next (and needs the "
                "source fertilities), which an attention function has nowhere to keep nor beam search to reorder",
    "csparsemax": "it keeps each source token's cumulative attention from one decoding step to the next (and needs "
                  "the source fertilities), which an attention function has nowhere to keep nor beam search to reorder",
    "running_sum": "it keeps the coverage from one decoding step to the next, which an attention function has nowhere "
                   "to keep nor beam search to reorder",
    "dhicm": "it changes the attention module, not the function: a second attention over the heads' outputs (new "
             "weights U, V, W, W_s) replaces the output projection",
    "multihop": "it changes the attention module, not the function: its further hops re-weigh the heads' contexts "
                "with new per-head weights",
    "entmax_alpha": "it changes the attention module, not the function: each head learns its own alpha (a new "
                    "weight per head); with a fixed alpha of 1.5 it is headattn_entmax15",
    "softmax": "it is Transformers' own eager / sdpa attention",
}


def describe_module(module: nn.Module) -> str:
    """`module` as "the <model type> model's <class> (layer n)", for error messages."""
    model_type = getattr(getattr(module, "config", None), "model_type", None) or "model"
    layer = getattr(module, "layer_idx", None)
    return f"the {model_type} model's {type(module).__name__}" + (f" (layer {layer})" if layer is not None else "")


def _is_causal(module: nn.Module, is_causal) -> bool:
    return bool(is_causal) if is_causal is not None else bool(getattr(module, "is_causal", False))


def _is_cross_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, causal: bool) -> bool:
    """Whether the call attends from one sequence to another. Models say it differently: a `site` (this package's
    variants), `is_cross_attention`, or, in the BART family and T5, a decoder attention that is not causal."""
    site = getattr(module, "site", None)
    if isinstance(site, str):
        return site not in (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    declared = getattr(module, "is_cross_attention", None)
    if isinstance(declared, bool):
        return declared
    if getattr(module, "is_decoder", False) and not causal:
        return True
    return not causal and query.shape[-2] != key.shape[-2]


def _refuse_unsupported(function: str, module: nn.Module, kwargs: dict) -> None:
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{function} does not cap scores (`softcap`), which {describe_module(module)} asks for")
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError(f"{function} has no attention sinks, which {describe_module(module)} uses")


def _grouped_heads(module: nn.Module, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values repeated for grouped-query attention (`num_key_value_groups` query heads per key head)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def _scores_and_allowed(module, query, key, attention_mask, scaling, causal, kwargs):
    """Q K^T * scaling plus the model's biases (T5's `position_bias`, biases in a float mask), and the bool mask of
    allowed keys broadcastable to [batch, heads, queries, keys] (None: every key)."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        scores = scores + position_bias[..., : key.shape[-2]]
    num_queries, num_keys = query.shape[-2], key.shape[-2]
    if attention_mask is None:
        allowed = None
        if causal and num_queries > 1:  # queries are the last positions (cached ones come first)
            allowed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=query.device).tril(
                num_keys - num_queries)
        return scores, allowed
    if not torch.is_tensor(attention_mask) or attention_mask.dim() != 4:
        raise ValueError(f"{describe_module(module)} passed a {type(attention_mask).__name__} mask of "
                         f"{getattr(attention_mask, 'shape', '?')}; hf_headattn's attention functions take the 4-D "
                         "masks Transformers builds for eager or sdpa attention")
    attention_mask = attention_mask[..., :num_keys]  # a static cache's mask covers its unfilled slots too
    if attention_mask.dtype == torch.bool:
        return scores, attention_mask
    allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return scores + attention_mask.masked_fill(~allowed, 0).to(scores.dtype), allowed


def _sparse_attention_forward(name, transform, module, query, key, value, attention_mask, scaling, dropout, is_causal,
                              kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """`transform`(Q K^T * scaling + bias) V per head through this package's kernel (`name` for errors); returns the
    outputs [batch, queries, heads, head_dim] and the weights."""
    _refuse_unsupported(name, module, kwargs)
    key, value = _grouped_heads(module, key, value)
    scores, allowed = _scores_and_allowed(module, query, key, attention_mask, scaling, _is_causal(module, is_causal),
                                          kwargs)
    if allowed is not None:
        allowed = allowed.expand(scores.shape)
    weights = transform(scores, dim=-1, mask=allowed)
    dropped = nn.functional.dropout(weights, p=dropout, training=dropout > 0.0)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), weights


def sparsemax_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`headattn_sparsemax`: sparsemax(Q K^T * scaling + bias) V per head (Malaviya et al., Eq. 3), through this
    package's sparsemax kernel; returns the outputs [batch, queries, heads, head_dim] and the weights."""
    return _sparse_attention_forward("headattn_sparsemax", sparsemax, module, query, key, value, attention_mask,
                                     scaling, dropout, is_causal, kwargs)


def entmax15_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`headattn_entmax15`: 1.5-entmax(Q K^T * scaling + bias) V per head (Peters et al., 2019), through this
    package's entmax15 kernel; returns the outputs [batch, queries, heads, head_dim] and the weights."""
    return _sparse_attention_forward("headattn_entmax15", entmax15, module, query, key, value, attention_mask,
                                     scaling, dropout, is_causal, kwargs)


def mma_options(module: nn.Module, num_heads: int, causal: bool) -> tuple[int, tuple[str, ...]]:
    """(window, head kinds) of `headattn_mma` for `module`: the model config's `headattn_mma` dict, else window 1 and
    the paper's four equal groups; checked as the `mma` variant checks them."""
    options = getattr(module.config, MMA_OPTIONS_FIELD, None) or {}
    if not isinstance(options, dict) or set(options) - {"window", "head_kinds"}:
        raise ValueError(f"config.{MMA_OPTIONS_FIELD} of {describe_module(module)} must be a dict with `window` and "
                         f"`head_kinds` (both optional), got {options!r}")
    site = DECODER_SELF_ATTENTION if causal else ENCODER_SELF_ATTENTION
    try:
        MixedMultiHeadAttention.check_options(options, site=site, num_heads=num_heads, config=module.config)
    except ValueError as error:
        raise ValueError(f"headattn_mma in {describe_module(module)}, a {'causal ' if causal else ''}self-attention "
                         f"with {num_heads} heads: {error}. Set config.{MMA_OPTIONS_FIELD} = {{'window': 1, "
                         "'head_kinds': [...]}} (one of global, local, forward, backward per head; no forward heads "
                         "in a causal attention)") from error
    head_kinds = options.get("head_kinds")
    return options.get("window", 1), tuple(head_kinds if head_kinds is not None else default_head_kinds(num_heads))


def mma_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`headattn_mma`: softmax attention with each head's mask (Cui et al., Eq. 7-11) on top of the model's mask;
    returns the outputs [batch, queries, heads, head_dim] and the weights (exactly zero where a head may not look)."""
    _refuse_unsupported("headattn_mma", module, kwargs)
    causal = _is_causal(module, is_causal)
    if _is_cross_attention(module, query, key, causal):
        raise ValueError(
            f"headattn_mma cannot run in {describe_module(module)}, a cross-attention: mma's heads (a local window, "
            "forward, backward) are positions in the queries' own sequence, which a cross-attention's keys are not. "
            "Use headattn_mma in encoder-only or decoder-only models, or this package's HeadAttn models, where mma "
            "is placed per site (encoder_self_attention='mma')"
        )
    window, head_kinds = mma_options(module, query.shape[1], causal)
    key, value = _grouped_heads(module, key, value)
    scores, allowed = _scores_and_allowed(module, query, key, attention_mask, scaling, causal, kwargs)
    heads = HeadKindMask(head_kinds, window, query.shape[-2], key.shape[-2], query.device).dense()[None]
    allowed = heads if allowed is None else heads & allowed
    weights = torch.softmax(scores + to_additive(allowed, scores.dtype), dim=-1)
    dropped = nn.functional.dropout(weights, p=dropout, training=dropout > 0.0)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), weights


ATTENTION_FUNCTIONS = {
    f"{PREFIX}sparsemax": sparsemax_attention_forward,
    f"{PREFIX}mma": mma_attention_forward,
    f"{PREFIX}entmax15": entmax15_attention_forward,
}


def attention_function_mask(*args, **kwargs):
    """The mask Transformers builds for the functions above: sdpa's boolean mask, never left to `is_causal` (they
    read causality from the mask, as eager attention does)."""
    from transformers import masking_utils

    kwargs["allow_is_causal_skip"] = False
    return masking_utils.sdpa_mask(*args, **kwargs)


def register_attention_functions() -> tuple[str, ...]:
    """Register `ATTENTION_FUNCTIONS` (`headattn_sparsemax`, `headattn_mma`, `headattn_entmax15`) with Transformers'
    `AttentionInterface` (and their mask with its `AttentionMaskInterface`), so that any model built or loaded
    afterwards with `attn_implementation="headattn_sparsemax"` (or `set_attn_implementation`) runs them. Idempotent;
    returns the names."""
    from transformers import masking_utils
    from transformers.modeling_utils import AttentionInterface

    for name, function in ATTENTION_FUNCTIONS.items():
        AttentionInterface.register(name, function)
        masking_utils.AttentionMaskInterface.register(name, attention_function_mask)
    return tuple(ATTENTION_FUNCTIONS)


__all__ = ["ATTENTION_FUNCTIONS", "NOT_REGISTERED", "register_attention_functions"]
