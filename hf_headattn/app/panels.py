"""What one panel of the web page shows for one model: the models offered, their translations of the input with
each hypothesis' attention, and the messages about what was cut or refused.

Everything comes from the model's translator (:class:`hf_headattn.translation.ModelTranslator`, through
:func:`hf_headattn.translation.translate`, the one place that turns text into translations) with ``attention=True``;
this module reads the fertility bounds from the encoder and says which layers the views
draw, and, for two panels whose models share a tokenizer, the second model's attention on the first's translations
(:class:`Comparison`, the difference view's). Nothing fails silently or hangs: empty input, lines beyond
``max_lines`` (named), sources longer than the model reads (the words left out are named), translations stopped by
``max_new_tokens`` or by the time limit, n-best above the beams and a model that failed to load each become a
message.

What the page shows of a model's attention it asks the model's config (this package's configs answer: `describe`,
`cross_attention_layers`, `cross_attention_variant`, `constrained_cross_attention`, `head_weighting_modules`); any
other Transformers encoder-decoder is drawn as plain attention.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..parallel_data import text_lines
from ..translation import HypothesisAttention, ModelTranslator, Translation, source_token_limit
from ..translation.alignments import decoded_word_indices, source_word_indices
from ..translation.teacher_forcing import teacher_forced

# torch and Transformers are imported where they are used.

__all__ = [
    "Comparison",
    "DemoInputError",
    "DemoModel",
    "LineResult",
    "PanelResult",
    "card_examples",
    "compare_panels",
    "describe_model",
    "forced_attention",
    "load_models",
    "load_through_own_code",
    "one_line",
    "page_examples",
    "run_with_time_limit",
    "same_tokenizer",
    "split_lines",
    "translate_panel",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_LINES = 8
DEFAULT_TIME_LIMIT = 60.0
DEFAULT_NUM_BEAMS = 4
DEFAULT_MAX_NEW_TOKENS = 64
MAX_BEAMS = 8
MAX_NEW_TOKENS = 256
EXAMPLES_SHOWN = 10
FALLBACK_EXAMPLE = "der kleine hund sieht die katze ."  # the text box's hint when no model card has examples
EMPTY_INPUT = "Nothing to translate: type a sentence in the box (one sentence a line), or pick an example."


@dataclass
class DemoModel:
    """A model the page offers: loaded, or the reason it could not be (`error`), and its example sentences."""

    name: str
    model: object | None = None
    tokenizer: object | None = None
    error: str | None = None
    examples: list[str] = field(default_factory=list)

    @property
    def description(self) -> str:
        return describe_model(self.model.config) if self.model is not None else f"not loaded: {self.error}"

    @property
    def translator(self) -> ModelTranslator:
        """The loaded model's translator (:func:`hf_headattn.translation.load_translator`'s, for a model)."""
        return ModelTranslator(self.model, self.tokenizer, self.name)


def load_through_own_code(name: str):
    """(model in eval mode, tokenizer) of a folder or Hub id through the code saved with it (``trust_remote_code``):
    how a Space without hf_headattn loads its models."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(name, trust_remote_code=True).eval()
    return model, AutoTokenizer.from_pretrained(name, trust_remote_code=True)


def load_models(names: Sequence[str], load: Callable[[str], tuple] = load_through_own_code,
                labels: Sequence[str] | None = None) -> list[DemoModel]:
    """Each of `names` loaded with `load` (name -> (model, tokenizer)), shown as its label (default: the name). A model
    that fails to load is kept with its error, which the page shows; the others work."""
    labels = list(labels) if labels is not None else list(names)
    if len(labels) != len(names):
        raise ValueError(f"{len(labels)} labels for {len(names)} models")
    models = []
    for name, label in zip(names, _unique(labels)):
        try:
            model, tokenizer = load(name)
        except Exception as error:  # shown in the page; the other models still work
            logger.warning("Cannot load model %s", name, exc_info=True)
            models.append(DemoModel(label, error=one_line(error)))
            continue
        models.append(DemoModel(label, model, tokenizer, examples=card_examples(name)))
    return models


def _unique(labels: Sequence[str]) -> list[str]:
    seen, unique = {}, []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return unique


def card_examples(name: str | Path) -> list[str]:
    """The source sentences of the model card's evaluation examples (the "The first test sentences" table that
    ``hf-headattn-hub card`` writes into README.md), when the folder or Hub repository has such a card; else none."""
    readme = Path(name) / "README.md"
    if not Path(name).is_dir():
        try:  # a Hub model's card (from_pretrained does not download it)
            from huggingface_hub import hf_hub_download

            readme = Path(hf_hub_download(str(name), "README.md"))
        except Exception:  # offline, no card, not a repository: the page shows no examples, nothing else changes
            logger.info("No model card with examples for %s", name, exc_info=True)
            return []
    if not readme.is_file():
        return []
    lines = readme.read_text(encoding="utf-8").splitlines()
    header = next((k for k, line in enumerate(lines) if re.fullmatch(r"\|\s*source\s*\|.*\|", line.strip())), None)
    if header is None:
        return []
    examples = []
    for line in lines[header + 2:]:  # after the header and its |---| row
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        source = cells[0].strip().replace("\\|", "|") if cells else ""
        if source and source not in examples:
            examples.append(source)
    return examples


def page_examples(models: Sequence[DemoModel], limit: int = EXAMPLES_SHOWN) -> list[str]:
    """The example sentences the page offers: the loaded models' card examples (:func:`card_examples`), each once,
    at most `limit`; the first is the text box's hint, :data:`FALLBACK_EXAMPLE` only when no card has any."""
    return list(dict.fromkeys(example for model in models for example in model.examples))[:limit]


def describe_model(config) -> str:
    """One line saying which attention the model uses where."""
    if not hasattr(config, "describe"):  # another Transformers model, or one saved before configs described it
        return f"{config.model_type} model"
    return config.describe()


@dataclass
class LineResult:
    """One translated input line: its number in the box (1-based), its translation (hypotheses with their attention)
    and, for constrained attention, each source token's fertility bound as the model read it."""

    number: int
    translation: Translation
    fertility: list[float] | None = None


@dataclass
class PanelResult:
    """What one panel shows: the model's translations of the input, messages about them, and what the views need
    to know of the model (layer names, head numbers, constrained layers) without the model."""

    model_name: str
    description: str = ""
    notices: list[str] = field(default_factory=list)
    error: str | None = None
    lines: list[LineResult] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)  # e.g. "layer 2 (csparsemax)"
    layer_labels: list[str] = field(default_factory=list)  # the same without the variant: "layer 2"
    layer_heads: list[list[int]] = field(default_factory=list)  # 1-based head numbers each layer keeps
    constrained_layers: dict[int, bool] = field(default_factory=dict)  # layer -> whether it has a sink
    alignment_layer: int = 0
    module_variants: dict[str, str] = field(default_factory=dict)  # module with weights over heads -> variant
    special_tokens: list[str] = field(default_factory=list)


class DemoInputError(ValueError):
    """Input the page refuses, with the message it shows."""


def split_lines(text: str | None, max_lines: int = DEFAULT_MAX_LINES) -> tuple[list[tuple[int, str]], list[str]]:
    """The non-blank lines of `text` with their 1-based numbers, at most `max_lines` of them, and notices naming
    the lines left out.

    Raises:
        DemoInputError: no non-blank line.
    """
    # lines end where they end in a file a command reads (not at U+2028 or a form feed inside a sentence)
    lines = [(number, line.strip()) for number, line in enumerate(text_lines(text or ""), start=1) if line.strip()]
    if not lines:
        raise DemoInputError(EMPTY_INPUT)
    notices = []
    if len(lines) > max_lines:
        left_out = [number for number, _ in lines[max_lines:]]
        notices.append(f"Only the first {max_lines} lines are translated here; left out: line"
                       f"{'s' * (len(left_out) > 1)} {_numbers(left_out)}.")
        lines = lines[:max_lines]
    return lines, notices


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(str(number) for number in numbers[:10])
    return shown + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")


def translate_panel(demo_model: DemoModel, lines: list[tuple[int, str]], *, num_beams: int = DEFAULT_NUM_BEAMS,
                    nbest: int = 1, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    time_limit: float = DEFAULT_TIME_LIMIT) -> PanelResult:
    """Translate `lines` ((number, text) pairs, from :func:`split_lines`) with one model, keeping each hypothesis'
    attention, and say what was cut: sources longer than the model reads and translations that stopped before their
    end of sentence. Decoding stops after `time_limit` seconds (``generate``'s ``max_time``).

    Raises:
        DemoInputError: `nbest` above `num_beams`, or settings out of range.
    """
    result = PanelResult(demo_model.name, demo_model.description)
    if demo_model.model is None:
        result.error = f"Model {demo_model.name} could not be loaded: {demo_model.error}"
        return result
    num_beams, nbest, max_new_tokens = int(num_beams), int(nbest), int(max_new_tokens)
    if not 1 <= num_beams <= MAX_BEAMS:
        raise DemoInputError(f"Beams must be between 1 and {MAX_BEAMS}; got {num_beams}.")
    if nbest > num_beams:
        raise DemoInputError(f"n-best ({nbest}) is more than the beams ({num_beams}): beam search keeps only as many "
                             "hypotheses as beams, so raise the beams or lower n-best.")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise DemoInputError(f"Max new tokens must be between 1 and {MAX_NEW_TOKENS}; got {max_new_tokens}.")
    model, tokenizer = demo_model.model, demo_model.tokenizer
    _describe_layers(model.config, result)
    result.special_tokens = list(tokenizer.all_special_tokens)
    started = time.perf_counter()
    translations = demo_model.translator.translate(
        [text for _, text in lines], nbest=nbest, batch_size=len(lines), scores=True, alignments=True,
        attention=True, fast=True, num_beams=num_beams, max_new_tokens=max_new_tokens, max_time=time_limit)
    seconds = time.perf_counter() - started
    fertility = _fertility(model, tokenizer, [text for _, text in lines]) if result.constrained_layers else None
    for k, ((number, _), translation) in enumerate(zip(lines, translations)):
        result.lines.append(LineResult(number, translation, fertility[k] if fertility else None))
    result.notices += _cut_source_notices(result, tokenizer, source_token_limit(model, tokenizer))
    result.notices += _cut_translation_notices(result, tokenizer, max_new_tokens, time_limit, seconds)
    return result


def _describe_layers(config, result: PanelResult) -> None:
    """Fill the model facts the views need: layer names, kept heads, constrained layers, the alignment's layer."""
    if not hasattr(config, "cross_attention_layers"):  # another Transformers encoder-decoder: plain attention
        layers, heads = config.decoder_layers, config.decoder_attention_heads
        result.layer_labels = [f"layer {layer + 1}" for layer in range(layers)]
        result.layer_names = list(result.layer_labels)
        result.layer_heads = [list(range(1, heads + 1))] * layers
        result.alignment_layer = layers - 1
        return
    for layer in range(config.cross_attention_layers):
        name, _ = config.cross_attention_variant(layer)
        result.layer_labels.append(config.cross_attention_label(layer))
        result.layer_names.append(f"{config.cross_attention_label(layer)} ({name})")
        result.layer_heads.append([head + 1 for head in config.cross_attention_heads(layer)])
        sink = config.constrained_cross_attention(layer)
        if sink is not None:
            result.constrained_layers[layer] = sink
    result.alignment_layer = config.cross_attention_layers - 1  # translate's default (default_alignment_layer)
    result.module_variants = config.head_weighting_modules()


def _fertility(model, tokenizer, texts: list[str]) -> list[list[float]]:
    """Each text's per-token fertility bound, as the encoder computes it for the constrained attention (the texts
    cut as the model reads them)."""
    import torch

    limit = source_token_limit(model, tokenizer)
    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=limit is not None, max_length=limit,
                      return_token_type_ids=False).to(model.device)
    with torch.inference_mode():
        fertility = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).fertility
    return [fertility[k, :int(batch["attention_mask"][k].sum())].float().tolist() for k in range(len(texts))]


def _cut_source_notices(result: PanelResult, tokenizer, limit: int | None) -> list[str]:
    notices = []
    for line in result.lines:
        if not line.translation.hypotheses or limit is None:
            continue
        length = len(tokenizer(line.translation.source, return_token_type_ids=False)["input_ids"])
        if length <= limit:
            continue
        words = line.translation.source.split()
        read = max(line.translation.hypotheses[0].attention.source_words, default=-1) + 1
        left_out = " ".join(words[read:])
        notices.append(f"Line {line.number} is {length} tokens long, and this model reads at most {limit}: it "
                       f"translated the first {read} of its {len(words)} words and left out “{left_out}”.")
    return notices


def _cut_translation_notices(result: PanelResult, tokenizer, max_new_tokens: int, time_limit: float,
                             seconds: float) -> list[str]:
    """One notice per reason naming the translations that stopped before their end of sentence."""
    stopped: dict[str, list[str]] = {}
    for line in result.lines:
        for rank, hypothesis in enumerate(line.translation.hypotheses, start=1):
            tokens = hypothesis.attention.target_tokens
            if tokens and tokens[-1] == tokenizer.eos_token:
                continue
            if len(tokens) >= max_new_tokens:
                why = f"they reached max new tokens ({max_new_tokens}); raise it to let them finish"
            elif seconds >= time_limit:
                why = f"decoding reached the time limit of {time_limit:g} s"
            else:
                why = "decoding stopped early"
            many = len(line.translation.hypotheses) > 1
            stopped.setdefault(why, []).append(f"line {line.number}" + (f" #{rank}" if many else ""))
    return [f"Cut translations ({', '.join(which)}): no end of sentence, as {why}."
            for why, which in stopped.items()]


@dataclass
class Comparison:
    """What the difference view of two panels needs: the second panel's model's attention on each hypothesis of the
    first panel (teacher-forced, :func:`forced_attention`), by "line index:hypothesis index", so both maps have the
    same rows and columns; or why there is none (`refusal`: the models' tokenizers differ)."""

    refusal: str | None = None
    forced: dict[str, HypothesisAttention] = field(default_factory=dict)


def compare_panels(first: DemoModel, second: DemoModel, first_result: PanelResult) -> Comparison:
    """The :class:`Comparison` of two panels: `second`'s attention on each translation `first` made, when the two
    models share a tokenizer (else the refusal the page shows)."""
    if not same_tokenizer(first.tokenizer, second.tokenizer):
        return Comparison(refusal=f"No difference view: {first.name} and {second.name} have different tokenizers, so "
                                  "their attention maps have different tokens for rows and columns. It compares two "
                                  "models that share a tokenizer.")
    comparison = Comparison()
    for k, line in enumerate(first_result.lines):
        for rank, hypothesis in enumerate(line.translation.hypotheses):
            comparison.forced[f"{k}:{rank}"] = forced_attention(second.model, second.tokenizer, line.translation.source,
                                                                hypothesis.attention.target_tokens)
    return comparison


def same_tokenizer(first, second) -> bool:
    """Whether two tokenizers turn text into the same tokens: the same pipeline (normaliser, pre-tokenizer, model
    with its vocabulary, post-processor, added tokens) for fast tokenizers, else the same class and vocabulary."""
    if first is second:
        return True

    def pipeline(tokenizer):
        if getattr(tokenizer, "is_fast", False):
            described = json.loads(tokenizer.backend_tokenizer.to_str())
            for setting in ("truncation", "padding"):  # how the last call cut and padded, not how it tokenizes
                described.pop(setting, None)
            return described
        return type(tokenizer).__name__, sorted(tokenizer.get_vocab().items()), list(tokenizer.all_special_tokens)

    return pipeline(first) == pipeline(second)


def forced_attention(model, tokenizer, source: str, target_tokens: Sequence[str]) -> HypothesisAttention:
    """`model`'s attention while reading `target_tokens` (another model's hypothesis, through the same tokenizer,
    its end of sentence included) as its translation of `source`: one teacher-forced pass, as
    :func:`~hf_headattn.translation.translate` reads its own hypotheses."""
    import torch

    limit = source_token_limit(model, tokenizer)
    batch = tokenizer([source], return_tensors="pt", truncation=limit is not None, max_length=limit,
                      return_token_type_ids=False).to(model.device)
    target_ids = tokenizer.convert_tokens_to_ids(list(target_tokens))
    sequences = torch.tensor([[model.config.decoder_start_token_id, *target_ids]], device=model.device)
    ((_, reduced, kept),) = teacher_forced(model, batch["input_ids"], batch["attention_mask"], sequences,
                                           length_penalty=1.0, alignments=True, alignment_layer=None,
                                           alignment_heads="mean", keep_attention=True)
    source_ids = batch["input_ids"][0].tolist()
    return HypothesisAttention(tokenizer.convert_ids_to_tokens(source_ids), list(target_tokens),
                               source_word_indices(tokenizer, [source], batch["input_ids"], limit)[0],
                               decoded_word_indices(tokenizer, target_ids), alignment_attention=reduced.cpu(), **kept)


def run_with_time_limit(function: Callable, seconds: float):
    """`function()`'s result, or TimeoutError after `seconds` (the call goes on in its thread until it ends; the
    translation inside stops by itself at the same limit through ``max_time``)."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return executor.submit(function).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"No answer within {seconds:g} s: try fewer or shorter lines, fewer beams or fewer "
                           "new tokens.") from None
    finally:
        executor.shutdown(wait=False)


def one_line(error: BaseException) -> str:
    """An exception as one line for the page: its type and message, cut at 300 characters."""
    text = " ".join(str(error).split()) or "(no message)"
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(error).__name__}: {text}"
