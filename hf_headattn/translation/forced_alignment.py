"""Forced alignment: Pharaoh word alignments of given translations (:func:`align`), used to measure alignment error
rates against reference alignments (examples/benchmark_alignment.py).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from .alignments import ALIGNMENT_HEADS, alignment_layer_index, pharaoh, source_word_indices, word_of_character
from .batches import source_token_limit
from .teacher_forcing import teacher_forced

__all__ = ["align"]


def align(model, tokenizer, sources: Sequence[str], targets: Sequence[str], *, batch_size: int = 32,
          alignment_layer: int | None = None, alignment_heads: str = "mean") -> list[str]:
    """Pharaoh word alignments of given translations (forced decoding): each target is fed to the decoder as if
    the model had produced it, and its words are aligned as :func:`~hf_headattn.translation.translate` aligns
    hypotheses (words split at whitespace of both texts)."""
    import torch

    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if alignment_heads not in ALIGNMENT_HEADS:
        raise ValueError(f"Unknown alignment_heads={alignment_heads!r}; accepted: {', '.join(ALIGNMENT_HEADS)}")
    alignment_layer_index(model, alignment_layer)
    start_id = model.config.decoder_start_token_id
    limit = source_token_limit(model, tokenizer)  # longer sentences are aligned as far as the model reads them
    cut = {"truncation": limit is not None, "max_length": limit}
    results = []
    for start in range(0, len(sources), batch_size):
        texts, labels = list(sources[start:start + batch_size]), list(targets[start:start + batch_size])
        batch = tokenizer(texts, return_tensors="pt", padding=True, return_token_type_ids=False, **cut).to(model.device)
        target = tokenizer(text_target=labels, return_offsets_mapping=True, return_special_tokens_mask=True,
                           return_token_type_ids=False, **cut)
        width = max(len(ids) for ids in target["input_ids"])
        pad = model.config.pad_token_id
        sequences = torch.tensor([[start_id, *ids, *[pad] * (width - len(ids))] for ids in target["input_ids"]],
                                 device=model.device)
        scored = teacher_forced(model, batch["input_ids"], batch["attention_mask"], sequences, length_penalty=1.0,
                                alignments=True, alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        source_words = source_word_indices(tokenizer, texts, batch["input_ids"], limit)
        for k, (_, attention, _) in enumerate(scored):
            characters = word_of_character(labels[k])
            target_words = []
            for (first, last), special in zip(target["offset_mapping"][k], target["special_tokens_mask"][k]):
                inside = [characters[c] for c in range(first, min(last, len(labels[k]))) if characters[c] >= 0]
                target_words.append(inside[0] if inside and not special else -1)
            results.append(pharaoh(attention, source_words[k], target_words))
    return results
