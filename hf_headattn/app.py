r"""A web demo: translate in a browser and see where each model's attention goes, two models side by side.

    hf-headattn-app --model runs/demo/model --model runs/demo-csparsemax/model [--port 7860]
    python -m hf_headattn.app --model runs/demo/model          # the same; then open http://127.0.0.1:7860

The page (Gradio; ``pip install hf_headattn[app]``) has a text box (one sentence a line), the decoding settings
(beams, n-best, max new tokens) and a Translate button. For each of two panels, each showing one of the loaded
models:

* the translations with their scores (n-best lists, best first);
* the cross-attention as a heat map of source words x target words, for any decoder layer and head, their mean, or
  the reduction the word alignment reads (one layer's heads averaged);
* the Pharaoh alignment drawn as links between the words;
* the weights over heads of DHICM modules (head importances) and of multi-hop attention with dependent hops, as bars;
* for csoftmax / csparsemax, each head's cumulative attention over the whole translation against each source token's
  fertility bound.

Everything comes from :func:`hf_headattn.translation.translate` with ``attention=True`` (the one place that turns
text into translations); this module reads the fertility bounds from the encoder and draws. Words are what splitting
at whitespace gives, as the alignments count them: a word's cell sums the attention its source tokens got, averaged
over the word's target tokens.

Nothing fails silently or hangs: empty input, lines beyond ``max_lines`` (named), sources longer than the model reads
(the words left out are named), translations stopped by ``max_new_tokens`` or by the time limit, n-best above the
beams and a model that failed to load each show a message in the page; errors are logged with their traceback and
shown as one line, never as a stack trace. Requests wait in Gradio's queue (``concurrency_limit`` at a time, at most
``queue_size`` waiting) and each translation stops at ``time_limit`` seconds.

Travels into Hugging Face Spaces: ``hf-headattn-hub space`` copies this module with ``translation.py`` and ``cli.py``
into the Space folder, whose models then load through their own code (``trust_remote_code``). So this module imports,
at module level and in everything the page runs, only those two modules, the standard library, torch, Transformers
and gradio; the command's model loading (``.loading``) is imported in :func:`main` alone.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import html
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cli import HelpFormatter, UnderscoreArgumentParser, add_verbose_argument, configure_logging
from .translation import Translation, source_token_limit, translate

# torch, Transformers and gradio are imported where they are used, so that `--help` is instant.

__all__ = [
    "DemoModel",
    "PanelResult",
    "build_demo",
    "card_examples",
    "describe_model",
    "launch",
    "load_models",
    "load_through_own_code",
    "main",
    "render_panel",
    "translate_panel",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 7860
DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_LINES = 8
DEFAULT_TIME_LIMIT = 60.0
DEFAULT_CONCURRENCY = 1  # one translation at a time: a CPU machine (a free Space has 2 cores) is busy with one
DEFAULT_QUEUE_SIZE = 16
DEFAULT_NUM_BEAMS = 4
DEFAULT_MAX_NEW_TOKENS = 64
MAX_BEAMS = 8
MAX_NEW_TOKENS = 256
PANELS = 2
EXAMPLES_SHOWN = 10
CONSTRAINED = ("csoftmax", "csparsemax")
ALIGNMENT_VIEW = "alignment"  # the heads choice that shows what the alignment reads
MEAN_VIEW = "mean"
DEFAULT_TITLE = "hf_headattn: translate and compare attention"
EMPTY_INPUT = "Nothing to translate: type a sentence in the box (one sentence a line), or pick an example."
# A row of word attention summing to less than this left the rest on no source token (the constrained variants' sink)
FULL_ROW = 0.999
HEAD_COLOURS = ("#7c3aed", "#db2777", "#0891b2", "#65a30d", "#ea580c", "#4f46e5", "#0d9488", "#ca8a04")


# ------------------------------------------------------------------------------------------------ models
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
            models.append(DemoModel(label, error=_one_line(error)))
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


def describe_model(config) -> str:
    """One line saying which attention the model uses where."""
    if config.model_type == "headattn_rnn":
        hops = f" x {config.num_hops} hops ({config.hop_mode})" if config.num_hops > 1 else ""
        text = (f"LSTM encoder-decoder; source attention: {config.attention_transform}, {config.num_heads} "
                f"head(s){hops}")
        return text + (f"; fertility {config.fertility}" if config.attention_transform in CONSTRAINED else "")
    if config.model_type != "headattn":
        return f"{config.model_type} model"
    parts = []
    for site, label in (("encoder_self_attention", "encoder self-attention"),
                        ("decoder_self_attention", "decoder self-attention"), ("cross_attention", "cross-attention")):
        layers = config.encoder_layers if site == "encoder_self_attention" else config.decoder_layers
        names = [config.attention_variant(site, layer)[0] for layer in range(layers)]
        parts.append(f"{label}: {names[0]}" if len(set(names)) == 1 else f"{label}: {' / '.join(names)} (by layer)")
    fertility = f"; fertility {config.fertility}" if config.uses_fertility() else ""
    return f"Transformer, {config.decoder_layers} decoder layers; " + "; ".join(parts) + fertility


# ------------------------------------------------------------------------------------------------ translating
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
    lines = [(number, line.strip()) for number, line in enumerate((text or "").splitlines(), start=1) if line.strip()]
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
    translations = translate(model, tokenizer, [text for _, text in lines], nbest=nbest, batch_size=len(lines),
                             scores=True, alignments=True, attention=True, num_beams=num_beams,
                             max_new_tokens=max_new_tokens, max_time=time_limit)
    seconds = time.perf_counter() - started
    fertility = _fertility(model, tokenizer, [text for _, text in lines]) if result.constrained_layers else None
    for k, ((number, _), translation) in enumerate(zip(lines, translations)):
        result.lines.append(LineResult(number, translation, fertility[k] if fertility else None))
    result.notices += _cut_source_notices(result, tokenizer, source_token_limit(model, tokenizer))
    result.notices += _cut_translation_notices(result, tokenizer, max_new_tokens, time_limit, seconds)
    return result


def _describe_layers(config, result: PanelResult) -> None:
    """Fill the model facts the views need: layer names, kept heads, constrained layers, the alignment's layer."""
    if config.model_type == "headattn_rnn":
        result.layer_names = [f"source attention ({config.attention_transform})"]
        result.layer_heads = [list(range(1, config.num_heads + 1))]
        if config.attention_transform in CONSTRAINED:
            result.constrained_layers = {0: config.sink != "none"}
        if config.num_hops > 1 and config.hop_mode == "dependent":
            result.module_variants = {"source attention": f"multi-hop ({config.num_hops} dependent hops), last hop"}
        return
    if config.model_type != "headattn":  # another Transformers encoder-decoder: plain attention, all heads kept
        layers, heads = config.decoder_layers, config.decoder_attention_heads
        result.layer_names = [f"layer {layer + 1}" for layer in range(layers)]
        result.layer_heads = [list(range(1, heads + 1))] * layers
        result.alignment_layer = layers - 1
        return
    for layer in range(config.decoder_layers):
        name, options = config.attention_variant("cross_attention", layer)
        result.layer_names.append(f"layer {layer + 1} ({name})")
        result.layer_heads.append([head + 1 for head in config.kept_heads("cross_attention", layer)])
        if name in CONSTRAINED:
            result.constrained_layers[layer] = bool(options.get("sink", True))
    result.alignment_layer = config.decoder_layers - 1  # translate's default (default_alignment_layer)
    for module, (site, layer) in config.attention_modules().items():
        name, _ = config.attention_variant(site, layer)
        if name in ("dhicm", "multihop"):
            result.module_variants[module] = name


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


def _one_line(error: BaseException) -> str:
    """An exception as one line for the page: its type and message, cut at 300 characters."""
    text = " ".join(str(error).split()) or "(no message)"
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(error).__name__}: {text}"


# ------------------------------------------------------------------------------------------------ views
@dataclass
class WordGrid:
    """Attention between words: `values[row][column]`, rows the target words, columns the source words, plus one row
    and column per special token (``</s>``) and, where rows sum to less than one, a column for the rest (the sink)."""

    rows: list[str]
    columns: list[str]
    values: list[list[float]]
    row_tokens: list[list[str]]
    column_tokens: list[list[str]]


def _token_groups(words: list[int], tokens: list[str], labels: list[str], special: set[str]):
    """Group token positions by word: (group labels, each token's group, each group's tokens). Whitespace-only
    tokens (word -1, not special) join the next word; special tokens get a group each (by token)."""
    groups: list[str] = list(labels)
    group_of: list[int] = []
    special_groups: dict[str, int] = {}
    for position, (word, token) in enumerate(zip(words, tokens)):
        if word < 0 and token not in special:
            word = next((later for later in words[position + 1:] if later >= 0), -1)
        if word < 0:
            if token not in special_groups:
                special_groups[token] = len(groups)
                groups.append(token)
            group_of.append(special_groups[token])
        else:
            group_of.append(word)
    members = [[tokens[p] for p in range(len(tokens)) if group_of[p] == g] for g in range(len(groups))]
    return groups, group_of, members


def word_grid(weights, attention, source_text: str, target_text: str, special_tokens: Sequence[str],
              remainder_label: str = "sink") -> WordGrid:
    """Aggregate token attention `weights` [target tokens, source tokens] to words (see :class:`WordGrid`): a cell
    sums the attention the source word's tokens got, averaged over the target word's tokens. `attention` is the
    hypothesis' :class:`~hf_headattn.translation.HypothesisAttention` (tokens and their word indices)."""
    special = set(special_tokens)
    read = max(attention.source_words, default=-1) + 1  # a source cut by the model's length limit: the words read
    columns, column_of, column_tokens = _token_groups(attention.source_words, attention.source_tokens,
                                                      source_text.split()[:read], special)
    rows, row_of, row_tokens = _token_groups(attention.target_words, attention.target_tokens, target_text.split(),
                                             special)
    values = [[0.0] * len(columns) for _ in rows]
    counts = [0] * len(rows)
    for t, row in enumerate(row_of):
        counts[row] += 1
        for s, column in enumerate(column_of):
            values[row][column] += float(weights[t, s])
    values = [[value / max(count, 1) for value in row] for row, count in zip(values, counts)]
    keep = [r for r in range(len(rows)) if counts[r]]  # a word with no token of its own (none expected): no row
    rows, values, row_tokens = [rows[r] for r in keep], [values[r] for r in keep], [row_tokens[r] for r in keep]
    if any(sum(row) < FULL_ROW for row in values):
        columns.append(remainder_label)
        column_tokens.append([])
        for row in values:
            row.append(max(0.0, 1.0 - sum(row)))
    return WordGrid(rows, columns, values, row_tokens, column_tokens)


def _cell_style(value: float) -> str:
    value = min(max(value, 0.0), 1.0)
    text = "#ffffff" if value > 0.55 else "#111827"
    return f"background-color: rgba(29, 78, 216, {value:.3f}); color: {text};"


def render_heatmap(grid: WordGrid, caption: str) -> str:
    """The grid as an HTML table: one ``td.hm-cell`` per (target word, source word), its value as tooltip."""
    header = "".join(f'<th class="hm-source" title="tokens: {_attr(" ".join(tokens)) or "(none)"}">'
                     f"<span>{_text(column)}</span></th>" for column, tokens in zip(grid.columns, grid.column_tokens))
    body = []
    for row, tokens, values in zip(grid.rows, grid.row_tokens, grid.values):
        cells = "".join(
            f'<td class="hm-cell" style="{_cell_style(value)}" title="{_attr(row)} → {_attr(column)}: {value:.3f}">'
            f"{f'{value:.2f}'.lstrip('0') if value >= 0.1 else ''}</td>"
            for column, value in zip(grid.columns, values))
        body.append(f'<tr><th class="hm-target" title="tokens: {_attr(" ".join(tokens))}">{_text(row)}</th>'
                    f"{cells}</tr>")
    return (f'<div class="hm-wrap"><table class="hm" data-rows="{len(grid.rows)}" data-columns="{len(grid.columns)}">'
            f"<caption>{_text(caption)}</caption><thead><tr><th class=\"hm-corner\">target \\ source</th>{header}"
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def render_links(source_text: str, target_text: str, alignment: str) -> str:
    """The Pharaoh alignment as an SVG: source words on top, target words below, one line per link."""
    source, target = source_text.split(), target_text.split()
    links = [tuple(int(x) for x in link.split("-")) for link in alignment.split()]
    linked_source, linked_target = {i for i, _ in links}, {j for _, j in links}
    character, gap, height = 7.6, 14.0, 120

    def layout(words):
        widths = [len(word) * character + gap for word in words]
        return widths, sum(widths)

    source_widths, source_total = layout(source)
    target_widths, target_total = layout(target)
    width = max(source_total, target_total, 60.0)

    def centres(widths, total):
        x, result = (width - total) / 2, []
        for w in widths:
            result.append(x + w / 2)
            x += w
        return result

    source_x, target_x = centres(source_widths, source_total), centres(target_widths, target_total)
    parts = [f'<svg class="links" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" role="img" aria-label="word alignment">']
    for i, j in links:
        if i < len(source) and j < len(target):
            parts.append(f'<line class="link" data-link="{i}-{j}" x1="{source_x[i]:.1f}" y1="26" '
                         f'x2="{target_x[j]:.1f}" y2="{height - 30}" stroke="#1d4ed8" stroke-width="1.6"/>')
    for words, xs, y, linked in ((source, source_x, 18, linked_source), (target, target_x, height - 14, linked_target)):
        for k, (word, x) in enumerate(zip(words, xs)):
            colour = "#111827" if k in linked else "#9ca3af"
            parts.append(f'<text x="{x:.1f}" y="{y}" text-anchor="middle" font-size="13" fill="{colour}" '
                         f'font-family="ui-sans-serif, system-ui, sans-serif">{_text(word)}</text>')
    parts.append("</svg>")
    return f'<div class="links-wrap">{"".join(parts)}</div>'


def render_importances(attention, module_variants: dict[str, str]) -> str:
    """Bars of each module's mean weight per head over the sentence (DHICM's head importances; multi-hop attention's
    weights over heads), with a mark at the uniform 1 / heads."""
    if not attention.head_importances:
        return ('<p class="note">This model computes no weights over heads: only DHICM modules and multi-hop '
                "attention with dependent hops do.</p>")
    blocks = []
    for module, importances in attention.head_importances.items():
        means = importances.float().mean(0).tolist()
        heads = len(means)
        over = "source tokens" if module.startswith("encoder.") else "target tokens"
        bars = "".join(
            f'<div class="bar-row"><span class="bar-label">head {h + 1}</span><span class="bar-track">'
            f'<span class="bar" style="width: {100 * value:.1f}%" title="head {h + 1}: {value:.3f}"></span>'
            f'<span class="bar-mark" style="left: {100 / heads:.1f}%" title="uniform: {1 / heads:.3f}"></span>'
            f'</span><span class="bar-value">{value:.2f}</span></div>' for h, value in enumerate(means))
        variant = module_variants.get(module, "")
        blocks.append(f'<div class="importances" data-module="{_attr(module)}"><div class="bar-title">'
                      f"{_text(module)}{f' ({_text(variant)})' if variant else ''}: mean over the {over}; the mark is "
                      f"uniform (1/{heads})</div>{bars}</div>")
    return "".join(blocks)


def render_fertility(result: PanelResult, line: LineResult, attention) -> str:
    """Each constrained layer's cumulative attention per head over the whole translation against each source token's
    fertility bound (csoftmax / csparsemax never exceed it)."""
    if not result.constrained_layers:
        return ('<p class="note">No constrained attention (csoftmax, csparsemax) in this model, so no fertility '
                "bounds.</p>")
    blocks = []
    for layer, has_sink in result.constrained_layers.items():
        cumulative = attention.cross_attentions[layer].float().sum(1)  # [heads, source tokens]
        bounds = line.fertility or []
        scale = max([*bounds, float(cumulative.max()) if cumulative.numel() else 0.0, 1e-9])
        heads = result.layer_heads[layer]
        rows = []
        for s, token in enumerate(attention.source_tokens):
            bound = bounds[s] if s < len(bounds) else float("nan")
            bars = "".join(
                f'<span class="fert-bar{" fert-over" if value > bound + 1e-4 else ""}" style="width: '
                f'{100 * value / scale:.1f}%; background-color: {_head_colour(head)}" title="head {head}: '
                f'{value:.3f} of {bound:.3f}"></span>' for head, value in zip(heads, cumulative[:, s].tolist()))
            rows.append(f'<div class="fert-row"><span class="fert-token">{_text(token)}</span>'
                        f'<span class="fert-track">{bars}<span class="fert-bound" style="left: '
                        f'{100 * min(bound, scale) / scale:.1f}%" title="fertility bound {bound:.3f}"></span></span>'
                        f'<span class="fert-value">≤ {bound:.2f}</span></div>')
        sink = "; the rest went to the sink" if has_sink else ""
        legend = " ".join(f'<span class="legend" style="background-color: {_head_colour(head)}">head {head}</span>'
                          for head in heads)
        blocks.append(f'<div class="fertility" data-layer="{layer}"><div class="bar-title">'
                      f"{_text(result.layer_names[layer])}: each head's attention summed over the translation, "
                      f"one bar per head, against the token's fertility bound (the mark){sink}. {legend}</div>"
                      f"{''.join(rows)}</div>")
    return "".join(blocks)


def _head_colour(head: int) -> str:
    return HEAD_COLOURS[(head - 1) % len(HEAD_COLOURS)]


def render_translations(result: PanelResult) -> str:
    """Each line's hypotheses, best first, with their scores (log-probability / length ** length_penalty)."""
    if result.error:
        return ""
    items = []
    for line in result.lines:
        hypotheses = "".join(
            f'<li><span class="translation-text">{_text(h.text)}</span> <span class="score" '
            f'title="score: log-probability divided by length ** length_penalty">{h.score:.3f}</span></li>'
            for h in line.translation.hypotheses)
        items.append(f'<div class="line" data-line="{line.number}"><div class="source"><b>line {line.number}</b> '
                     f"{_text(line.translation.source)}</div><ol>{hypotheses}</ol></div>")
    return f'<div class="translations">{"".join(items)}</div>'


def render_notices(result: PanelResult | None, extra: Sequence[str] = ()) -> str:
    messages = [*(extra or [])]
    if result is not None:
        messages += ([result.error] if result.error else []) + result.notices
    if not messages:
        return ""
    kind = "error" if result is not None and result.error else "notice"
    return "".join(f'<div class="{kind}">{_text(message)}</div>' for message in messages)


def view_choices(result: PanelResult) -> list[tuple[str, str]]:
    """The hypotheses a panel can show, as (label, "line index:hypothesis index")."""
    choices = []
    for k, line in enumerate(result.lines):
        for rank, hypothesis in enumerate(line.translation.hypotheses):
            words = hypothesis.text if len(hypothesis.text) <= 40 else hypothesis.text[:39] + "…"
            choices.append((f"line {line.number}, #{rank + 1}: {words}", f"{k}:{rank}"))
    return choices


def layer_choices(result: PanelResult) -> list[tuple[str, str]]:
    return [(name, str(layer)) for layer, name in enumerate(result.layer_names)]


def head_choices(result: PanelResult) -> list[tuple[str, str]]:
    alignment = f"what the alignment reads ({result.layer_names[result.alignment_layer]}, heads averaged)"
    heads = sorted({head for kept in result.layer_heads for head in kept})
    return [(alignment, ALIGNMENT_VIEW), ("mean of the layer's heads", MEAN_VIEW),
            *((f"head {head}", str(head)) for head in heads)]


def render_panel(result: PanelResult | None, show: str | None = None, layer: str | None = None,
                 heads: str | None = ALIGNMENT_VIEW) -> dict[str, str]:
    """The HTML of one panel's views of one hypothesis (`show`, "line:hypothesis"; default the first line's best):
    ``heatmap`` (the chosen layer and head(s), or what the alignment reads), ``links``, ``importances``,
    ``fertility``. Empty strings when there is nothing to show."""
    empty = {"heatmap": "", "links": "", "importances": "", "fertility": ""}
    if result is None or not result.lines or result.error:
        return empty
    line_index, rank = (int(part) for part in (show or "0:0").split(":"))
    line = result.lines[line_index]
    if not line.translation.hypotheses:
        return empty
    hypothesis = line.translation.hypotheses[rank]
    attention = hypothesis.attention
    layer_index = int(layer) if layer not in (None, "") else result.alignment_layer
    heads = heads or ALIGNMENT_VIEW
    if heads == ALIGNMENT_VIEW:
        weights = attention.alignment_attention
        caption = (f"what the alignment reads: {result.layer_names[result.alignment_layer]}, heads averaged")
        layer_index = result.alignment_layer
    elif heads == MEAN_VIEW:
        weights = attention.cross_attentions[layer_index].mean(0)
        caption = f"{result.layer_names[layer_index]}, mean of its heads"
    else:
        kept = result.layer_heads[layer_index]
        if int(heads) not in kept:
            message = (f"{result.layer_names[layer_index]} has no head {heads}: it keeps head(s) "
                       f"{', '.join(map(str, kept))} (the others were pruned).")
            views = render_panel(result, show, str(layer_index), MEAN_VIEW)
            return {**views, "heatmap": f'<p class="note">{_text(message)}</p>'}
        weights = attention.cross_attentions[layer_index][kept.index(int(heads))]
        caption = f"{result.layer_names[layer_index]}, head {heads}"
    remainder = "sink" if result.constrained_layers.get(layer_index) else "no source token"
    grid = word_grid(weights, attention, line.translation.source, hypothesis.text, result.special_tokens, remainder)
    return {
        "heatmap": render_heatmap(grid, caption),
        "links": render_links(line.translation.source, hypothesis.text, hypothesis.alignment or ""),
        "importances": render_importances(attention, result.module_variants),
        "fertility": render_fertility(result, line, attention),
    }


def _text(value: str) -> str:
    return html.escape(str(value), quote=False)


def _attr(value: str) -> str:
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------------------------ the page
CSS = """
.hm-wrap { overflow-x: auto; }
table.hm { border-collapse: collapse; font-size: 13px; }
table.hm caption { caption-side: top; text-align: left; font-size: 12px; color: #4b5563; padding-bottom: 4px; }
table.hm th, table.hm td { border: 1px solid #e5e7eb; padding: 0; }
table.hm td.hm-cell { width: 30px; min-width: 30px; height: 24px; text-align: center; font-size: 10px; }
table.hm th.hm-target { text-align: right; padding: 0 6px; font-weight: normal; white-space: nowrap; }
table.hm th.hm-source { vertical-align: bottom; font-weight: normal; padding: 4px 0; }
table.hm th.hm-source span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
table.hm th.hm-corner { font-size: 10px; color: #6b7280; font-weight: normal; padding: 2px 4px; }
.links-wrap { overflow-x: auto; }
.bar-title { font-size: 12px; color: #374151; margin: 6px 0 2px; }
.bar-row, .fert-row { display: flex; align-items: center; gap: 6px; font-size: 12px; margin: 1px 0; }
.bar-label, .fert-token { width: 70px; text-align: right; overflow: hidden; white-space: nowrap; }
.bar-track, .fert-track { position: relative; flex: 1; min-height: 12px; background: #f3f4f6; }
.bar { display: block; height: 12px; background: #059669; }
.fert-track { display: flex; flex-direction: column; gap: 1px; padding: 1px 0; }
.fert-bar { display: block; height: 5px; }
.fert-bar.fert-over { background-color: #dc2626 !important; }
.legend { color: #ffffff; font-size: 11px; padding: 0 4px; border-radius: 3px; white-space: nowrap;
          display: inline-block; }
.bar-mark, .fert-bound { position: absolute; top: 0; bottom: 0; width: 2px; background: #111827; }
.bar-value, .fert-value { width: 48px; font-variant-numeric: tabular-nums; }
.translations .line { margin-bottom: 6px; }
.translations ol { margin: 2px 0 0 18px; padding: 0; }
.translation-text { font-weight: 600; }
.score { color: #6b7280; font-size: 12px; font-variant-numeric: tabular-nums; }
.notice { background: #fef3c7; border-left: 4px solid #d97706; padding: 6px 10px; margin: 4px 0; font-size: 14px; }
.error { background: #fee2e2; border-left: 4px solid #dc2626; padding: 6px 10px; margin: 4px 0; font-size: 14px; }
.note { color: #6b7280; font-size: 13px; }
"""

PANEL_OUTPUTS = ("description", "notices", "translations", "show", "layer", "heads", "heatmap", "links",
                 "importances", "fertility", "state")


def _offline_theme():
    """Gradio's default theme with the system's fonts: its own fonts would be fetched from the web."""
    import gradio as gr

    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "monospace"])


def build_demo(models: Sequence[DemoModel], *, max_lines: int = DEFAULT_MAX_LINES,
               time_limit: float = DEFAULT_TIME_LIMIT, concurrency_limit: int = DEFAULT_CONCURRENCY,
               queue_size: int = DEFAULT_QUEUE_SIZE, num_beams: int = DEFAULT_NUM_BEAMS,
               max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, title: str = DEFAULT_TITLE):
    """The Gradio page (a queued ``gr.Blocks``) for `models`: one panel per model, two at most, each choosing among
    all of them. Serve it with :func:`launch`."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    if not models:
        raise ValueError("No model to show: give at least one")
    names = [model.name for model in models]
    examples = [example for model in models for example in model.examples]
    examples = list(dict.fromkeys(examples))[:EXAMPLES_SHOWN]
    panels = []

    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        gr.Markdown(f"# {title}\nType sentences in the models' source language, one a line, and press "
                    "**Translate**. Each panel translates with the model chosen above it and shows where its "
                    "cross-attention went.")
        text = gr.Textbox(label="source text (one sentence a line)", lines=3, elem_id="source-text",
                          placeholder="der kleine hund sieht die katze .")
        if examples:
            gr.Examples(examples=[[example] for example in examples], inputs=[text],
                        label="examples from the model card's test set")
        with gr.Row():
            beams = gr.Slider(1, MAX_BEAMS, value=min(num_beams, MAX_BEAMS), step=1, label="beams")
            nbest = gr.Slider(1, MAX_BEAMS, value=1, step=1, label="n-best (at most the beams)")
            new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=min(max_new_tokens, MAX_NEW_TOKENS), step=1,
                                   label="max new tokens")
        button = gr.Button("Translate", variant="primary", elem_id="translate")
        notice = gr.HTML(elem_id="page-notice")
        with gr.Row(equal_height=False):
            for index in range(min(PANELS, len(models))):
                with gr.Column(elem_id=f"panel-{index}", elem_classes=["panel"]):
                    choice = gr.Dropdown(names, value=names[index], label="model", elem_id=f"model-{index}")
                    panel = {
                        "model": choice,
                        "description": gr.Markdown(models[index].description, elem_id=f"description-{index}"),
                        "notices": gr.HTML(elem_id=f"notices-{index}"),
                        "translations": gr.HTML(elem_id=f"translations-{index}"),
                    }
                    with gr.Row():
                        panel["show"] = gr.Dropdown([], label="hypothesis", elem_id=f"show-{index}")
                        panel["layer"] = gr.Dropdown([], label="layer", elem_id=f"layer-{index}")
                        panel["heads"] = gr.Dropdown([], label="heads", elem_id=f"heads-{index}")
                    gr.Markdown("**Cross-attention**, source words x target words (hover a cell for its value)")
                    panel["heatmap"] = gr.HTML(elem_id=f"heatmap-{index}")
                    gr.Markdown("**Word alignment** (Pharaoh links, from what the alignment reads)")
                    panel["links"] = gr.HTML(elem_id=f"links-{index}")
                    gr.Markdown("**Weights over heads**")
                    panel["importances"] = gr.HTML(elem_id=f"importances-{index}")
                    gr.Markdown("**Cumulative attention against fertility bounds**")
                    panel["fertility"] = gr.HTML(elem_id=f"fertility-{index}")
                    panel["state"] = gr.State(None)
                    panels.append(panel)

        by_name = {model.name: model for model in models}
        settings = dict(max_lines=max_lines, time_limit=time_limit)

        def on_translate(source, beam_count, best_count, token_count, *chosen):
            return translate_page(by_name, source, chosen, beam_count, best_count, token_count, **settings)

        outputs = [notice] + [panel[name] for panel in panels for name in PANEL_OUTPUTS]
        button.click(on_translate, inputs=[text, beams, nbest, new_tokens, *(panel["model"] for panel in panels)],
                     outputs=outputs, api_name="translate", concurrency_limit=concurrency_limit,
                     concurrency_id="translate")
        for panel in panels:
            def on_model(source, beam_count, best_count, token_count, chosen):
                if not (source or "").strip():  # nothing typed yet: show the model, translate nothing
                    return panel_outputs(PanelResult(chosen, by_name[chosen].description))
                return translate_page(by_name, source, [chosen], beam_count, best_count, token_count,
                                      **settings)[1:]

            panel["model"].input(on_model, inputs=[text, beams, nbest, new_tokens, panel["model"]],
                                 outputs=[panel[name] for name in PANEL_OUTPUTS], api_name=False,
                                 concurrency_limit=concurrency_limit, concurrency_id="translate")
            views = [panel["heatmap"], panel["links"], panel["importances"], panel["fertility"]]
            for control in (panel["show"], panel["layer"], panel["heads"]):
                control.input(update_views, inputs=[panel["state"], panel["show"], panel["layer"], panel["heads"]],
                              outputs=views, api_name=False, show_progress="hidden")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=queue_size)
    return demo


def translate_page(models: dict[str, DemoModel], source: str, chosen: Sequence[str], num_beams, nbest,
                   max_new_tokens, *, max_lines: int = DEFAULT_MAX_LINES,
                   time_limit: float = DEFAULT_TIME_LIMIT) -> tuple:
    """What the Translate button puts in the page: the page's notice, then each chosen panel's outputs
    (:data:`PANEL_OUTPUTS`). Never raises: what goes wrong is a message in the page (and a traceback in the log)."""
    try:
        lines, notices = split_lines(source, max_lines)
    except DemoInputError as error:
        return (render_notices(None, [str(error)]),
                *(value for name in chosen for value in panel_outputs(PanelResult(name, models[name].description))))
    results, done = [], {}
    for name in chosen:
        if name not in done:  # both panels on one model: translate once
            done[name] = _translate_safely(models[name], lines, num_beams, nbest, max_new_tokens, time_limit)
        results.append(done[name])
    return (render_notices(None, notices), *(value for result in results for value in panel_outputs(result)))


def _translate_safely(model: DemoModel, lines, num_beams, nbest, max_new_tokens, time_limit) -> PanelResult:
    try:
        # the thread's wait outlasts decoding's own max_time by the teacher-forced pass that follows it
        return run_with_time_limit(lambda: translate_panel(model, lines, num_beams=num_beams, nbest=nbest,
                                                           max_new_tokens=max_new_tokens, time_limit=time_limit),
                                   time_limit * 1.5 + 5)
    except (DemoInputError, TimeoutError) as error:
        return PanelResult(model.name, model.description, error=str(error))
    except Exception as error:  # the page says what failed in one line; the log keeps the traceback
        logger.exception("Translating with %s failed", model.name)
        return PanelResult(model.name, model.description, error=f"Translating failed: {_one_line(error)}")


def panel_outputs(result: PanelResult) -> tuple:
    """One panel's outputs, in :data:`PANEL_OUTPUTS` order, for `result` (its views show the first line's best
    hypothesis through what the alignment reads)."""
    import gradio as gr

    shows, layers = view_choices(result), layer_choices(result)
    views = render_panel(result)
    show = gr.update(choices=shows, value=shows[0][1] if shows else None)
    layer = gr.update(choices=layers, value=str(result.alignment_layer) if layers else None)
    heads = gr.update(choices=head_choices(result) if layers else [], value=ALIGNMENT_VIEW if layers else None)
    return (result.description, render_notices(result), render_translations(result), show, layer, heads,
            views["heatmap"], views["links"], views["importances"], views["fertility"], result)


def update_views(result: PanelResult | None, show: str | None, layer: str | None, heads: str | None) -> tuple:
    """The four views after a hypothesis, layer or heads choice; a failure is a message in the heat map's place."""
    try:
        views = render_panel(result, show, layer, heads)
    except Exception as error:
        logger.exception("Drawing the attention failed")
        return (f'<div class="error">Drawing the attention failed: {_text(_one_line(error))}</div>', "", "", "")
    return views["heatmap"], views["links"], views["importances"], views["fertility"]


def launch(demo, *, host: str | None = None, port: int | None = None, **launch_kwargs):
    """Serve `demo` with the page's theme and style; `host` / `port` default to Gradio's (GRADIO_SERVER_NAME,
    GRADIO_SERVER_PORT, else 127.0.0.1:7860), so a Space's settings apply. No stack trace reaches the page
    (``show_error=False``; the handlers already turn errors into messages)."""
    return demo.launch(server_name=host, server_port=port, theme=_offline_theme(), css=CSS, show_error=False,
                       **launch_kwargs)


# ------------------------------------------------------------------------------------------------ the command
EXAMPLES = """examples:
  # two variants side by side (train them with hf-headattn-demo or hf-headattn-train), then open the address
  hf-headattn-app --model runs/demo/model --model runs/demo-csparsemax/model
  # one model, another port, reachable from other machines
  hf-headattn-app --model runs/de-en --port 8080 --host 0.0.0.0
  # a Hub model runs its own code here: read it first, then allow it
  hf-headattn-app --model someone/headattn-de-en --trust_remote_code

the page: a text box (one sentence a line), beams, n-best and max new tokens, and per model panel the translations
with scores, the cross-attention as a heat map of source words x target words (per layer and head, their mean, or
what the alignment reads), the word alignment as links, DHICM and multi-hop weights over heads as bars, and
csoftmax / csparsemax cumulative attention against the fertility bounds. Needs gradio: pip install "hf_headattn[app]".
"""


def make_parser() -> argparse.ArgumentParser:
    from .loading import DEVICES, add_trust_remote_code_argument  # not at module level: no Space has .loading

    parser = UnderscoreArgumentParser(
        prog="hf-headattn-app", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="A web page to translate with one or two models and compare where their attention goes.\n"
                    "Flags use Transformers' underscore spelling; the dashed spelling (--max-lines) works too.")
    models = parser.add_argument_group("models")
    models.add_argument("--model", action="append", required=True,
                        help="a saved model folder or a Hugging Face Hub id; repeat to compare models side by side")
    add_trust_remote_code_argument(models, "--trust_remote_code")
    models.add_argument("--device", default="auto", help=f"{', '.join(DEVICES)} or cuda:N")
    server = parser.add_argument_group("server")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to serve the page on")
    server.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (0.0.0.0: every interface)")
    limits = parser.add_argument_group("limits (what a visitor may ask for)")
    limits.add_argument("--max_lines", type=int, default=DEFAULT_MAX_LINES, help="lines translated per request")
    limits.add_argument("--time_limit", type=float, default=DEFAULT_TIME_LIMIT,
                        help="seconds a translation may take before it stops")
    limits.add_argument("--concurrency_limit", type=int, default=DEFAULT_CONCURRENCY,
                        help="translations running at once (the others wait in the queue)")
    limits.add_argument("--queue_size", type=int, default=DEFAULT_QUEUE_SIZE,
                        help="requests that may wait; more are turned away with a message")
    defaults = parser.add_argument_group("the page's starting settings")
    defaults.add_argument("--num_beams", type=int, default=DEFAULT_NUM_BEAMS, help=f"beams (1 to {MAX_BEAMS})")
    defaults.add_argument("--max_new_tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                          help=f"longest translation in tokens (1 to {MAX_NEW_TOKENS})")
    add_verbose_argument(parser)
    return parser


def main(argv=None) -> None:
    """The `hf-headattn-app` command (also `python -m hf_headattn.app`)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    for name in ("max_lines", "concurrency_limit", "queue_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive number, got {getattr(args, name)}")
    if not args.time_limit > 0:
        parser.error(f"--time_limit must be positive, got {args.time_limit}")
    if not 1 <= args.num_beams <= MAX_BEAMS:
        parser.error(f"--num_beams must be between 1 and {MAX_BEAMS}, got {args.num_beams}")
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        parser.error(f"--max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {args.max_new_tokens}")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio  # noqa: F401
    except ImportError:
        parser.exit(1, f'{parser.prog}: error: the web page needs gradio: pip install "hf_headattn[app]"\n')
    from transformers.utils import logging as transformers_logging

    from .loading import load_model_and_tokenizer, resolve_device

    if not args.verbose:  # the weights' loading bar says nothing a visitor needs
        transformers_logging.disable_progress_bar()
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        parser.error(str(error))

    def load(name):
        model, tokenizer = load_model_and_tokenizer(name, trust_remote_code=args.trust_remote_code)
        return model.to(device), tokenizer

    models = load_models(args.model, load)
    for model in models:
        if model.error:  # the page says so too; the terminal should not stay silent
            logger.error("Model %s is not available in the page: %s", model.name, model.error)
    demo = build_demo(models, max_lines=args.max_lines, time_limit=args.time_limit,
                      concurrency_limit=args.concurrency_limit, queue_size=args.queue_size,
                      num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    launch(demo, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
