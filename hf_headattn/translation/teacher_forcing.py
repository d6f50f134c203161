"""Scores and attention of given sequences, from teacher-forced passes: every decoding step depends only on the
source and the prefix, so one pass over a finished hypothesis computes what decoding computed (per-step state of the
constrained variants included), for :func:`~hf_headattn.translation.translate`'s scores, alignments and kept
attention and for :func:`~hf_headattn.translation.align`'s forced alignments.

A sequence's score is the model's log-probability of its tokens (the end-of-sentence token included) divided by
``length ** length_penalty``, length counting the generated tokens: the score beam search ranks by (``generate``'s
``sequences_scores``), computed the same way for greedy and sampled output.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from .alignments import reduced_attention

__all__ = ["kept_attention", "teacher_forced"]


def teacher_forced(model, input_ids, attention_mask, sequences, *, length_penalty, alignments, alignment_layer,
                   alignment_heads, rows_per_pass: int = 64, keep_attention: bool = False,
                   sequences_per_source: int = 1):
    """(score, reduced cross-attention [target tokens, source tokens] or None, and with `keep_attention` the
    sequence's `cross_attentions` and `head_importances` for :class:`~.results.HypothesisAttention`, else None) of
    every sequence (which starts with the decoder start token), from teacher-forced passes of at most
    `rows_per_pass` sequences. Each source row (`input_ids`, `attention_mask`) has `sequences_per_source`
    consecutive sequences (an n-best list): it is encoded once, for all of them, unless `keep_attention` asks for
    the encoder's own head weights too."""
    import inspect

    import torch

    # weights over heads: asked for when the reduction or the kept attention needs them and the model has them
    wants_importances = alignments and (alignment_heads == "hop" or (
        keep_attention and "output_head_importances" in inspect.signature(model.forward).parameters))

    full_context = getattr(model.config, "guided_alignment_full_context", False)
    eos = model.generation_config.eos_token_id
    eos_ids = torch.tensor(eos if isinstance(eos, list) else [eos], device=sequences.device)
    produced = sequences[:, 1:]
    is_eos = torch.isin(produced, eos_ids)
    real = (is_eos.int().cumsum(1) - is_eos.int()) == 0  # tokens up to and including the first end of sentence
    source_of_row = torch.arange(input_ids.shape[0], device=input_ids.device).repeat_interleave(sequences_per_source)
    encoder_outputs = None
    if not keep_attention:  # kept attention includes the encoder's head weights, which only a full pass returns
        with torch.inference_mode():
            encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
    results = []
    for start in range(0, sequences.shape[0], rows_per_pass):
        rows = slice(start, start + rows_per_pass)
        sources = source_of_row[rows]
        inputs = ({"input_ids": input_ids[sources]} if encoder_outputs is None else {"encoder_outputs": type(
            encoder_outputs)(**{name: value[sources] if torch.is_tensor(value) else value
                                for name, value in encoder_outputs.items()})})
        with torch.inference_mode():
            outputs = model(**inputs, attention_mask=attention_mask[sources], decoder_input_ids=sequences[rows, :-1],
                            use_cache=False, output_attentions=keep_attention or (alignments and not full_context),
                            **({"output_head_importances": True} if wants_importances else {}))
            # a model guided with full target context (Garg et al.) is read as it was trained: from a pass whose
            # decoder sees the whole hypothesis (up to its end of sentence)
            attended = outputs if not (alignments and full_context) else model(
                **inputs, attention_mask=attention_mask[sources], decoder_input_ids=sequences[rows, :-1],
                decoder_attention_mask=real[rows].long(), use_cache=False, output_attentions=True,
                full_target_context=True)
        log_probs = torch.log_softmax(outputs.logits.float(), dim=-1)
        token_log_probs = log_probs.gather(-1, produced[rows, :, None]).squeeze(-1) * real[rows]
        lengths = real[rows].sum(-1).clamp(min=1)
        sequence_scores = token_log_probs.sum(-1) / lengths.float() ** length_penalty
        attention = reduced_attention(model, attended, alignment_layer, alignment_heads) if alignments else None
        for k in range(sequence_scores.shape[0]):
            length = int(lengths[k])
            kept = kept_attention(outputs, k, length, int(attention_mask[sources][k].sum())) if keep_attention else None
            results.append((sequence_scores[k].item(), attention[k, :length] if alignments else None, kept))
    return results


def kept_attention(outputs, row: int, target_length: int, source_length: int) -> dict:
    """One sequence's cross-attention per layer ([heads, target, source] each) and head importances (module ->
    [tokens, heads]), cut to its real tokens, on the CPU (the fields of :class:`~.results.HypothesisAttention`)."""
    cross_attentions = tuple(layer[row, :, :target_length, :source_length].float().cpu()
                             for layer in outputs.cross_attentions)
    importances = getattr(outputs, "head_importances", None)
    if importances is not None and not isinstance(importances, dict):  # the LSTM family: its one source attention
        importances = {"source attention": importances}
    head_importances = {name: values[row, :source_length if name.startswith("encoder.") else target_length]
                        .float().cpu() for name, values in (importances or {}).items() if values is not None}
    return {"cross_attentions": cross_attentions, "head_importances": head_importances}
