"""Softmax attention through Transformers' attention functions (`AttentionInterface`), as Transformers' own models run
it: the sites whose variant is a softmax computation (softmax, mma, and the first hop of dhicm and multihop) call
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` (`eager` is this module's `eager_attention_forward`), so that
`attn_implementation` in `from_pretrained` / `from_config` and `set_attn_implementation` pick `eager`, `sdpa`,
`flex_attention`, `flash_attention_*`, a `kernels` hub kernel or any function registered with
`AttentionInterface.register`.

Each backend gets the mask in the format Transformers' mask interface (`masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`)
gives it for that name:

- flash attention (and hub kernels registered with its mask function): the 2-D padding mask [batch, keys] and
  `is_causal`; one mask for every head, so per-head masks (mma) cannot run there (refused when the implementation is
  set, see `check_attention_implementation`);
- flex attention: a `BlockMask` built from the padding/causal mask and the per-head masks (`block_mask`);
- sdpa, eager and any other function: the additive mask (0 where allowed, finfo.min elsewhere) broadcastable to
  [batch, heads, queries, keys]; sdpa gets `is_causal=True` instead when the mask is exactly the causal triangle.

Everything here is built once per forward pass and shared by the layers (`AttentionMask.derived`). Transformers'
registries are imported where they are read: the configuration imports this module (through the variants), and
`hf-headattn-train --help` must not load `transformers.modeling_utils`.
"""

import functools

import torch
from torch import nn


EAGER = "eager"
SDPA = "sdpa"
ADDITIVE, BLOCK, PADDING = "additive", "block", "padding"  # the mask formats


def to_additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = may attend) as 0 / finfo(dtype).min scores; a finite minimum keeps fully masked rows free of
    NaN."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scaling + mask) V, Transformers' `eager` attention function: per-head outputs [B, Tq, H, D] and
    the weights [B, H, Tq, Tk]. `attention_mask` is additive, broadcastable to the scores."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    dropped = nn.functional.dropout(weights, p=dropout, training=dropout > 0.0)
    return torch.matmul(dropped, value).transpose(1, 2), weights


def registered_implementations() -> list[str]:
    """Every `attn_implementation` this release of Transformers accepts: eager and the registered functions."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return [EAGER, *(name for name in ALL_ATTENTION_FUNCTIONS.keys() if name != EAGER)]


def attention_function(implementation: str):
    """The attention function Transformers registered under `implementation` (`eager`: `eager_attention_forward`)."""
    if implementation is None or implementation == EAGER:
        return eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"attn_implementation={implementation!r} is not registered with Transformers' "
                         f"AttentionInterface; accepted: {', '.join(registered_implementations())}")
    return ALL_ATTENTION_FUNCTIONS[implementation]


def mask_format(implementation: str) -> str:
    """The mask an attention function takes, read from the mask function Transformers' mask interface registers for
    its name: PADDING (2-D, flash attention and kernels registered like it), BLOCK (flex attention's BlockMask) or
    ADDITIVE (eager, sdpa and any function registered without a mask function)."""
    from transformers import masking_utils

    mask_function = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.get(implementation)
    if mask_function is not None and mask_function is masking_utils.flash_attention_mask:
        return PADDING
    if mask_function is not None and mask_function is masking_utils.flex_attention_mask:
        return BLOCK
    return ADDITIVE


def additive_mask(mask, head_mask, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive form of `mask` (an `AttentionMask`) combined with the per-head mask `head_mask` (see
    `softmax_attention`), or None when everything is allowed."""
    if head_mask is None:
        return mask.additive(dtype)

    def build():
        allowed = head_mask.dense()[None]
        if mask.allowed is not None:
            allowed = allowed & mask.allowed
        return to_additive(allowed, dtype)

    # The lengths are the same for every layer sharing `mask`, so they are not part of the key (under torch.export
    # they may be symbolic, which cannot be hashed).
    return mask.derived(("additive", head_mask.key, dtype), build)


FLEX_BLOCK = 128  # flex attention's default block size, in queries and keys


def _block_indices(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's per-row block counts and indices (the selected blocks first) of a bool [B, H, q blocks, kv blocks]."""
    return blocks.sum(-1, dtype=torch.int32), torch.argsort(~blocks, dim=-1, stable=True).to(torch.int32)


def block_mask(mask, head_mask, batch: int, heads: int, num_queries: int, num_keys: int, device):
    """Flex attention's BlockMask for `mask` (an `AttentionMask`) and the per-head mask `head_mask` (see
    `softmax_attention`), or None when every key is allowed.

    Its `mask_mod` is written from the masks' structure (the keys' padding, causality, the heads' rule) rather than
    read from dense [queries, keys] tensors: Inductor's CPU template fails to compile a mask_mod that reads two captured
    tensors by query position once shapes become dynamic (PyTorch 2.13). Which blocks are empty, partial or full comes
    from the dense mask at block granularity (`BlockMask.from_kv_blocks`), which costs one pass over the mask instead
    of `create_block_mask`'s evaluation of the mask_mod at every position (13 ms per decoding step at batch 32)."""

    needs_backward = torch.is_grad_enabled()  # query-major block indices only for a backward pass (see below)

    def build():
        from torch.nn.attention.flex_attention import BlockMask

        padding = mask.padding.bool() if mask.padding is not None else None  # [B, Tk]
        dense = None
        if padding is None and not mask.causal and mask.allowed is not None:  # a mask given only densely
            dense = mask.allowed[:, 0]  # [B or 1, Tq or 1, Tk]
        causal = mask.causal and not (isinstance(num_queries, int) and num_queries == 1)
        if padding is None and dense is None and not causal and head_mask is None:
            return None
        offset = num_keys - num_queries  # query i sits at position i + offset (cached positions come first)

        def mask_mod(b, h, q, kv):
            position = q + offset
            keep = kv >= 0
            if padding is not None:
                keep = keep & padding[b, kv]
            if dense is not None:
                keep = keep & dense[b if dense.shape[0] != 1 else 0, q if dense.shape[1] != 1 else 0, kv]
            if causal:
                keep = keep & (kv <= position)
            if head_mask is not None:
                keep = keep & head_mask.allows(h, position, kv)
            return keep

        allowed = mask.allowed if mask.allowed is not None else torch.ones(1, 1, 1, num_keys, dtype=torch.bool,
                                                                              device=device)
        if head_mask is not None:
            allowed = allowed & head_mask.dense()[None]
        allowed = allowed.expand(allowed.shape[0], allowed.shape[1], num_queries, num_keys)
        query_blocks, key_blocks = -(-num_queries // FLEX_BLOCK), -(-num_keys // FLEX_BLOCK)
        # Key blocks first, per query row (positions past the end count as masked, so boundary blocks are partial),
        # then query blocks over those rows: the padding to whole blocks is paid on rows, not on positions.
        by_keys = nn.functional.pad(allowed, (0, key_blocks * FLEX_BLOCK - num_keys)).unflatten(-1, (key_blocks,
                                                                                                     FLEX_BLOCK))
        row_blocks = [nn.functional.pad(reduce(-1), (0, 0, 0, query_blocks * FLEX_BLOCK - num_queries))
                      .unflatten(2, (query_blocks, FLEX_BLOCK)) for reduce in (by_keys.any, by_keys.all)]
        full = row_blocks[1].all(dim=3)
        partial = row_blocks[0].any(dim=3) & ~full
        # The query-major block indices serve only the backward pass; computing them (vmapped) costs 0.8 ms, more
        # than the rest of the mask, at every decoding step.
        return BlockMask.from_kv_blocks(*_block_indices(partial), *_block_indices(full), BLOCK_SIZE=FLEX_BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(num_queries, num_keys),
                                        compute_q_blocks=needs_backward)

    return mask.derived(("block", head_mask.key if head_mask is not None else None, needs_backward), build)


def compiled_flex_attention():
    """PyTorch's flex attention, compiled for fixed shapes (what `cpu_flex_problem` checks)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def cpu_flex_problem() -> str | None:
    """Why compiled flex attention cannot be trusted on this CPU, or None where it computes what SDPA does.

    PyTorch 2.13's compiled CPU kernel gives wrong outputs for the last sentence of a batch under a causal block mask
    on short sequences on an AVX2 AMD EPYC, where AVX-512 Xeons compute it right: three equal sentences of 8
    positions, 4 heads of 8 dimensions, and the third's output was up to 1.4 away from the first's (beam search with
    an mma model scored 9 of 72 tokens up to 0.92 away from the model's own full pass). The shape is checked once a
    process, on the first call of flex attention on the CPU (a compile of about a second), so that flex attention is
    refused where its result would be wrong rather than returning it."""
    from torch.nn.attention.flex_attention import create_block_mask

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 4, 8, 8, generator=generator).expand(3, -1, -1, -1).contiguous()
                         for _ in range(3))
    causal = create_block_mask(lambda batch, head, query_index, key_index: key_index <= query_index, None, None, 8, 8,
                               device="cpu")
    with torch.no_grad():
        got = compiled_flex_attention()(query, key, value, block_mask=causal)
        expected = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    if torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
        return None
    error = (got - expected).abs().max().item()
    wrong = "NaN" if error != error else f"outputs up to {error:.2g} away from SDPA's"
    return (f"flex_attention is refused on this CPU: PyTorch {torch.__version__}'s compiled CPU kernel gives {wrong} "
            "for the last of 3 short sentences under a causal mask, so translations through it would be wrong; use "
            "attn_implementation='sdpa' (the default) or 'eager' on this CPU, or flex_attention on a GPU")


def describe_module(module) -> str:
    """`module` (an attention variant) as its site and layer, for error messages."""
    return f"`{module.site}` of layer {module.layer_idx} ({module.name})"


def softmax_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask,
    *,
    head_mask=None,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q K^T * scaling + mask) V through the attention function `module.config._attn_implementation` names.
    module: the attention variant (its `config`, `scaling`, `attention_dropout`, `training`, `is_causal`); mask: the
    `AttentionMask`; head_mask: None or a mask per head (mma), an object with `key` (hashable, names the mask among
    those derived from `mask`), `dense()` (bool [heads, queries, keys]) and `allows(head, query_position,
    key_position)` (elementwise, for flex attention's mask_mod). Returns per-head outputs [B, Tq, H, D] and, if `need_weights`, the weights [B, H, Tq, Tk]: the weights are
    computed by the eager function, whatever the implementation (fused kernels do not return them)."""
    implementation = module.config._attn_implementation
    dropout = module.attention_dropout if module.training else 0.0
    if need_weights or implementation is None or implementation == EAGER:
        return eager_attention_forward(module, query, key, value, additive_mask(mask, head_mask, query.dtype),
                                       scaling=module.scaling, dropout=dropout)
    kind = mask_format(implementation)
    is_causal = False
    if kind == PADDING:
        if head_mask is not None:
            raise ValueError(f"{implementation} takes one padding mask for every head, but {describe_module(module)} "
                             "gives each head its own mask; use sdpa, eager or flex_attention for this model")
        backend_mask, is_causal = mask.padding, mask.causal
    elif kind == BLOCK:
        if query.device.type == "cpu" and not torch.compiler.is_compiling() and (problem := cpu_flex_problem()):
            raise ValueError(problem)
        backend_mask = block_mask(mask, head_mask, query.shape[0], query.shape[1], query.shape[2], key.shape[2],
                                  query.device)
    elif implementation == SDPA and head_mask is None and mask.is_causal:
        # `is_causal` marks a square lower triangle (the decoder sets it only when no position is cached). No
        # comparison of the lengths here: under torch.export they may be symbolic, and SDPA takes a Python bool.
        backend_mask, is_causal = None, True
    else:
        backend_mask = additive_mask(mask, head_mask, query.dtype)
    output, _ = attention_function(implementation)(
        module, query, key, value, backend_mask, dropout=dropout, scaling=module.scaling, is_causal=is_causal
    )
    return output, None
