"""The decoding caches: for the Transformer, Transformers' self-/cross-attention KV caches plus per-variant
decoding state; for the LSTM encoder-decoder, its recurrent state.

Transformers 5 reorders only the cache object during beam search, so any state an attention variant
carries from one decoding step to the next (e.g. cumulative attention) must live here to follow the beams.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache


class RowsOnAppendLayer(DynamicLayer):
    """Transformers' `DynamicLayer` whose changes of rows (beam search's reorder, the rows kept when sentences finish)
    wait for the next append and are made with it, in one copy; and whose appends, where beam search does not reorder
    it, are writes into room kept after the cached positions.

    `DynamicLayer` copies the whole self-attention cache twice a beam-search step: `index_select` when the beams are
    reordered and `torch.cat` when the step's keys and values are appended. Here a change of rows only records which
    cached row each row becomes (`rows`, composed with any change still waiting), and the append gathers those rows
    into a new tensor that has room for the new positions. Any other read of `keys` or `values` first makes the
    waiting change (`_settle_rows`).

    A greedy search changes rows only when sentences finish, so there `DynamicLayer` copies the cache at every step for
    the append alone: here the stored tensors (`key_store`, `value_store`) get room for as many positions again as
    they hold whenever they are copied, and `keys`/`values` are views of their first positions, to which an append
    writes the new ones. A layer that beam search reorders is copied at every step anyway, so it keeps no room and its
    tensors stay contiguous (a view with room costs the attention's products a little: SDPA over 128 rows and 25
    positions 0.40 against 0.34 ms, where the append it saves took 0.23). The values are the same copies, so the
    outputs are identical."""

    def __init__(self, **kwargs):
        self.rows: torch.Tensor | None = None  # row i of the cache is row rows[i] of the stored tensors
        self.reordered = False  # beam search reorders it (at every step): no room kept
        self.key_store: torch.Tensor | None = None  # `keys` is a view of its first positions (None: no room)
        self.value_store: torch.Tensor | None = None
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        self._settle_rows()
        return self._keys

    @keys.setter
    def keys(self, keys: torch.Tensor | None) -> None:
        self._keys, self.key_store = keys, None  # a tensor set from outside has no room of ours

    @property
    def values(self) -> torch.Tensor | None:
        self._settle_rows()
        return self._values

    @values.setter
    def values(self, values: torch.Tensor | None) -> None:
        self._values, self.value_store = values, None

    def _settle_rows(self) -> None:
        if self.rows is not None:
            rows, self.rows = self.rows, None
            self.keys, self.values = self._keys.index_select(0, rows), self._values.index_select(0, rows)

    def _change_rows(self, rows: torch.Tensor) -> None:
        rows = rows.to(self._keys.device, copy=True)  # kept until the next append: the caller may reuse its tensor
        self.rows = rows if self.rows is None else self.rows.index_select(0, rows)

    def get_seq_length(self) -> int:
        if not self.is_initialized or self._keys.numel() == 0:
            return 0
        return self._keys.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # torch.compile does not trace the stored tensors' room (it fails on the write into a view of a graph input
        # of dynamic size): a compiled call appends as DynamicLayer does, or gathers without room
        compiling = torch.compiler.is_compiling()
        if not self.is_initialized or (compiling and self.rows is None):
            return super().update(key_states, value_states, *args, **kwargs)
        rows, self.rows = self.rows, None
        keep_room = not (self.reordered or compiling)
        self._keys, self.key_store = _append(self._keys, self.key_store, rows, key_states, keep_room)
        self._values, self.value_store = _append(self._values, self.value_store, rows, value_states, keep_room)
        return self._keys, self._values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self.reordered = True
            self._change_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0 and torch.is_tensor(indices) and not indices.is_floating_point() \
                and indices.dtype != torch.bool:  # row numbers; anything else (a mask, a list) goes the usual way
            self._change_rows(indices)
        else:
            super().batch_select_indices(indices)

    def reset(self) -> None:
        self.rows, self.reordered = None, False
        super().reset()


def _append(cached: torch.Tensor, store: torch.Tensor | None, rows: torch.Tensor | None, new: torch.Tensor,
            keep_room: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch.cat([cached[rows], new], dim=-2) (rows None: every row, in order) and the tensor it is a view of (None
    when it is the whole of it). Written into `store`'s room if `cached` is a view of its first positions with room
    left and no row changes; else the kept rows are copied once, straight into their place in a new tensor, with room
    for as many positions again if `keep_room`."""
    length, total = cached.shape[-2], cached.shape[-2] + new.shape[-2]
    if rows is None and store is not None and total <= store.shape[-2]:
        store[..., length:total, :] = new
        return store[..., :total, :], store
    count = cached.shape[0] if rows is None else rows.shape[0]
    capacity = 2 * total if keep_room else total
    result = cached.new_empty((count, *cached.shape[1:-2], capacity, cached.shape[-1]))
    if rows is None:
        result[..., :length, :] = cached
    else:
        torch.index_select(cached, 0, rows, out=result[..., :length, :])
    result[..., length:total, :] = new
    return (result[..., :total, :], result) if keep_room else (result, None)


class SelfAttentionCache(DynamicCache):
    """`DynamicCache` of `RowsOnAppendLayer`s: the self-attention cache of the caches this package makes."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=RowsOnAppendLayer)


class HeadAttnCache(EncoderDecoderCache):
    """`EncoderDecoderCache` that also holds `variant_states`: module key -> {name: tensor with batch first}. Its
    self-attention cache, unless one is given (e.g. by `generate`), is a `SelfAttentionCache`."""

    def __init__(self, self_attention_cache=None, cross_attention_cache=None):
        super().__init__(
            self_attention_cache if self_attention_cache is not None else SelfAttentionCache(),
            cross_attention_cache if cross_attention_cache is not None else DynamicCache(),
        )
        self.variant_states: dict[str, dict[str, torch.Tensor]] = {}

    @classmethod
    def wrap(cls, cache) -> "HeadAttnCache":
        """Adopt a cache made elsewhere (e.g. by `generate`), sharing its key/value tensors."""
        if isinstance(cache, HeadAttnCache):
            return cache
        if isinstance(cache, EncoderDecoderCache):
            wrapped = cls(cache.self_attention_cache, cache.cross_attention_cache)
            wrapped.is_updated = dict(cache.is_updated)
            return wrapped
        if isinstance(cache, DynamicCache):
            return cls(cache, DynamicCache())
        raise TypeError(f"Expected an EncoderDecoderCache or DynamicCache, got {type(cache).__name__}")

    def get_variant_state(self, key: str) -> dict[str, torch.Tensor] | None:
        return self.variant_states.get(key)

    def set_variant_state(self, key: str, state: dict[str, torch.Tensor]) -> None:
        self.variant_states[key] = state

    def _map_states(self, fn) -> None:
        self.variant_states = {
            key: {name: fn(tensor) for name, tensor in state.items()} for key, state in self.variant_states.items()
        }

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search's reordering: `beam_idx` only permutes the hypotheses of each sentence among themselves
        (`generate` adds the sentence's offset to beam indices within it). The cross-attention keys and values
        of a sentence's hypotheses are projections of the same encoder output, hence equal, so only the
        self-attention cache and the variants' states move; copying every layer's source keys and values at
        every step would change nothing."""
        self.self_attention_cache.reorder_cache(beam_idx)
        self._map_states(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._map_states(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._map_states(lambda tensor: tensor[indices])

    @property
    def is_croppable(self) -> bool:
        """What Transformers (5.x) asks before it rolls decoding steps back with `crop`."""
        return not self.variant_states and getattr(super(), "is_croppable", True)

    def crop(self, tokens_to_remove: int) -> None:
        if self.variant_states:
            raise ValueError(
                "HeadAttnCache cannot crop per-step attention state (it is a running quantity, not a per-token "
                "list); assisted/speculative decoding is not supported for stateful attention variants."
            )
        super().crop(tokens_to_remove)

    def reset(self) -> None:
        super().reset()
        self.variant_states = {}


class HeadAttnRNNCache(Cache):
    """The LSTM decoder's state between decoding steps: `states` maps a name (LSTM hidden and cell states,
    the input feed, cumulative attention) to a tensor with the batch first, so that beam search reorders all of
    it; `decoded_length` counts the decoded positions, which `generate` reads to pass only the newest token."""

    def __init__(self):
        super().__init__(layers=[])
        self.states: dict[str, torch.Tensor] = {}
        self.decoded_length = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.decoded_length

    @property
    def is_linear(self) -> list[bool]:
        """Transformers (5.x) feeds only the positions a cache has not seen when generation restarts from it, except for
        caches whose layers are all linear-attention states; this one has no layers (`all([])` would count it as such)
        but knows its decoded positions, so it answers like one position-counting layer."""
        return [False]

    def update_states(self, states: dict[str, torch.Tensor], new_positions: int) -> None:
        self.states = dict(states)
        self.decoded_length += new_positions

    def _map_states(self, fn) -> None:
        self.states = {name: fn(tensor) for name, tensor in self.states.items()}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_states(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_states(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_states(lambda tensor: tensor[indices])

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("An LSTM decoder's state cannot be cropped back to an earlier step; assisted/speculative "
                         "decoding is not supported for HeadAttnRNN models")

    def reset(self) -> None:
        self.states = {}
        self.decoded_length = 0
