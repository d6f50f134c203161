"""Translating sentences (:func:`translate`): a model, its tokenizer and a list of sentences in, one
:class:`~.results.Translation` per sentence out, in input order; nothing is read or written. In between:

* blank (or whitespace-only) lines are not sent to the model and translate to nothing (a model would invent text
  for them);
* the other sentences are sorted by token length (longest first) and packed into batches of at most
  ``batch_size`` sentences and, with ``max_tokens``, at most that many padded source tokens
  (:func:`~.batches.length_sorted_batches`), so that a batch holds sentences of similar length and little padding;
* under ``torchrun`` / ``accelerate launch`` each process takes every n-th batch (n processes; the batches come
  longest first, so each gets long and short ones) and Accelerate's ``gather_object`` brings the translations
  back, so every process returns the whole list in input order;
* each batch is decoded by :func:`hf_headattn.decoding.generate_sequences` (the fast path for greedy and beam
  search, else ``model.generate``; ``nbest`` hypotheses);
* with ``scores``, ``alignments`` or ``attention``, one teacher-forced pass over the chosen hypotheses gives their
  scores and cross-attention (:mod:`.teacher_forcing`), and the attention their word alignments
  (:mod:`.alignments`). n-best lists are sorted by score, best first.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from .alignments import ALIGNMENT_HEADS, alignment_layer_index, decoded_word_indices, pharaoh, source_word_indices
from .batches import (AUTO_BATCH_SIZE, DEFAULT_MAX_TOKENS, default_batch_size, given_or_auto,
                      length_sorted_batches, source_token_limit)
from .refusals import OptionRefused, Refusal
from .results import Hypothesis, HypothesisAttention, Translation
from .teacher_forcing import teacher_forced

# torch, Transformers and the models are imported where they are used, so that the command's `--help` is instant.

__all__ = ["SourceBatches", "check_nbest", "check_source_lengths", "distributed_state", "fast_path_by_default",
           "ranked", "resolve_batch_size", "source_batches", "translate", "translate_sentences"]

logger = logging.getLogger(__name__)

LISTED_LINES = 10  # line numbers a truncation warning names before it only counts


def _line_numbers(numbers: list[int]) -> str:
    shown = ", ".join(str(number) for number in numbers[:LISTED_LINES])
    return shown + (f" and {len(numbers) - LISTED_LINES} more" if len(numbers) > LISTED_LINES else "")


def translate(
    model,
    tokenizer,
    sources: Sequence[str],
    *,
    nbest: int = 1,
    batch_size: int | str | None = AUTO_BATCH_SIZE,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    scores: bool = False,
    alignments: bool = False,
    alignment_layer: int | None = None,
    alignment_heads: str = "mean",
    attention: bool = False,
    strict: bool = False,
    fast: bool = True,
    progress: bool = False,
    desc: str = "translating",
    **generate_kwargs,
) -> list[Translation]:
    """Translate `sources` (one sentence each) with `model`; one :class:`Translation` per source, in input order.

    Args:
        model, tokenizer: A seq2seq model (either family of this package, or any ``generate``-capable
            Transformers encoder-decoder) and its tokenizer.
        nbest: Hypotheses per sentence (at most ``num_beams``), best first.
        batch_size, max_tokens: Limits of a batch: sentences, and padded source tokens (see
            :func:`length_sorted_batches`; either may be None, not both). ``batch_size="auto"`` (the default) takes
            :func:`default_batch_size` of the search that decodes: on the fast path 640 decoder rows (sentences x
            beams), never fewer than 128 sentences; with `generate` 32 on a CPU, 128 on a GPU.
        scores: Give each hypothesis its score (see :mod:`.teacher_forcing`); implied by ``nbest > 1``.
        alignments, alignment_layer, alignment_heads: Give each hypothesis its Pharaoh word alignment, from this
            decoder layer (Transformers; negative counts from the end; default the last) with the heads
            averaged (``"mean"``) or weighed by the model's weights over heads (``"hop"``).
        attention: Keep each hypothesis' attention (:class:`HypothesisAttention`: every layer and head, the
            alignment's reduction, head importances), from the same pass as its score and alignment.
        strict: Refuse sources longer than the model takes (:func:`source_token_limit`) instead of translating
            them cut, with a warning that names their line numbers (1-based positions in `sources`).
        fast: Decode greedy and beam search with :mod:`hf_headattn.decoding`'s fast path (the ids of `generate`,
            finished sentences dropped from their batch); False, or options it does not decode (sampling, ...):
            `generate`.
        progress: Show a progress bar with an ETA (stderr).
        generate_kwargs: Passed to every ``generate`` call (``num_beams``, ``max_new_tokens``, ``length_penalty``,
            ``no_repeat_ngram_size``, ``do_sample``, ``top_k``, ``top_p``, ``temperature``, ...).

    Raises:
        ValueError: ``nbest`` above ``num_beams``, a batch limit that is neither a positive int, None nor
            ``"auto"``, an unknown ``alignment_heads``, a layer the model lacks, or a too-long source with
            ``strict``.
    """
    from ..progress import Progress

    check_nbest(nbest, generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1)
    if generate_kwargs.get("max_new_tokens") is not None and "max_length" not in generate_kwargs:
        # the saved generation config's max_length yields to max_new_tokens; saying so, Transformers would warn on
        # every call
        generate_kwargs = {**generate_kwargs, "max_length": None}
    batch_size = resolve_batch_size(model, batch_size, fast=fast, **generate_kwargs)
    _check_alignment_options(model, alignment_layer, alignment_heads, used=alignments or attention)
    sources = list(sources)
    limit = source_token_limit(model, tokenizer)
    state = distributed_state()
    batches = source_batches(tokenizer, sources, limit, batch_size, max_tokens, strict=strict,
                             warn=state is None or state.is_main_process).batches

    # Batches come longest first: each process takes every num_processes-th, so that all get long and short ones
    # (Accelerate's split_between_processes gives the first process the first, longest, part)
    own_batches = batches[state.process_index::state.num_processes] if state else batches
    bar = Progress(total=sum(len(batch) for batch in own_batches), desc=desc, unit="sentence",
                   disable=not progress or (state is not None and not state.is_main_process))
    results: dict[int, list[Hypothesis]] = {}
    for batch in own_batches:
        results.update(zip(batch, _translate_batch(
            model, tokenizer, [sources[index] for index in batch], nbest=nbest, limit=limit, fast=fast,
            scores=scores or nbest > 1, alignments=alignments, alignment_layer=alignment_layer,
            alignment_heads=alignment_heads, attention=attention, generate_kwargs=generate_kwargs)))
        bar.update(len(batch))
    bar.close()
    results = _gathered(results, state)
    return [Translation(source, results.get(index, [])) for index, source in enumerate(sources)]


def _check_alignment_options(model, alignment_layer: int | None, alignment_heads: str, *, used: bool) -> None:
    """Refuse an unknown `alignment_heads` and, where alignments or attention are asked for (`used`), a layer the
    model lacks, before any decoding."""
    if alignment_heads not in ALIGNMENT_HEADS:
        raise ValueError(f"Unknown alignment_heads={alignment_heads!r}; accepted: {', '.join(ALIGNMENT_HEADS)}")
    if used:
        alignment_layer_index(model, alignment_layer)


def _gathered(results: dict, state) -> dict:
    """Every process's `results` (source position -> hypotheses) under several processes (Accelerate's
    ``gather_object``); this process's alone otherwise."""
    if state is None:
        return results
    from accelerate.utils import gather_object

    return dict(item for part in gather_object([list(results.items())]) for item in part)


def check_source_lengths(kept: list[int], lengths: list[int], limit: int | None, *, strict: bool,
                         warn: bool = True) -> None:
    """Refuse (`strict`) or warn about (`warn`) the sources longer than `limit` tokens, naming their line numbers:
    `kept` are the positions of the non-blank sources in the input, `lengths` their token counts.

    Raises:
        ValueError: a too-long source with `strict`.
    """
    too_long = [kept[k] + 1 for k, length in enumerate(lengths) if limit is not None and length > limit]
    if too_long and strict:
        raise ValueError(f"{len(too_long)} line(s) are longer than the model's {limit} tokens: line "
                         f"{_line_numbers(too_long)}; shorten or split them (or translate them cut: leave out strict)")
    if too_long and warn:
        logger.warning(f"{len(too_long)} line(s) longer than the model's {limit} tokens are translated cut to "
                       f"{limit}: line {_line_numbers(too_long)}")


def distributed_state():
    """Accelerate's process state when this runs under torchrun / accelerate launch with several processes."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())  # without cpu=True, CPU processes would not form a group


def _translate_batch(model, tokenizer, texts, *, nbest, limit, fast, scores, alignments, alignment_layer,
                     alignment_heads, generate_kwargs, attention=False) -> list[list[Hypothesis]]:
    from ..decoding import resolve_generation_config, search_sequences

    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=limit is not None, max_length=limit,
                      return_token_type_ids=False).to(model.device)
    # Beam search ranks its hypotheses by the score n-best lists show: scores alone are the search's, not a second
    # pass's (alignments and attention still need one; greedy search has no such scores)
    sequences, search_scores = search_sequences(model, batch["input_ids"], batch["attention_mask"], fast=fast,
                                                scores=scores and not (alignments or attention),
                                                num_return_sequences=nbest, **generate_kwargs)
    sequences = sequences.reshape(len(texts) * nbest, -1)
    # a decoded line end ("\r" too: it ends a line wherever text is read back) would shift every later output line
    decoded = [text.replace("\r", " ").replace("\n", " ").strip()
               for text in tokenizer.batch_decode(sequences, skip_special_tokens=True)]
    hypotheses = [Hypothesis(text) for text in decoded]
    if search_scores is not None:
        for hypothesis, score in zip(hypotheses, search_scores.tolist()):
            hypothesis.score = score
    elif scores or alignments or attention:
        length_penalty = resolve_generation_config(model, **generate_kwargs)[0].length_penalty  # generate's own
        scored = teacher_forced(model, batch["input_ids"], batch["attention_mask"], sequences,
                                sequences_per_source=nbest, length_penalty=length_penalty,
                                alignments=alignments or attention,
                                alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                keep_attention=attention)
        source_words = source_word_indices(tokenizer, texts, batch["input_ids"], limit)
        for k, (hypothesis, (score, reduced, kept)) in enumerate(zip(hypotheses, scored)):
            hypothesis.score = score
            if alignments or attention:
                target_ids = sequences[k, 1:1 + reduced.shape[0]].tolist()  # up to its end of sentence
                target_words = decoded_word_indices(tokenizer, target_ids)
            if alignments:
                hypothesis.alignment = pharaoh(reduced, source_words[k // nbest], target_words)
            if attention:
                source_ids = batch["input_ids"][k // nbest, :int(batch["attention_mask"][k // nbest].sum())].tolist()
                hypothesis.attention = HypothesisAttention(
                    tokenizer.convert_ids_to_tokens(source_ids), tokenizer.convert_ids_to_tokens(target_ids),
                    source_words[k // nbest][:len(source_ids)], target_words,
                    alignment_attention=reduced[:, :len(source_ids)].cpu(),
                    **kept)
    grouped = [hypotheses[start:start + nbest] for start in range(0, len(hypotheses), nbest)]
    return ranked(grouped) if scores else grouped


def ranked(grouped: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses sorted by score, best first (beam search ranks by the same score; sorting keeps
    the order exact under float rounding)."""
    return [sorted(group, key=lambda hypothesis: -hypothesis.score) for group in grouped]


def check_nbest(nbest: int, num_beams: int, *, lead: str | None = None) -> None:
    """Refuse an `nbest` that is not a positive int, or above `num_beams`: a ValueError, or with `lead` (a
    translator's) an :class:`~.refusals.OptionRefused` of ``nbest``."""
    if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
        raise ValueError(f"nbest must be a positive int, got {nbest!r}")
    if nbest <= num_beams:
        return
    if lead is not None:
        beams = f"{num_beams} beam{'s' * (num_beams != 1)}"
        raise OptionRefused(lead, [Refusal("nbest", nbest, "beam search keeps {num_beams} hypotheses: ask for at "
                                           "most that many, or raise {num_beams}",
                                           shape=f"{{option}} is more than the {beams} ({{reason}})")])
    raise ValueError(f"nbest={nbest} is more than num_beams={num_beams}: beam search keeps num_beams "
                     "hypotheses, so ask for at most that many (or raise num_beams)")


@dataclass
class SourceBatches:
    """Sources planned into batches: `kept`, the positions of the non-blank ones; `input_ids`, their token ids
    (not cut); `batches`, positions batch by batch, longest first."""

    kept: list[int]
    input_ids: list[list[int]]
    batches: list[list[int]]


def source_batches(tokenizer, sources: list[str], limit: int | None, batch_size: int | None,
                   max_tokens: int | None, *, strict: bool, warn: bool = True) -> SourceBatches:
    """The non-blank `sources` tokenized and packed into length-sorted batches (:func:`length_sorted_batches`, of
    their lengths cut to `limit`), the too-long ones refused (`strict`) or warned about (`warn`,
    :func:`check_source_lengths`): what every translator decodes."""
    kept = [index for index, source in enumerate(sources) if source.strip()]
    input_ids = tokenizer([sources[index] for index in kept], return_token_type_ids=False,
                          verbose=False)["input_ids"] if kept else []
    lengths = [len(ids) for ids in input_ids]
    check_source_lengths(kept, lengths, limit, strict=strict, warn=warn)
    batches = [[kept[k] for k in batch] for batch in length_sorted_batches(
        [min(length, limit or length) for length in lengths], batch_size, max_tokens)]
    return SourceBatches(kept, input_ids, batches)


def fast_path_by_default(device) -> bool:
    """Whether the commands decode through the fast path (:func:`translate`'s `fast`) when not told: on the CPU,
    where it is about 2x `generate`, but not on CUDA, where it decoded at 0.85x `generate`'s speed on an H200
    (BENCHMARKS.md, "Decoding speed: translating a file (GPU)"), until it is measured faster there. `device`: a
    torch.device or its name."""
    return getattr(device, "type", str(device).split(":")[0]) != "cuda"


def resolve_batch_size(model, batch_size: int | str | None = AUTO_BATCH_SIZE, *, fast: bool = True,
                       **generate_kwargs) -> int | None:
    """The sentences a batch :func:`translate` decodes with these arguments: `batch_size` itself, or for ``"auto"``
    :func:`default_batch_size` of the search that decodes them (the fast path where it decodes these `generate`
    options and `fast` is set, else `generate`).

    Raises:
        ValueError: a string other than ``"auto"``.
    """
    def auto() -> int:
        from ..decoding import fast_path_decodes

        num_beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
        return default_batch_size(num_beams, fast and fast_path_decodes(model, **generate_kwargs), model.device.type)

    return given_or_auto(batch_size, auto)


def translate_sentences(model, tokenizer, sources: Sequence[str], num_beams: int = 4,
                        batch_size: int | str | None = AUTO_BATCH_SIZE,
                        desc: str = "translating", progress: bool = True, **generate_kwargs) -> list[str]:
    """The best translation's text of each source, in input order (:func:`translate` with defaults)."""
    translations = translate(model, tokenizer, sources, batch_size=batch_size, desc=desc, progress=progress,
                             num_beams=num_beams, **generate_kwargs)
    return [translation.text for translation in translations]


