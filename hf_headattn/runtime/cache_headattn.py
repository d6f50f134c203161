"""The decoding caches: for the Transformer, Transformers' self-/cross-attention KV caches plus per-variant
decoding state; for the LSTM encoder-decoder, its recurrent state.

Transformers 5 reorders only the cache object during beam search, so any state an attention variant
carries from one decoding step to the next (e.g. cumulative attention) must live here to follow the beams.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache


class RowsOnAppendLayer(DynamicLayer):
    """Transformers' `DynamicLayer` whose changes of rows (beam search's reorder, the rows kept when sentences finish)
    wait for the next append and are made with it, in one copy.

    `DynamicLayer` copies the whole self-attention cache twice a beam-search step: `index_select` when the beams are
    reordered and `torch.cat` when the step's keys and values are appended. Here a change of rows only records which
    cached row each row becomes (`rows`, composed with any change still waiting), and the append gathers those rows
    into a new tensor that has room for the new positions. The values are the same copies, so the outputs are
    identical. Any other read of `keys` or `values` first makes the waiting change (`_settle_rows`)."""

    def __init__(self, **kwargs):
        self.rows: torch.Tensor | None = None  # row i of the cache is row rows[i] of the stored tensors
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        self._settle_rows()
        return self._keys

    @keys.setter
    def keys(self, keys: torch.Tensor | None) -> None:
        self._keys = keys

    @property
    def values(self) -> torch.Tensor | None:
        self._settle_rows()
        return self._values

    @values.setter
    def values(self, values: torch.Tensor | None) -> None:
        self._values = values

    def _settle_rows(self) -> None:
        if self.rows is not None:
            rows, self.rows = self.rows, None
            self._keys, self._values = self._keys.index_select(0, rows), self._values.index_select(0, rows)

    def _change_rows(self, rows: torch.Tensor) -> None:
        rows = rows.to(self._keys.device, copy=True)  # kept until the next append: the caller may reuse its tensor
        self.rows = rows if self.rows is None else self.rows.index_select(0, rows)

    def get_seq_length(self) -> int:
        if not self.is_initialized or self._keys.numel() == 0:
            return 0
        return self._keys.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.rows is None:
            return super().update(key_states, value_states, *args, **kwargs)
        rows, self.rows = self.rows, None
        self._keys = _gather_rows_and_append(self._keys, rows, key_states)
        self._values = _gather_rows_and_append(self._values, rows, value_states)
        return self._keys, self._values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self._change_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0 and torch.is_tensor(indices) and not indices.is_floating_point() \
                and indices.dtype != torch.bool:  # row numbers; anything else (a mask, a list) goes the usual way
            self._change_rows(indices)
        else:
            super().batch_select_indices(indices)

    def reset(self) -> None:
        self.rows = None
        super().reset()


def _gather_rows_and_append(cached: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """torch.cat([cached[rows], new], dim=-2) as one copy of the cached rows: gathered straight into their place in
    the result."""
    length = cached.shape[-2]
    result = cached.new_empty((rows.shape[0], *cached.shape[1:-2], length + new.shape[-2], cached.shape[-1]))
    torch.index_select(cached, 0, rows, out=result[..., :length, :])
    result[..., length:, :] = new
    return result


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
