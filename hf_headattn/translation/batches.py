"""Cutting sentences into batches: the longest source a model takes (:func:`source_token_limit`), and sentences
sorted by token length, longest first, packed into batches of at most ``batch_size`` sentences and ``max_tokens``
padded source tokens (fairseq's ``--max-tokens``; :func:`length_sorted_batches`), so that a batch holds sentences of
similar length and little padding.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_TOKENS", "length_sorted_batches", "source_token_limit"]

# translate's batches unless told otherwise (the command's too, when neither --batch_size nor --max_tokens is given):
# 128 sentences (with beam 5 on 2 CPU cores 1.25x faster than 32, and faster than 256, whose [rows, vocab] logits no
# longer stay in cache; measured on Multi30k's test set), and at most 4,096 padded source tokens so that a file of
# long sentences gets smaller batches.
DEFAULT_BATCH_SIZE = 128
DEFAULT_MAX_TOKENS = 4096


def length_sorted_batches(lengths: Sequence[int], batch_size: int | None = 32,
                          max_tokens: int | None = None) -> list[list[int]]:
    """Indices into `lengths`, sorted longest first and cut into batches of at most `batch_size` sentences and at
    most `max_tokens` padded tokens (sentences x the batch's longest); either limit may be None, not both. A
    sentence longer than `max_tokens` gets a batch of its own."""
    if batch_size is None and max_tokens is None:
        raise ValueError("Give batch_size, max_tokens or both")
    for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches, batch = [], []
    for index in order:
        longest = lengths[batch[0]] if batch else lengths[index]  # sorted: the first is the longest
        full = batch and ((batch_size is not None and len(batch) == batch_size)
                          or (max_tokens is not None and (len(batch) + 1) * longest > max_tokens))
        if full:
            batches.append(batch)
            batch = []
        batch.append(index)
    if batch:
        batches.append(batch)
    return batches


def source_token_limit(model, tokenizer) -> int | None:
    """The longest source the model takes, in tokens: the tokenizer's `model_max_length`, capped by the model's
    position table where it has one (None: no limit)."""
    limits = [tokenizer.model_max_length] if tokenizer.model_max_length < 10**9 else []
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and getattr(model.config, "position_embedding", "sinusoidal") != "none":
        limits.append(positions)
    return min(limits) if limits else None
