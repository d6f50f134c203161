"""Cutting sentences into batches: the longest source a model takes (:func:`source_token_limit`), and sentences
sorted by token length, longest first, packed into batches of at most ``batch_size`` sentences and ``max_tokens``
padded source tokens (fairseq's ``--max-tokens``; :func:`length_sorted_batches`), so that a batch holds sentences of
similar length and little padding.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["AUTO_BATCH_SIZE", "DEFAULT_BATCH_ROWS", "DEFAULT_BATCH_SIZE", "DEFAULT_MAX_TOKENS", "GENERATE_BATCH_SIZE",
           "default_batch_size", "given_or_auto", "length_sorted_batches", "source_token_limit"]

# The fast path's batches at beam 5 and more (and the CTranslate2 export's): 128 sentences (with beam 5 on 2 CPU cores
# 1.25x faster than 32, and faster than 256, whose [rows, vocab] logits no longer stay in cache; measured on
# Multi30k's test set), and at most 4,096 padded source tokens so that a file of long sentences gets smaller batches.
# The fast path takes more sentences where fewer beams leave room, up to `DEFAULT_BATCH_ROWS` decoder rows
# (sentences x beams, :func:`default_batch_size`).
DEFAULT_BATCH_SIZE = 128
DEFAULT_MAX_TOKENS = 4096
# The fast path's decoder rows a batch: fewer beams, more sentences. The trained Transformer of
# examples/benchmark_decoding.py over Multi30k's 1,000 test lines, 2 threads, the 2-core Intel Xeon (AVX-512, AMX),
# 3 rounds in one process: greedy 2.09 s in batches of 128 sentences, 1.88 s in 256 and 1.89 s in 640 (the token
# limit caps both near 256); 2 beams 2.85 s in 128, 2.71 s in 320; 4 beams 5.42 s in 128, 5.32 s in 160; 10 beams
# 11.8 s in 128 against 12.7 s in 64, so never fewer than 128 sentences.
DEFAULT_BATCH_ROWS = 640
# `generate`'s batches on a CPU: it steps a batch until its longest sentence ends, so more sentences cost it more
# steps. The same model and lines through `translate(..., fast=False)`, 2 threads, 3 rounds in one process: beam 5
# 13.6 / 13.2 / 16.1 / 20.8 s in batches of 16 / 32 / 64 / 128 sentences, greedy 4.8 / 3.8 / 3.7 / 4.0 s. On a GPU a
# step's time hardly grows with its rows (the kernels' launches, not their work, set it at these sizes), so the rows
# that ride along cost little and fewer, larger batches pay: there `generate` keeps `DEFAULT_BATCH_SIZE`, the batches
# the GPU table of BENCHMARKS.md ran it in.
GENERATE_BATCH_SIZE = 32
# The `batch_size` that asks for `default_batch_size` of the search that decodes (translate's default).
AUTO_BATCH_SIZE = "auto"


def default_batch_size(num_beams: int, fast: bool = True, device_type: str = "cpu") -> int:
    """Sentences a batch when the caller asks for `AUTO_BATCH_SIZE`: for the fast path as many as fill
    `DEFAULT_BATCH_ROWS` decoder rows at `num_beams` beams, never fewer than `DEFAULT_BATCH_SIZE` (greedy: 640, which
    the `DEFAULT_MAX_TOKENS` token limit cuts to ~256 sentences of Multi30k's length); for `generate` (`fast` False),
    `GENERATE_BATCH_SIZE` on a CPU (`device_type` ``"cpu"``) and `DEFAULT_BATCH_SIZE` on any other device."""
    if fast:
        return max(DEFAULT_BATCH_SIZE, DEFAULT_BATCH_ROWS // max(1, num_beams))
    return GENERATE_BATCH_SIZE if device_type == "cpu" else DEFAULT_BATCH_SIZE


def given_or_auto(batch_size: int | str | None, auto: Callable[[], int]) -> int | None:
    """`batch_size` as given, or `auto()` for `AUTO_BATCH_SIZE` (the rule of the search or backend that decodes).

    Raises:
        ValueError: a string other than ``"auto"``.
    """
    if batch_size == AUTO_BATCH_SIZE:
        return auto()
    if isinstance(batch_size, str):
        raise ValueError(f"batch_size must be a positive int, None or {AUTO_BATCH_SIZE!r}, got {batch_size!r}")
    return batch_size


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
