r"""Word alignments from cross-attention: Pharaoh ``i-j`` pairs (source word i, target word j, 0-based, words split
at whitespace of the source line and of the detokenised translation).

The cross-attention is reduced to one source distribution per target token (:func:`reduced_attention`):
Transformers average the heads of one decoder layer (``alignment_layer``; by default the last layer, which aligns
best of the 3 layers of the Multi30k models in RESULTS.md, while Garg et al., 2019 found the penultimate of 6 best);
the LSTM family has one attention, averaged over its heads. A model trained with guided alignment (Garg et al.;
``config.guided_alignment()``) is read by default at its guided layer, and there "mean" averages its guided heads
only (:func:`guided_heads`); ``alignment_heads="all"`` averages every head of the layer. ``alignment_heads="hop"`` weighs the heads instead by the
model's own weights over heads (the second hop of multi-hop models with dependent hops, DHICM's head importances).
Every target token links to the source word of its highest-weighted source token, special tokens excluded; a token
whose attention on the source words is exactly zero (all of it on the end-of-sentence token or on the constrained
variants' sink) links to nothing, so sparse and constrained attention leave words unaligned where their weights say
so. A target word links to every source word one of its tokens links to (:func:`pharaoh`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

__all__ = ["ALIGNMENT_HEADS", "alignment_layer_index", "cross_attention_layers", "decoded_word_indices",
           "default_alignment_layer", "guided_heads", "pharaoh", "reduced_attention", "source_word_indices", "word_of_character"]

ALIGNMENT_HEADS = ("mean", "hop", "all")


def default_alignment_layer(layers: int) -> int:
    """The decoder layer alignments are read from by default, of `layers`: the last."""
    return layers - 1


def cross_attention_layers(model) -> int:
    """How many cross-attention layers alignments can be read from: this package's configs count them (the LSTM
    family has one); other models have one a decoder layer."""
    return getattr(model.config, "cross_attention_layers", getattr(model.config, "decoder_layers", 1))


def alignment_layer_index(model, alignment_layer: int | None) -> int:
    """The decoder layer alignments are read from (0 for the LSTM family, whose attention is one).

    Raises:
        ValueError: a layer the model's decoder lacks.
    """
    layers = cross_attention_layers(model)
    if alignment_layer is None:
        guided = guided_heads(model)
        return guided[0] if guided else default_alignment_layer(layers)
    if not -layers <= alignment_layer < layers:
        raise ValueError(f"alignment_layer={alignment_layer}: the model's decoder has {layers} attention layer(s) "
                         f"(accepted: {-layers} to {layers - 1})")
    return alignment_layer % layers


def reduced_attention(model, outputs, alignment_layer, alignment_heads):
    """[sequences, target tokens, source tokens]: the chosen layer's cross-attention with its heads reduced."""
    import torch

    layer = alignment_layer_index(model, alignment_layer)
    attention = outputs.cross_attentions[layer].float()  # [sequences, heads, target, source]
    guided = guided_heads(model)
    if alignment_heads == "mean" and guided and guided[0] == layer:
        return attention[:, guided[1]].mean(1)
    if alignment_heads in ("mean", "all"):
        return attention.mean(1)
    importances = outputs.head_importances
    if isinstance(importances, dict):  # Transformers: per attention module
        importances = importances.get(model.config.cross_attention_module(layer))
    if importances is None:
        raise ValueError(f"alignment_heads='hop': the cross-attention of decoder layer {layer} of this "
                         f"{model.config.model_type} model has no weights over heads (only multi-hop models with "
                         "dependent hops and DHICM have them); use alignment_heads='mean'")
    return torch.einsum("bth,bhts->bts", importances.float(), attention)


def guided_heads(model) -> tuple[int, list[int]] | None:
    """(layer index, positions among that layer's returned heads) of the heads a model was trained to align with
    (guided alignment), or None: what `--alignments` reads by default."""
    guided = getattr(model.config, "guided_alignment", None)
    guided = guided() if callable(guided) else None
    if guided is None:
        return None
    layer, heads = guided
    kept = model.config.cross_attention_heads(layer)  # pruned models return their kept heads only
    return layer, [kept.index(head) for head in heads]


def word_of_character(text: str) -> list[int]:
    """Index of the whitespace-separated word each character of `text` belongs to (-1: whitespace)."""
    indices, word, inside = [], -1, False
    for character in text:
        if character.isspace():
            inside = False
            indices.append(-1)
        else:
            if not inside:
                word, inside = word + 1, True
            indices.append(word)
    return indices


def source_word_indices(tokenizer, texts: list[str], input_ids, limit: int | None = None) -> list[list[int]]:
    """For each text, the word index of each source token position (-1: special tokens, padding), the text cut
    to `limit` tokens as the model read it (`input_ids`: a tensor or lists of ids, read by slow tokenizers only)."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(texts, return_offsets_mapping=True, return_special_tokens_mask=True,
                            return_token_type_ids=False, verbose=False, truncation=limit is not None,
                            max_length=limit)
        result = []
        for text, offsets, special in zip(texts, encoded["offset_mapping"], encoded["special_tokens_mask"]):
            characters = word_of_character(text)
            words = []
            for (start, end), is_special in zip(offsets, special):
                inside = [characters[c] for c in range(start, min(end, len(text))) if characters[c] >= 0]
                words.append(inside[0] if inside and not is_special else -1)
            result.append(words)
        return result
    return [decoded_word_indices(tokenizer, ids.tolist() if hasattr(ids, "tolist") else list(ids))
            for ids in input_ids]


def decoded_word_indices(tokenizer, ids: list[int]) -> list[int]:
    """Word index, in the detokenised text of `ids`, of each token (-1: special tokens and pure whitespace):
    a token that starts a new whitespace-separated word of the growing decoded prefix begins that word."""
    # every prefix decoded in one call (a fast tokenizer decodes the batch in Rust): what a loop of decodes gives
    prefixes = tokenizer.batch_decode([ids[:end] for end in range(1, len(ids) + 1)], skip_special_tokens=True)
    words, previous_text, previous_count = [], "", 0
    for text in prefixes:
        count = len(text.split())
        changed = text.strip() != previous_text.strip() or count != previous_count
        words.append(count - 1 if changed and count else -1)
        previous_text, previous_count = text, count
    return words


def pharaoh(attention, source_words: list[int], target_words: list[int]) -> str:
    """Pharaoh links from reduced attention [target tokens, source tokens] and the tokens' word indices."""
    import torch

    source_words = source_words[: attention.shape[1]]
    target_words = target_words[: attention.shape[0]]
    if not source_words or not target_words:
        return ""
    usable = torch.tensor([word >= 0 for word in source_words], dtype=torch.bool)
    rows = attention[: len(target_words), : len(source_words)].cpu().masked_fill(~usable, 0)
    best, linked = rows.argmax(dim=-1).tolist(), (rows.amax(dim=-1) > 0).tolist()  # all rows at once
    # a row exactly zero on every source word links to nothing
    links = {(source_words[best[t]], target_word) for t, target_word in enumerate(target_words)
             if target_word >= 0 and linked[t]}
    return " ".join(f"{i}-{j}" for i, j in sorted(links))
