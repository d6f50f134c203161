"""The decoding caches: for the Transformer, Transformers' self-/cross-attention KV caches plus per-variant
decoding state; for the LSTM encoder-decoder, its recurrent state.

Transformers 5 reorders only the cache object during beam search, so any state an attention variant
carries from one decoding step to the next (e.g. cumulative attention) must live here to follow the beams.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache


class HeadAttnCache(EncoderDecoderCache):
    """`EncoderDecoderCache` that also holds `variant_states`: module key -> {name: tensor with batch first}."""

    def __init__(self, self_attention_cache=None, cross_attention_cache=None):
        super().__init__(
            self_attention_cache if self_attention_cache is not None else DynamicCache(),
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
