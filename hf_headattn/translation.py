r"""Translating text with a saved model: the one place in the package that turns sentences into translations.

    hf-headattn-translate --model runs/de-en --input test.de --output test.en [--num_beams 5]
    hf-headattn-translate --model runs/de-en --nbest 3 --num_beams 5 --alignments --output_format jsonl < in.de

:func:`translate` reads nothing and writes nothing: it takes a model, its tokenizer and a list of sentences, and
returns one :class:`Translation` per sentence, in input order. In between:

* blank (or whitespace-only) lines are not sent to the model and translate to nothing (a model would invent text
  for them);
* the other sentences are sorted by token length (longest first) and packed into batches of at most
  ``batch_size`` sentences and, with ``max_tokens``, at most that many padded source tokens (fairseq's
  ``--max-tokens``), so that a batch holds sentences of similar length and little padding;
* under ``torchrun`` / ``accelerate launch`` Accelerate's ``PartialState.split_between_processes`` gives each
  process its share of the batches and ``gather_object`` brings the translations back, so every process returns
  the whole list in input order;
* each batch goes through ``model.generate`` (greedy, beam search or sampling, with ``nbest`` hypotheses);
* with ``scores`` or ``alignments``, one teacher-forced pass over the chosen hypotheses gives their scores and
  cross-attention (every decoding step depends only on the source and the prefix, so the pass computes what
  decoding computed, per-step state of the constrained variants included).

**Scores.** A hypothesis' score is the model's log-probability of its tokens (the end-of-sentence token included)
divided by ``length ** length_penalty``, length counting the generated tokens: the score beam search ranks by
(``generate``'s ``sequences_scores``), computed the same way for greedy and sampled output. n-best lists are sorted
by it, best first.

**Alignments** (Pharaoh ``i-j`` pairs: source word i, target word j, 0-based, words split at whitespace of the
source line and of the detokenised translation). The cross-attention is reduced to one source distribution per
target token: Transformers average the heads of one decoder layer (``alignment_layer``; by default the last layer,
which aligns best of the 3 layers of the Multi30k models in RESULTS.md, while Garg et al., 2019 found the
penultimate of 6 best); the LSTM family has one attention, averaged over its heads. ``alignment_heads="hop"`` weighs the heads instead by the model's own weights
over heads (the second hop of multi-hop models with dependent hops, DHICM's head importances). Every target token
links to the source word of its highest-weighted source token, special tokens excluded; a token whose attention
on the source words is exactly zero (all of it on the end-of-sentence token or on the constrained variants' sink)
links to nothing, so sparse and constrained attention leave words unaligned where their weights say so. A target
word links to every source word one of its tokens links to.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cli import HelpFormatter, UnderscoreArgumentParser, add_verbose_argument, configure_logging
from .output_files import with_default_permissions

# torch, Transformers and the models are imported where they are used, so that `--help` is instant.

__all__ = [
    "ALIGNMENT_HEADS",
    "Hypothesis",
    "HypothesisAttention",
    "Translation",
    "align",
    "default_alignment_layer",
    "length_sorted_batches",
    "main",
    "quantize",
    "read_lines",
    "translate",
    "translate_sentences",
]

logger = logging.getLogger(__name__)

ALIGNMENT_HEADS = ("mean", "hop")
OUTPUT_FORMATS = ("text", "jsonl")
DTYPES = ("auto", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "int8")
DECODINGS = ("fast", "generate")
# The command's batches when neither --batch_size nor --max_tokens is given: 128 sentences (with beam 5 on 2 CPU
# cores 1.25x faster than 32, and faster than 256, whose [rows, vocab] logits no longer stay in cache; measured on
# Multi30k's test set), and at most 4,096 padded source tokens so that a file of long sentences gets smaller batches.
DEFAULT_BATCH_SIZE = 128
DEFAULT_MAX_TOKENS = 4096
LISTED_LINES = 10  # line numbers a truncation warning names before it only counts


@dataclass
class HypothesisAttention:
    """Where the model looked while producing one hypothesis (``translate(..., attention=True)``), read from the
    teacher-forced pass that scores and aligns it; what the web demo (``hf_headattn.app``) draws.

    Tokens as the model read and produced them (the source cut as it was read; the target from its first token
    through its end of sentence); each token's word index (-1: special tokens), words as the alignment counts
    them; ``cross_attentions``, one [heads, target tokens, source tokens] tensor per decoder layer (heads differ
    between layers where some were pruned; the LSTM family: its one source attention); ``alignment_attention``
    [target tokens, source tokens], the reduction the Pharaoh alignment reads; ``head_importances``, the model's
    weights over heads: module name -> [tokens, heads] (DHICM and dependent multi-hop modules; ``"source
    attention"`` for the LSTM's dependent hops), tokens being the source's for encoder modules, else the
    target's."""

    source_tokens: list[str]
    target_tokens: list[str]
    source_words: list[int]
    target_words: list[int]
    cross_attentions: "tuple[torch.Tensor, ...]"  # noqa: F821  (torch is imported where it is used)
    alignment_attention: "torch.Tensor"  # noqa: F821
    head_importances: dict = field(default_factory=dict)


@dataclass
class Hypothesis:
    """One translation of a sentence: its text, its score (None unless asked for), its Pharaoh alignment and,
    with ``translate(..., attention=True)``, its attention (:class:`HypothesisAttention`; never written out)."""

    text: str
    score: float | None = None
    alignment: str | None = None
    attention: HypothesisAttention | None = field(default=None, repr=False, compare=False)


@dataclass
class Translation:
    """A source sentence and its hypotheses, best first (none for a blank line)."""

    source: str
    hypotheses: list[Hypothesis] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The best hypothesis' text ("" for a blank line)."""
        return self.hypotheses[0].text if self.hypotheses else ""


# ------------------------------------------------------------------------------------------------ input
def read_lines(path: str | Path | None) -> list[str]:
    """The lines of a UTF-8 text file (``None`` or ``"-"``: standard input), without their line ends.

    Lines end at "\\n" (a "\\r" before it is dropped), never at the other characters `str.splitlines` breaks at.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: bytes that are not UTF-8, naming the file, the line and the byte offset in it.
    """
    if path is None or str(path) == "-":
        name, data = "<stdin>", sys.stdin.buffer.read()
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"Input file not found: {path}")
        name, data = str(path), path.read_bytes()
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{name}, line {number}: not UTF-8 (byte {raw[error.start]:#04x} at offset "
                             f"{error.start} of the line); the input must be UTF-8 text") from None
        lines.append(line.removeprefix("\ufeff") if number == 1 else line)
    return [line.removesuffix("\r") for line in lines]


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


def quantize(model, method: str = "int8"):
    """`model` with its `nn.Linear` layers replaced by their int8 dynamically quantized versions (weights stored in
    int8, activations quantized per batch at run time; torch's `quantize_dynamic`), for CPU inference. The attention
    kernels, embeddings, layer norms and LSTM cells keep their float weights, and so do the linear layers a variant
    multiplies by directly (its `weight_read_linears`, e.g. DHICM's W), so every variant runs quantized.

    Raises:
        ValueError: a method other than ``"int8"``, or a model that is not on the CPU.
    """
    import warnings

    import torch

    if method not in QUANTIZATIONS[1:]:
        raise ValueError(f"Unknown quantization {method!r}; accepted: {', '.join(QUANTIZATIONS[1:])}")
    if model.device.type != "cpu":
        raise ValueError(f"int8 dynamic quantization runs on the CPU; the model is on {model.device}")
    kept_float = {f"{name}.{linear}" for name, module in model.named_modules()
                  for linear in getattr(module, "weight_read_linears", ())}
    linears = {name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name not in kept_float}
    with warnings.catch_warnings():  # torch announces the move of this API to torchao; it works as documented
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(model, linears, dtype=torch.qint8)
    fold_final_logits_bias(quantized)
    return quantized


def fold_final_logits_bias(model) -> None:
    """Move a Transformer's `final_logits_bias` into its int8 output layer's bias, where the quantized GEMM adds it,
    instead of a separate pass over the [rows, vocab] logits at every decoding step (4% of int8 beam search on
    Multi30k). Models whose saved code predates this (no `final_logits_bias_optional`) and the LSTM family keep
    theirs."""
    import torch

    head = getattr(model, "lm_head", None)
    bias = getattr(model, "final_logits_bias", None)
    if (not isinstance(head, torch.ao.nn.quantized.dynamic.Linear) or bias is None
            or not getattr(model, "final_logits_bias_optional", False)):
        return
    folded = bias.reshape(-1).to(torch.float32)
    if head.bias() is not None:
        folded = folded + head.bias()
    head.set_weight_bias(head.weight(), folded)
    model.final_logits_bias = None


# The CPU features (Linux /proc/cpuinfo flags) that give PyTorch native arithmetic in a half-precision dtype; without
# one of them it is emulated, several times slower than float32 (float16 matrix products ~5x on an AVX-512 EPYC).
CPU_DTYPE_FLAGS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}


def cpu_has_any_flag(flags: Sequence[str]) -> bool:
    """Whether this machine's CPU reports one of `flags` (True where /proc/cpuinfo cannot be read: no warning on
    a guess)."""
    try:
        reported = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return True
    return any(flag in reported for flag in flags)


def _line_numbers(numbers: list[int]) -> str:
    shown = ", ".join(str(number) for number in numbers[:LISTED_LINES])
    return shown + (f" and {len(numbers) - LISTED_LINES} more" if len(numbers) > LISTED_LINES else "")


# ------------------------------------------------------------------------------------------------ decoding
def translate(
    model,
    tokenizer,
    sources: Sequence[str],
    *,
    nbest: int = 1,
    batch_size: int | None = DEFAULT_BATCH_SIZE,
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
            :func:`length_sorted_batches`).
        scores: Give each hypothesis its score (see the module's docstring); implied by ``nbest > 1``.
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
        ValueError: ``nbest`` above ``num_beams``, an unknown ``alignment_heads``, a layer the model lacks, or a
            too-long source with ``strict``.
    """
    from tqdm.auto import tqdm

    num_beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
    if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
        raise ValueError(f"nbest must be a positive int, got {nbest!r}")
    if nbest > num_beams:
        raise ValueError(f"nbest={nbest} is more than num_beams={num_beams}: beam search keeps num_beams "
                         "hypotheses, so ask for at most that many (or raise num_beams)")
    if alignment_heads not in ALIGNMENT_HEADS:
        raise ValueError(f"Unknown alignment_heads={alignment_heads!r}; accepted: {', '.join(ALIGNMENT_HEADS)}")
    if alignments or attention:
        _alignment_layer_index(model, alignment_layer)  # a bad layer fails before any decoding
    sources = list(sources)
    kept = [index for index, source in enumerate(sources) if source.strip()]
    lengths = [len(ids) for ids in tokenizer([sources[index] for index in kept], return_token_type_ids=False,
                                             verbose=False)["input_ids"]] if kept else []
    limit = source_token_limit(model, tokenizer)
    too_long = [kept[k] + 1 for k, length in enumerate(lengths) if limit is not None and length > limit]
    if too_long and strict:
        raise ValueError(f"{len(too_long)} line(s) are longer than the model's {limit} tokens: line "
                         f"{_line_numbers(too_long)}; shorten or split them (or translate them cut: leave out strict)")
    state = _distributed_state()
    if too_long and (state is None or state.is_main_process):
        logger.warning(f"{len(too_long)} line(s) longer than the model's {limit} tokens are translated cut to "
                       f"{limit}: line {_line_numbers(too_long)}")
    batches = [[kept[k] for k in batch] for batch in length_sorted_batches(
        [min(length, limit or length) for length in lengths], batch_size, max_tokens)]

    results: dict[int, list[Hypothesis]] = {}
    with (state.split_between_processes(batches) if state else contextlib.nullcontext(batches)) as own_batches:
        bar = tqdm(total=sum(len(batch) for batch in own_batches), desc=desc, unit="sentence",
                   disable=not progress or (state is not None and not state.is_main_process))
        for batch in own_batches:
            texts = [sources[index] for index in batch]
            hypotheses = _translate_batch(model, tokenizer, texts, nbest=nbest, limit=limit, fast=fast,
                                          scores=scores or nbest > 1, alignments=alignments,
                                          alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                          attention=attention, generate_kwargs=generate_kwargs)
            results.update(zip(batch, hypotheses))
            bar.update(len(batch))
        bar.close()
    if state is not None:
        from accelerate.utils import gather_object

        results = dict(item for part in gather_object([list(results.items())]) for item in part)
    return [Translation(source, results.get(index, [])) for index, source in enumerate(sources)]


def _distributed_state():
    """Accelerate's process state when this runs under torchrun / accelerate launch with several processes."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())  # without cpu=True, CPU processes would not form a group


def _translate_batch(model, tokenizer, texts, *, nbest, limit, fast, scores, alignments, alignment_layer,
                     alignment_heads, generate_kwargs, attention=False) -> list[list[Hypothesis]]:
    from .decoding import generate_sequences

    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=limit is not None, max_length=limit,
                      return_token_type_ids=False).to(model.device)
    sequences = generate_sequences(model, batch["input_ids"], batch["attention_mask"], fast=fast,
                                   num_return_sequences=nbest, **generate_kwargs)
    sequences = sequences.reshape(len(texts) * nbest, -1)
    decoded = [text.replace("\n", " ").strip()
               for text in tokenizer.batch_decode(sequences, skip_special_tokens=True)]
    hypotheses = [Hypothesis(text) for text in decoded]
    if scores or alignments or attention:
        length_penalty = generate_kwargs.get("length_penalty", model.generation_config.length_penalty)
        length_penalty = 1.0 if length_penalty is None else length_penalty
        scored = _teacher_forced(model, batch["input_ids"].repeat_interleave(nbest, 0),
                                 batch["attention_mask"].repeat_interleave(nbest, 0), sequences,
                                 length_penalty=length_penalty, alignments=alignments or attention,
                                 alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                 keep_attention=attention)
        source_words = _source_word_indices(tokenizer, texts, batch["input_ids"], limit)
        for k, (hypothesis, (score, reduced, kept)) in enumerate(zip(hypotheses, scored)):
            hypothesis.score = score
            if alignments or attention:
                target_ids = sequences[k, 1:1 + reduced.shape[0]].tolist()  # up to its end of sentence
                target_words = _decoded_word_indices(tokenizer, target_ids)
            if alignments:
                hypothesis.alignment = _pharaoh(reduced, source_words[k // nbest], target_words)
            if attention:
                source_ids = batch["input_ids"][k // nbest, :int(batch["attention_mask"][k // nbest].sum())].tolist()
                hypothesis.attention = HypothesisAttention(
                    tokenizer.convert_ids_to_tokens(source_ids), tokenizer.convert_ids_to_tokens(target_ids),
                    source_words[k // nbest][:len(source_ids)], target_words,
                    alignment_attention=reduced[:, :len(source_ids)].cpu(),
                    **kept)
    grouped = [hypotheses[start:start + nbest] for start in range(0, len(hypotheses), nbest)]
    if scores:  # beam search ranks by the same score; sorting keeps the order exact under float rounding
        grouped = [sorted(group, key=lambda hypothesis: -hypothesis.score) for group in grouped]
    return grouped


def _teacher_forced(model, input_ids, attention_mask, sequences, *, length_penalty, alignments, alignment_layer,
                    alignment_heads, rows_per_pass: int = 64, keep_attention: bool = False):
    """(score, reduced cross-attention [target tokens, source tokens] or None, and with `keep_attention` the
    sequence's `cross_attentions` and `head_importances` for :class:`HypothesisAttention`, else None) of every
    sequence (which starts with the decoder start token), from teacher-forced passes of at most `rows_per_pass`
    sequences."""
    import inspect

    import torch

    # weights over heads: asked for when the reduction or the kept attention needs them and the model has them
    wants_importances = alignments and (alignment_heads == "hop" or (
        keep_attention and "output_head_importances" in inspect.signature(model.forward).parameters))

    eos = model.generation_config.eos_token_id
    eos_ids = torch.tensor(eos if isinstance(eos, list) else [eos], device=sequences.device)
    produced = sequences[:, 1:]
    is_eos = torch.isin(produced, eos_ids)
    real = (is_eos.int().cumsum(1) - is_eos.int()) == 0  # tokens up to and including the first end of sentence
    results = []
    for start in range(0, sequences.shape[0], rows_per_pass):
        rows = slice(start, start + rows_per_pass)
        with torch.inference_mode():
            outputs = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows],
                            decoder_input_ids=sequences[rows, :-1], use_cache=False, output_attentions=alignments,
                            **({"output_head_importances": True} if wants_importances else {}))
        log_probs = torch.log_softmax(outputs.logits.float(), dim=-1)
        token_log_probs = log_probs.gather(-1, produced[rows, :, None]).squeeze(-1) * real[rows]
        lengths = real[rows].sum(-1).clamp(min=1)
        sequence_scores = token_log_probs.sum(-1) / lengths.float() ** length_penalty
        attention = _reduced_attention(model, outputs, alignment_layer, alignment_heads) if alignments else None
        for k in range(sequence_scores.shape[0]):
            length = int(lengths[k])
            kept = _kept_attention(outputs, k, length, int(attention_mask[rows][k].sum())) if keep_attention else None
            results.append((sequence_scores[k].item(), attention[k, :length] if alignments else None, kept))
    return results


def _kept_attention(outputs, row: int, target_length: int, source_length: int) -> dict:
    """One sequence's cross-attention per layer ([heads, target, source] each) and head importances (module ->
    [tokens, heads]), cut to its real tokens, on the CPU (the fields of :class:`HypothesisAttention`)."""
    cross_attentions = tuple(layer[row, :, :target_length, :source_length].float().cpu()
                             for layer in outputs.cross_attentions)
    importances = getattr(outputs, "head_importances", None)
    if importances is not None and not isinstance(importances, dict):  # the LSTM family: its one source attention
        importances = {"source attention": importances}
    head_importances = {name: values[row, :source_length if name.startswith("encoder.") else target_length]
                        .float().cpu() for name, values in (importances or {}).items() if values is not None}
    return {"cross_attentions": cross_attentions, "head_importances": head_importances}


def default_alignment_layer(layers: int) -> int:
    """The decoder layer alignments are read from by default, of `layers`: the last."""
    return layers - 1


def _alignment_layer_index(model, alignment_layer: int | None) -> int:
    """The decoder layer alignments are read from (0 for the LSTM family, whose attention is one)."""
    layers = getattr(model.config, "decoder_layers", 1) if model.config.model_type != "headattn_rnn" else 1
    if alignment_layer is None:
        return default_alignment_layer(layers)
    if not -layers <= alignment_layer < layers:
        raise ValueError(f"alignment_layer={alignment_layer}: the model's decoder has {layers} attention layer(s) "
                         f"(accepted: {-layers} to {layers - 1})")
    return alignment_layer % layers


def _reduced_attention(model, outputs, alignment_layer, alignment_heads):
    """[sequences, target tokens, source tokens]: the chosen layer's cross-attention with its heads reduced."""
    import torch

    layer = _alignment_layer_index(model, alignment_layer)
    attention = outputs.cross_attentions[layer].float()  # [sequences, heads, target, source]
    if alignment_heads == "mean":
        return attention.mean(1)
    importances = outputs.head_importances
    if isinstance(importances, dict):  # Transformers: per attention module
        importances = importances.get(f"decoder.layers.{layer}.encoder_attn")
    if importances is None:
        raise ValueError(f"alignment_heads='hop': the cross-attention of decoder layer {layer} of this "
                         f"{model.config.model_type} model has no weights over heads (only multi-hop models with "
                         "dependent hops and DHICM have them); use alignment_heads='mean'")
    return torch.einsum("bth,bhts->bts", importances.float(), attention)


# ------------------------------------------------------------------------------------------------ words
def _word_of_character(text: str) -> list[int]:
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


def _source_word_indices(tokenizer, texts: list[str], input_ids, limit: int | None = None) -> list[list[int]]:
    """For each text, the word index of each source token position (-1: special tokens, padding), the text cut
    to `limit` tokens as the model read it."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(texts, return_offsets_mapping=True, return_special_tokens_mask=True,
                            return_token_type_ids=False, verbose=False, truncation=limit is not None,
                            max_length=limit)
        result = []
        for text, offsets, special in zip(texts, encoded["offset_mapping"], encoded["special_tokens_mask"]):
            characters = _word_of_character(text)
            words = []
            for (start, end), is_special in zip(offsets, special):
                inside = [characters[c] for c in range(start, min(end, len(text))) if characters[c] >= 0]
                words.append(inside[0] if inside and not is_special else -1)
            result.append(words)
        return result
    return [_decoded_word_indices(tokenizer, ids.tolist()) for ids in input_ids]


def _decoded_word_indices(tokenizer, ids: list[int]) -> list[int]:
    """Word index, in the detokenised text of `ids`, of each token (-1: special tokens and pure whitespace):
    a token that starts a new whitespace-separated word of the growing decoded prefix begins that word."""
    words, previous_text, previous_count = [], "", 0
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        count = len(text.split())
        changed = text.strip() != previous_text.strip() or count != previous_count
        words.append(count - 1 if changed and count else -1)
        previous_text, previous_count = text, count
    return words


def _pharaoh(attention, source_words: list[int], target_words: list[int]) -> str:
    """Pharaoh links from reduced attention [target tokens, source tokens] and the tokens' word indices."""
    import torch

    source_words = torch.tensor(source_words[: attention.shape[1]], dtype=torch.long)
    usable = source_words >= 0
    links = set()
    for t, target_word in enumerate(target_words[: attention.shape[0]]):
        if target_word < 0:
            continue
        row = torch.where(usable, attention[t, : len(source_words)].cpu(), torch.zeros(()))
        if row.max() > 0:  # exactly zero on every source word: the token links to nothing
            links.add((int(source_words[row.argmax()]), target_word))
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def align(model, tokenizer, sources: Sequence[str], targets: Sequence[str], *, batch_size: int = 32,
          alignment_layer: int | None = None, alignment_heads: str = "mean") -> list[str]:
    """Pharaoh word alignments of given translations (forced decoding): each target is fed to the decoder as if
    the model had produced it, and its words are aligned as :func:`translate` aligns hypotheses (words split at
    whitespace of both texts). Used to measure alignment error rates against reference alignments."""
    import torch

    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if alignment_heads not in ALIGNMENT_HEADS:
        raise ValueError(f"Unknown alignment_heads={alignment_heads!r}; accepted: {', '.join(ALIGNMENT_HEADS)}")
    _alignment_layer_index(model, alignment_layer)
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
        scored = _teacher_forced(model, batch["input_ids"], batch["attention_mask"], sequences, length_penalty=1.0,
                                 alignments=True, alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        source_words = _source_word_indices(tokenizer, texts, batch["input_ids"], limit)
        for k, (_, attention, _) in enumerate(scored):
            characters = _word_of_character(labels[k])
            target_words = []
            for (first, last), special in zip(target["offset_mapping"][k], target["special_tokens_mask"][k]):
                inside = [characters[c] for c in range(first, min(last, len(labels[k]))) if characters[c] >= 0]
                target_words.append(inside[0] if inside and not special else -1)
            results.append(_pharaoh(attention, source_words[k], target_words))
    return results


def translate_sentences(model, tokenizer, sources: Sequence[str], num_beams: int = 4, batch_size: int = 32,
                        desc: str = "translating", progress: bool = True, **generate_kwargs) -> list[str]:
    """The best translation's text of each source, in input order (:func:`translate` with defaults)."""
    translations = translate(model, tokenizer, sources, batch_size=batch_size, desc=desc, progress=progress,
                             num_beams=num_beams, **generate_kwargs)
    return [translation.text for translation in translations]


# ------------------------------------------------------------------------------------------------ the command
EXAMPLES = """examples:
  # a file, beam 5, with a progress bar
  hf-headattn-translate --model runs/de-en --input test.de --output test.en --num_beams 5 --progress
  # standard input to standard output
  echo "Ein Mann fährt Fahrrad." | hf-headattn-translate --model runs/de-en
  # 3-best lists with scores and word alignments, one JSON object per input line
  hf-headattn-translate --model runs/de-en --input test.de --output test.jsonl --num_beams 5 --nbest 3 \\
      --alignments --output_format jsonl
  # under several processes: each translates its share, the first writes the whole file in input order
  torchrun --nproc_per_node 2 -m hf_headattn.translation --model runs/de-en --input test.de --output test.en

output (--output_format text):
  one line per input line, line i translating input line i (a blank line stays blank);
  with --alignments: "translation ||| alignment" (Marian's convention);
  with --nbest N > 1: N lines per non-blank input line, "i ||| translation ||| score" (Moses' n-best
  convention, i counting input lines from 0), " ||| alignment" appended with --alignments.
output (--output_format jsonl): one object per input line, blank lines included:
  {"source": ..., "translations": [{"text": ..., "score": ..., "alignment": "0-0 1-2 ..."}]} (best first; empty
  for a blank line; "alignment" with --alignments).
score: the model's log-probability of the hypothesis (end of sentence included) divided by
  length ** length_penalty: the score beam search ranks by, computed alike for greedy and sampled output.
alignment: Pharaoh "i-j" pairs (source word i, target word j, 0-based, words split at whitespace) from the
  cross-attention of one decoder layer, heads averaged; the LSTM family: its attention, heads averaged.
"""


def make_parser() -> argparse.ArgumentParser:
    from .loading import DEVICES, add_trust_remote_code_argument

    parser = UnderscoreArgumentParser(
        prog="hf-headattn-translate", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Translate a text file (one sentence a line) or standard input with a model folder or Hub id.\n"
                    "Flags use Transformers' underscore spelling; the dashed spelling (--num-beams) works too.")
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help="a saved model folder, or a Hugging Face Hub id")
    add_trust_remote_code_argument(model, "--trust_remote_code")
    model.add_argument("--tokenizer", default=None, help="another tokenizer than the model's own (refused unless the "
                                                         "model was trained with it)")
    model.add_argument("--force", action="store_true",
                       help="only warn when --tokenizer is not the one the model was trained with")
    model.add_argument("--device", default="auto", help=f"{', '.join(DEVICES)} or cuda:N")
    model.add_argument("--dtype", default="auto", choices=DTYPES, help="weights' dtype (auto: as saved)")
    model.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                       help="int8: the linear layers quantized to int8 (dynamic quantization, CPU only)")
    files = parser.add_argument_group("input and output")
    files.add_argument("--input", default="-", help="UTF-8 text, one sentence a line (-: standard input)")
    files.add_argument("--output", default="-", help="where the translations go (-: standard output); written "
                                                     "to a temporary file renamed at the end")
    files.add_argument("--output_format", default="text", choices=OUTPUT_FORMATS, help="see below")
    files.add_argument("--nbest", type=int, default=1, help="hypotheses per sentence (at most --num_beams)")
    files.add_argument("--alignments", action="store_true", help="add Pharaoh word alignments (see below)")
    files.add_argument("--alignment_layer", type=int, default=None,
                       help="decoder layer of the alignments (negative: from the end; None: the last)")
    files.add_argument("--alignment_heads", default="mean", choices=ALIGNMENT_HEADS,
                       help="mean: heads averaged; hop: weighed by the model's weights over heads (multi-hop "
                            "models with dependent hops, DHICM)")
    decoding = parser.add_argument_group("decoding (None: the model's generation config)")
    decoding.add_argument("--num_beams", type=int, default=None, help="beam size (1: greedy)")
    decoding.add_argument("--max_new_tokens", type=int, default=None, help="longest translation in tokens")
    decoding.add_argument("--length_penalty", type=float, default=None,
                          help="exponent of the length dividing beam scores")
    decoding.add_argument("--no_repeat_ngram_size", type=int, default=None, help="forbid repeating n-grams of this size")
    decoding.add_argument("--decoding", default="fast", choices=DECODINGS,
                          help="fast: greedy and beam search that drop finished sentences from their batch (the "
                               "translations of generate); generate: Transformers' generate (sampling always uses it)")
    decoding.add_argument("--do_sample", action="store_true", help="sample instead of searching")
    decoding.add_argument("--top_k", type=int, default=None, help="sample from the k likeliest tokens")
    decoding.add_argument("--top_p", type=float, default=None, help="sample from the nucleus of this mass")
    decoding.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    decoding.add_argument("--seed", type=int, default=None, help="random seed (sampling)")
    batching = parser.add_argument_group("batching (sentences are sorted by length, output keeps input order)")
    batching.add_argument("--batch_size", type=int, default=None,
                          help=f"sentences per batch (default: {DEFAULT_BATCH_SIZE}, with --max_tokens "
                               f"{DEFAULT_MAX_TOKENS}, when neither is given; given one alone, the other has no limit)")
    batching.add_argument("--max_tokens", type=int, default=None, help="padded source tokens per batch")
    batching.add_argument("--strict", action="store_true",
                          help="refuse lines longer than the model takes (default: translate them cut, warning once)")
    shown = parser.add_argument_group("what is shown")
    shown.add_argument("--progress", action="store_true",
                       help="progress bar on stderr (default: when --input is a file and stderr a terminal)")
    shown.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no summary, errors only")
    add_verbose_argument(shown)
    return parser


GENERATION_FLAGS = ("num_beams", "max_new_tokens", "length_penalty", "no_repeat_ngram_size", "top_k", "top_p",
                    "temperature")


def _check_paths(parser, args) -> None:
    if args.input != "-" and not Path(args.input).is_file():
        parser.exit(1, f"{parser.prog}: error: input file not found: {args.input}\n")
    if args.output == "-":
        return
    output = Path(args.output)
    if args.input != "-" and output.resolve() == Path(args.input).resolve():
        parser.error(f"--output {args.output} is the input file: it would be overwritten while it is read")
    if output.is_dir():
        parser.error(f"--output {args.output} is a folder; name a file")
    if not output.parent.is_dir():
        parser.exit(1, f"{parser.prog}: error: cannot write --output {args.output}: its folder "
                       f"{output.parent} does not exist\n")


def _format(translation: Translation, index: int, args) -> str:
    """One input line's output, newline-terminated."""
    if args.output_format == "jsonl":
        hypotheses = [{"text": hypothesis.text, "score": hypothesis.score,
                       **({"alignment": hypothesis.alignment} if args.alignments else {})}
                      for hypothesis in translation.hypotheses]
        return json.dumps({"source": translation.source, "translations": hypotheses}, ensure_ascii=False) + "\n"
    if args.nbest == 1:
        best = translation.hypotheses[0] if translation.hypotheses else Hypothesis("", alignment="")
        return best.text + (f" ||| {best.alignment}" if args.alignments else "") + "\n"
    return "".join(f"{index} ||| {hypothesis.text} ||| {hypothesis.score:.6f}"
                   + (f" ||| {hypothesis.alignment}" if args.alignments else "") + "\n"
                   for hypothesis in translation.hypotheses)


def main(argv=None) -> None:
    """The `hf-headattn-translate` command (also `python -m hf_headattn.translation`)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if args.quiet:
        logging.getLogger("hf_headattn").setLevel(logging.ERROR)
    for name in ("nbest", "batch_size", "max_tokens", "num_beams", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive number, got {value}")
    if args.num_beams is not None and args.nbest > args.num_beams:
        parser.error(f"--nbest {args.nbest} is more than --num_beams {args.num_beams}: ask for at most num_beams "
                     "hypotheses (or raise --num_beams)")
    _check_paths(parser, args)
    try:
        sources = read_lines(args.input)  # a wrong encoding fails before the model loads
    except ValueError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    state = _distributed_state()
    writes = state is None or state.is_main_process
    temporary = None
    if args.output != "-" and writes:  # an unwritable output fails now, not after translating
        output = Path(args.output)
        try:
            temporary = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=output.parent, delete=False,
                                                    prefix=f".{output.name}.", suffix=".partial")
        except OSError as error:
            parser.exit(1, f"{parser.prog}: error: cannot write --output {args.output}: {error.strerror}\n")
    try:
        translations, seconds = _load_and_translate(parser, args, sources, state)
        if not writes:
            return
        text = "".join(_format(translation, index, args) for index, translation in enumerate(translations))
        if temporary is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            temporary.write(text)
            temporary.close()
            os.replace(with_default_permissions(temporary.name), args.output)
            temporary = None
    finally:
        if temporary is not None:  # interrupted or failed: no partial file under any name
            temporary.close()
            Path(temporary.name).unlink(missing_ok=True)
    if not args.quiet:
        translated = sum(bool(translation.hypotheses) for translation in translations)
        destination = "stdout" if args.output == "-" else args.output
        print(f"{translated:,} lines translated ({len(sources) - translated:,} blank) in {seconds:.1f} s, "
              f"{translated / max(seconds, 1e-9):.1f} lines/s -> {destination}", file=sys.stderr)


def _load_and_translate(parser, args, sources, state):
    import torch
    from transformers.utils import logging as transformers_logging

    from .loading import load_model_and_tokenizer, resolve_device

    if not args.verbose:  # the weights' loading bar says nothing a translator needs
        transformers_logging.disable_progress_bar()
    try:
        device = state.device if state is not None and args.device == "auto" else resolve_device(args.device)
        dtype = {"auto": "auto", "float32": torch.float32, "float16": torch.float16,
                 "bfloat16": torch.bfloat16}[args.dtype]
        model, tokenizer = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code, dtype=dtype,
                                                    tokenizer=args.tokenizer, force=args.force)
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: cannot load --model {args.model}: {error}\n")
    model.to(device)
    if device.type == "cpu" and args.dtype in CPU_DTYPE_FLAGS and not cpu_has_any_flag(CPU_DTYPE_FLAGS[args.dtype]):
        logger.warning(f"--dtype {args.dtype} on this CPU, which lacks {' and '.join(CPU_DTYPE_FLAGS[args.dtype])}: "
                       f"PyTorch emulates {args.dtype} arithmetic here, slower than float32; for a faster CPU "
                       "model use --quantize int8")
    if args.quantize != "none":
        if device.type != "cpu":
            parser.error(f"--quantize {args.quantize} runs on the CPU; use --device cpu (on {device}, use --dtype "
                         "float16 or bfloat16)")
        model = quantize(model, args.quantize)
    generate_kwargs = {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name) is not None}
    if args.do_sample:
        generate_kwargs["do_sample"] = True
    num_beams = generate_kwargs.get("num_beams", model.generation_config.num_beams or 1)
    if args.nbest > num_beams:
        parser.error(f"--nbest {args.nbest} is more than the model's num_beams {num_beams}: pass --num_beams")
    if args.seed is not None:
        from transformers import set_seed

        set_seed(args.seed)
    progress = not args.quiet and (args.progress or (args.input != "-" and sys.stderr.isatty()))
    started = time.perf_counter()
    try:
        batch_size, max_tokens = ((args.batch_size, args.max_tokens) if args.batch_size or args.max_tokens
                                  else (DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS))
        translations = translate(model, tokenizer, sources, nbest=args.nbest, batch_size=batch_size,
                                 max_tokens=max_tokens, scores=args.nbest > 1 or args.output_format == "jsonl",
                                 alignments=args.alignments, alignment_layer=args.alignment_layer,
                                 alignment_heads=args.alignment_heads, strict=args.strict,
                                 fast=args.decoding == "fast", progress=progress,
                                 desc=f"translating {Path(args.input).name if args.input != '-' else 'stdin'}",
                                 **generate_kwargs)
    except ValueError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    return translations, time.perf_counter() - started


if __name__ == "__main__":
    main()
