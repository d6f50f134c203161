"""The HTML and SVG views of a panel: the cross-attention as a heat map of source words x target words (one head,
the mean of a layer's heads or what the alignment reads) with its colour bar, every head of a layer as small maps
beside a table of each head's sparsity and entropy, the difference of two panels' maps, the word alignment as
links, the weights over heads as bars, constrained attention against the fertility bounds, the translations with
their scores, and the page's style sheet (:data:`CSS`).

The layer and heads choices are the page's, one for both panels (:func:`linked_layer_choices`,
:func:`linked_head_choices`); a panel whose model lacks the chosen layer or head says so where its map would be.

Words are split for people: the whitespace-separated words the alignments count are split again into words and
punctuation ("Straße." shows as "Straße" and ".") wherever the tokens split there too. A word's cell sums the
attention its source tokens got, averaged over the word's target tokens. Exact zeros (sparse attention) are hatched,
never coloured as small values, and every value from .005 up (".01") is written in its cell.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .panels import Comparison, LineResult, PanelResult

__all__ = [
    "ALIGNMENT_VIEW",
    "CSS",
    "MEAN_VIEW",
    "VIEWS",
    "HeadStatistics",
    "MissingView",
    "WordGrid",
    "attention_statistics",
    "chosen_attention",
    "default_layer",
    "layer_statistics",
    "linked_head_choices",
    "linked_layer_choices",
    "render_difference",
    "render_difference_map",
    "render_fertility",
    "render_head_grid",
    "render_heatmap",
    "render_importances",
    "render_links",
    "render_notices",
    "render_panel",
    "render_statistics",
    "render_translations",
    "split_word",
    "view_choices",
    "word_grid",
]

ALIGNMENT_VIEW = "alignment"  # the heads choice that shows what the alignment reads
MEAN_VIEW = "mean"
VIEWS = ("heatmap", "grid", "statistics", "links", "importances", "fertility")  # what render_panel draws
# A row of word attention summing to less than this left the rest on no source token (the constrained variants' sink)
FULL_ROW = 0.999
HEAD_COLOURS = ("#7c3aed", "#db2777", "#0891b2", "#65a30d", "#ea580c", "#4f46e5", "#0d9488", "#ca8a04")
ATTENTION_RGB = "29, 78, 216"  # the maps' blue, its opacity the value
MORE_IN_A_RGB, MORE_IN_B_RGB = "29, 78, 216", "220, 38, 38"  # the difference map's ends: blue where A attends more
# A word as people split it: letters and digits (with inner apostrophes and hyphens: "don't", "e-mail"), or a run of
# punctuation
PEOPLE_WORD = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]+")


@dataclass
class WordGrid:
    """Attention between words: `values[row][column]`, rows the target words, columns the source words, plus one row
    and column per special token (``</s>``) and, where rows sum to less than one, a column for the rest (the sink)."""

    rows: list[str]
    columns: list[str]
    values: list[list[float]]
    row_tokens: list[list[str]]
    column_tokens: list[list[str]]


def split_word(word: str) -> list[str]:
    """A whitespace-separated word as people split it: words apart from punctuation ("Straße." -> "Straße", ".";
    "don't" and "e-mail" stay whole)."""
    return PEOPLE_WORD.findall(word) or [word]


def _token_surface(token: str) -> str:
    """A token's characters as the text has them: without the marks tokenizers put at word boundaries
    (SentencePiece's ▁, byte-level BPE's Ġ, WordPiece's ##, subword-nmt's @@ and </w>)."""
    return token.replace("▁", "").replace("Ġ", "").removeprefix("##").removesuffix("</w>").removesuffix("@@")


def _word_pieces(word: str, tokens: list[str]) -> tuple[list[str], list[int]]:
    """`word` split by :func:`split_word` as far as its `tokens` split there too (pieces that one token spans stay
    together: attention cannot be divided inside a token), and the piece of each token. The word stays whole where
    its tokens do not spell it (a tokenizer that normalises or works on bytes)."""
    pieces = split_word(word)
    whole = ([word], [0] * len(tokens))
    if len(pieces) == 1:
        return whole
    ends = list(itertools.accumulate(len(piece) for piece in pieces))  # the pieces cover the word: it has no space
    spans, offset = [], 0  # each token's first and last piece
    for token in tokens:
        text = _token_surface(token)
        if not word.startswith(text, offset):
            return whole
        first = min(bisect.bisect_right(ends, offset), len(pieces) - 1)
        last = min(bisect.bisect_right(ends, offset + len(text) - 1), len(pieces) - 1) if text else first
        spans.append((first, last))
        offset += len(text)
    if offset != len(word):
        return whole
    spanned = {piece for first, last in spans for piece in range(first + 1, last + 1)}  # joined to the one before
    labels, label_of_piece = [], []
    for k, piece in enumerate(pieces):
        if k in spanned:
            labels[-1] += piece
        else:
            labels.append(piece)
        label_of_piece.append(len(labels) - 1)
    return labels, [label_of_piece[first] for first, _ in spans]


def _token_groups(words: list[int], tokens: list[str], labels: list[str], special: set[str]):
    """Group token positions by word as people split words (:func:`_word_pieces` of each of `labels`, the whitespace
    words): (group labels, each token's group, each group's tokens). Whitespace-only tokens (word -1, not special)
    join the next word; special tokens get a group each (by token), after the words."""
    word_of = []
    for position, (word, token) in enumerate(zip(words, tokens)):
        if word < 0 and token not in special:
            word = next((later for later in words[position + 1:] if later >= 0), -1)
        word_of.append(word)
    groups: list[str] = []
    group_of = [-1] * len(tokens)
    for word, label in enumerate(labels):
        positions = [position for position, of in enumerate(word_of) if of == word]
        pieces, piece_of = _word_pieces(label, [tokens[position] for position in positions])
        for position, piece in zip(positions, piece_of):
            group_of[position] = len(groups) + piece
        groups += pieces
    special_groups: dict[str, int] = {}
    for position, word in enumerate(word_of):
        if word < 0:
            group_of[position] = special_groups.setdefault(tokens[position], len(groups) + len(special_groups))
    groups += list(special_groups)
    members = [[tokens[p] for p in range(len(tokens)) if group_of[p] == g] for g in range(len(groups))]
    return groups, group_of, members


def word_grid(weights, attention, source_text: str, target_text: str, special_tokens: Sequence[str],
              remainder_label: str | None = "sink") -> WordGrid:
    """Aggregate token attention `weights` [target tokens, source tokens] to words (see :class:`WordGrid`): a cell
    sums the attention the source word's tokens got, averaged over the target word's tokens. `attention` is the
    hypothesis' :class:`~hf_headattn.translation.HypothesisAttention` (tokens and their word indices). Without a
    `remainder_label`, no column for the rest."""
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
    grid = WordGrid(rows, columns, values, row_tokens, column_tokens)
    if remainder_label is not None and any(sum(row) < FULL_ROW for row in values):
        _add_remainder(grid, remainder_label)
    return grid


def _add_remainder(grid: WordGrid, label: str) -> None:
    """A column for what each row left on no source word."""
    grid.columns.append(label)
    grid.column_tokens.append([])
    for row in grid.values:
        row.append(max(0.0, 1.0 - sum(row)))


# ------------------------------------------------------------------------------------------------ statistics
@dataclass
class HeadStatistics:
    """One head's attention over one translation: `sparsity`, the share of its (target token, source token) weights
    that are exactly 0; `entropy`, in bits, of each target token's attention over the source tokens (what went to no
    source token, a sink, counted as one more outcome), averaged over the target tokens."""

    head: int
    sparsity: float
    entropy: float


def attention_statistics(weights) -> tuple[float, float]:
    """(sparsity, entropy) of token attention `weights` [target tokens, source tokens]: see :class:`HeadStatistics`."""
    if weights.numel() == 0:
        return math.nan, math.nan
    probabilities = weights.double()
    rest = (1 - probabilities.sum(-1)).clamp(min=0)

    def information(p):  # -p log2 p, with 0 log 0 = 0
        return -p * p.clamp(min=1e-300).log2()

    entropy = information(probabilities).sum(-1) + information(rest)
    return float((probabilities == 0).double().mean()), float(entropy.mean())


def layer_statistics(result: PanelResult, attention, layer: int) -> list[HeadStatistics]:
    """:class:`HeadStatistics` of each head `layer` keeps, on one hypothesis' `attention`."""
    return [HeadStatistics(head, *attention_statistics(weights))
            for head, weights in zip(result.layer_heads[layer], attention.cross_attentions[layer])]


# ------------------------------------------------------------------------------------------------ heat maps
def _value_label(value: float, signed: bool = False) -> str:
    """A cell's label, two decimals without the leading zero (".25", "1.00"; "+.25" signed); none for values that
    round to 0, which are faintly coloured (exact zeros are hatched instead), lest labels fill a softmax map."""
    if abs(value) < 0.005:
        return ""
    text = f"{abs(value):.2f}".removeprefix("0")
    return ("+" if value > 0 else "−") + text if signed else text


def _attention_cell(value: float, title: str) -> str:
    if value == 0:
        return f'<td class="hm-cell hm-zero" title="{_attr(title)}: exactly 0"></td>'
    opacity = min(max(value, 0.0), 1.0)
    colour = "#ffffff" if opacity > 0.55 else "#111827"
    return (f'<td class="hm-cell" style="background-color: rgba({ATTENTION_RGB}, {opacity:.3f}); color: {colour};" '
            f'title="{_attr(title)}: {value:.3f}">{_text(_value_label(value))}</td>')


def _difference_cell(value: float, scale: float, title: str) -> str:
    if value == 0:
        return f'<td class="hm-cell hm-zero" title="{_attr(title)}: exactly 0"></td>'
    opacity = min(abs(value) / scale, 1.0)
    colour = "#ffffff" if opacity > 0.55 else "#111827"
    rgb = MORE_IN_A_RGB if value > 0 else MORE_IN_B_RGB
    return (f'<td class="hm-cell" style="background-color: rgba({rgb}, {opacity:.3f}); color: {colour};" '
            f'title="{_attr(title)}: {value:+.3f}">{_text(_value_label(value, signed=True))}</td>')


def _map_table(grid: WordGrid, cell, classes: str = "hm") -> str:
    """`grid` as a table, one ``td.hm-cell`` per (target word, source word) drawn by `cell(value, title)`."""
    header = "".join(f'<th class="hm-source" title="tokens: {_attr(" ".join(tokens)) or "(none)"}">'
                     f"<span>{_text(column)}</span></th>" for column, tokens in zip(grid.columns, grid.column_tokens))
    body = []
    for row, tokens, values in zip(grid.rows, grid.row_tokens, grid.values):
        cells = "".join(cell(value, f"{row} → {column}") for column, value in zip(grid.columns, values))
        body.append(f'<tr><th class="hm-target" title="tokens: {_attr(" ".join(tokens))}">{_text(row)}</th>'
                    f"{cells}</tr>")
    return (f'<table class="{classes}" data-rows="{len(grid.rows)}" data-columns="{len(grid.columns)}"><thead><tr>'
            f'<th class="hm-corner">target \\ source</th>{header}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _colour_bar() -> str:
    """The attention maps' legend: the colour from 0 to 1, and the hatching of exact zeros."""
    return ('<div class="colour-bar" role="img" aria-label="colour scale: 0 to 1; hatched: exactly 0">'
            '<span class="cb-end">0</span><span class="cb-ramp" style="background: linear-gradient(to right, '
            f'rgba({ATTENTION_RGB}, 0), rgba({ATTENTION_RGB}, 1));"></span><span class="cb-end">1</span>'
            '<span class="cb-swatch hm-zero"></span><span>exactly 0; no label: under .005</span></div>')


def render_heatmap(grid: WordGrid, caption: str) -> str:
    """The grid as an HTML table, one ``td.hm-cell`` per (target word, source word) with its value as tooltip and
    label, under its caption and over its colour bar."""
    return (f'<div class="map-caption">{_text(caption)}</div><div class="hm-wrap">{_map_table(grid, _attention_cell)}'
            f"</div>{_colour_bar()}")


def render_head_grid(grids: Sequence[tuple[int, WordGrid]], caption: str, chosen_head: int | None = None) -> str:
    """Small multiples: one small map per (head, grid), the `chosen_head` outlined, with one colour bar for all;
    rows and columns as in the big map (hover a cell for its words and value)."""
    maps = []
    for head, grid in grids:
        chosen = " chosen" if head == chosen_head else ""
        body = "".join(
            "<tr>" + "".join(_small_cell(value, f"head {head}: {row} → {column}")
                             for column, value in zip(grid.columns, values)) + "</tr>"
            for row, values in zip(grid.rows, grid.values))
        maps.append(f'<figure class="small-map{chosen}" data-head="{head}"><figcaption>head {head}</figcaption>'
                    f'<table class="hm hm-small" data-rows="{len(grid.rows)}" data-columns="{len(grid.columns)}">'
                    f"<tbody>{body}</tbody></table></figure>")
    return (f'<div class="map-caption">{_text(caption)}</div><div class="small-maps">{"".join(maps)}</div>'
            f"{_colour_bar()}")


def _small_cell(value: float, title: str) -> str:
    if value == 0:
        return f'<td class="hm-cell hm-zero" title="{_attr(title)}: exactly 0"></td>'
    opacity = min(max(value, 0.0), 1.0)
    return (f'<td class="hm-cell" style="background-color: rgba({ATTENTION_RGB}, {opacity:.3f});" '
            f'title="{_attr(title)}: {value:.3f}"></td>')


def render_statistics(statistics: Sequence[HeadStatistics], caption: str, uniform_entropy: float,
                      chosen_head: int | None = None) -> str:
    """The small table of each head's sparsity and entropy, the `chosen_head`'s row marked."""
    rows = "".join(
        f'<tr class="{"chosen" if row.head == chosen_head else ""}" data-head="{row.head}"><th>head {row.head}</th>'
        f'<td class="sparsity">{100 * row.sparsity:.0f}%</td><td class="entropy">{row.entropy:.2f}</td></tr>'
        for row in statistics)
    return (f'<table class="head-stats"><caption>{_text(caption)}</caption><thead><tr><th>head</th>'
            '<th title="share of its token weights that are exactly 0">exact zeros</th>'
            '<th title="bits, mean over the target tokens">entropy (bits)</th></tr></thead>'
            f'<tbody>{rows}</tbody></table><p class="note">Entropy of attention spread evenly over the source: '
            f"{uniform_entropy:.2f} bits; on one token: 0.</p>")


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


# ------------------------------------------------------------------------------------------------ linked choices
def linked_layer_choices(results: Sequence[PanelResult]) -> list[tuple[str, str]]:
    """The page's one layer choice for all panels: every layer position any panel's model has, named as the models
    name it ("layer 2"; "layer 1 / source attention" where they differ), as (label, layer index)."""
    count = max((len(result.layer_labels) for result in results), default=0)
    choices = []
    for layer in range(count):
        labels = dict.fromkeys(result.layer_labels[layer] for result in results if layer < len(result.layer_labels))
        choices.append((" / ".join(labels), str(layer)))
    return choices


def linked_head_choices(results: Sequence[PanelResult]) -> list[tuple[str, str]]:
    """The page's one heads choice for all panels: what the alignment reads (each model's own), the mean of the
    chosen layer's heads, and every head number any panel's model has in any layer."""
    heads = sorted({head for result in results for kept in result.layer_heads for head in kept})
    if not heads:
        return []
    return [("what the alignment reads (heads averaged)", ALIGNMENT_VIEW), ("mean of the layer's heads", MEAN_VIEW),
            *((f"head {head}", str(head)) for head in heads)]


def default_layer(results: Sequence[PanelResult]) -> str | None:
    """The layer chosen after a translation: the last one every translated panel's model has (the layer the
    alignment reads, for models of one depth); None with nothing translated."""
    counts = [len(result.layer_labels) for result in results if result.layer_labels]
    return str(min(counts) - 1) if counts else None


class MissingView(LookupError):
    """The chosen layer or head is not in a panel's model: the message the panel shows in the view's place."""


def chosen_attention(result: PanelResult, attention, layer: int, heads: str, model: str = "This model"):
    """(weights [target tokens, source tokens], caption, layer) of the `heads` choice in `layer` of one hypothesis'
    `attention`: what the alignment reads (in its own layer), the mean of the layer's heads, or one head.

    Raises:
        MissingView: the model (named `model` in the message) has no such layer, or the layer no such head.
    """
    if heads == ALIGNMENT_VIEW:
        return (attention.alignment_attention,
                f"what the alignment reads: {result.layer_names[result.alignment_layer]}, heads averaged",
                result.alignment_layer)
    _check_layer(result, layer, model)
    name = result.layer_names[layer]
    if heads == MEAN_VIEW:
        return attention.cross_attentions[layer].mean(0), f"{name}, mean of its heads", layer
    kept = result.layer_heads[layer]
    if int(heads) not in kept:
        raise MissingView(f"{model} has no head {heads} in {name}: its heads there are "
                          f"{', '.join(map(str, kept))}.")
    return attention.cross_attentions[layer][kept.index(int(heads))], f"{name}, head {heads}", layer


def _check_layer(result: PanelResult, layer: int, model: str = "This model") -> None:
    if not 0 <= layer < len(result.layer_names):
        raise MissingView(f"{model} has no layer {layer + 1} of cross-attention; its {len(result.layer_names)}: "
                          f"{', '.join(result.layer_names)}.")


def _remainder_label(result: PanelResult, layer: int) -> str:
    return "sink" if result.constrained_layers.get(layer) else "no source token"


def _shown(result: PanelResult | None, show: str | None):
    """The (line, hypothesis) `show` ("line:hypothesis"; default the first line's best) names, or None."""
    if result is None or not result.lines or result.error:
        return None
    line_index, rank = (int(part) for part in (show or "0:0").split(":"))
    line = result.lines[line_index]
    if not line.translation.hypotheses:
        return None
    return line, line.translation.hypotheses[rank]


def render_panel(result: PanelResult | None, show: str | None = None, layer: str | None = None,
                 heads: str | None = ALIGNMENT_VIEW) -> dict[str, str]:
    """The HTML of one panel's :data:`VIEWS` of one hypothesis (`show`, "line:hypothesis"; default the first line's
    best): ``heatmap`` (the `heads` choice in `layer`, default what the alignment reads), ``grid`` (every head of
    `layer`) and ``statistics`` (their sparsity and entropy), ``links``, ``importances``, ``fertility``. A layer or
    head the model lacks is a note in the view's place; empty strings when there is nothing to show."""
    shown = _shown(result, show)
    if shown is None:
        return dict.fromkeys(VIEWS, "")
    line, hypothesis = shown
    attention, source, target = hypothesis.attention, line.translation.source, hypothesis.text
    layer_index = int(layer) if layer not in (None, "") else result.alignment_layer
    heads = heads or ALIGNMENT_VIEW
    views = {
        "links": render_links(source, target, hypothesis.alignment or ""),
        "importances": render_importances(attention, result.module_variants),
        "fertility": render_fertility(result, line, attention),
    }
    try:
        weights, caption, map_layer = chosen_attention(result, attention, layer_index, heads)
        grid = word_grid(weights, attention, source, target, result.special_tokens,
                         _remainder_label(result, map_layer))
        views["heatmap"] = render_heatmap(grid, caption)
    except MissingView as missing:
        views["heatmap"] = _note(str(missing))
    try:
        _check_layer(result, layer_index)
    except MissingView as missing:
        views["grid"], views["statistics"] = _note(str(missing)), ""
        return views
    name, remainder = result.layer_names[layer_index], _remainder_label(result, layer_index)
    chosen_head = int(heads) if heads.isdigit() else None
    grids = [(head, word_grid(weights, attention, source, target, result.special_tokens, remainder))
             for head, weights in zip(result.layer_heads[layer_index], attention.cross_attentions[layer_index])]
    columns = max(len(grid.columns) for _, grid in grids)
    for _, grid in grids:  # small multiples share their columns: the rest's where any head has one
        if len(grid.columns) < columns:
            _add_remainder(grid, remainder)
    views["grid"] = render_head_grid(grids, f"{name}: every head", chosen_head)
    reads = len(attention.source_tokens) + bool(result.constrained_layers.get(layer_index))  # a sink: one more
    views["statistics"] = render_statistics(layer_statistics(result, attention, layer_index), name,
                                            math.log2(max(reads, 1)), chosen_head)
    return views


# ------------------------------------------------------------------------------------------------ difference
def render_difference(results: Sequence[PanelResult | None], comparison: Comparison | None, show: str | None,
                      layer: str | None, heads: str | None) -> str:
    """The first panel's map minus the second's, both on the first panel's shown hypothesis (the second model's
    attention teacher-forced on it, :class:`~.panels.Comparison`), for the page's layer and heads choice, on a
    diverging colour map; or why there is none (tokenizers differ, a layer or head missing, nothing translated)."""
    if len(results) < 2:
        return _note("The difference view compares two panels: start the page with two models.")
    if comparison is None:
        return _note("Translate to see the difference between the two panels' attention.")
    if comparison.refusal:
        return f'<div class="notice">{_text(comparison.refusal)}</div>'
    first, second = results
    shown = _shown(first, show)
    forced = comparison.forced.get(show or "0:0")
    if shown is None or forced is None:
        return _note("Nothing to compare: the first panel shows no translation.")
    line, hypothesis = shown
    attention, source, target = hypothesis.attention, line.translation.source, hypothesis.text
    layer_index = int(layer) if layer not in (None, "") else first.alignment_layer
    heads = heads or ALIGNMENT_VIEW
    maps = []
    for result, panel_attention in ((first, attention), (second, forced)):
        try:
            maps.append(chosen_attention(result, panel_attention, layer_index, heads, result.model_name))
        except MissingView as missing:
            return _note(f"No difference for this choice: {missing}")
    (weights_a, caption_a, _), (weights_b, caption_b, _) = maps
    if weights_a.shape != weights_b.shape:
        return _note(f"No difference: {second.model_name} reads {len(forced.source_tokens)} "
                     f"source tokens of this line and {first.model_name} {len(attention.source_tokens)} (their "
                     "length limits differ).")
    grid = word_grid(weights_a - weights_b, attention, source, target, first.special_tokens, remainder_label=None)
    if min(float(weights.sum(-1).min()) for weights in (weights_a, weights_b)) < FULL_ROW:
        grid.columns.append("sink / no source token")  # the rest: (1 - A's row) - (1 - B's row)
        grid.column_tokens.append([])
        for row in grid.values:
            row.append(-sum(row))
    caption = (f"A − B: A = {first.model_name}, {caption_a}; B = {second.model_name}, {caption_b}; on A's "
               "translation of the line (B's attention teacher-forced on it)")
    return render_difference_map(grid, caption)


def render_difference_map(grid: WordGrid, caption: str) -> str:
    """A difference grid on a diverging colour map (blue: A attends more, red: B does), scaled to its largest
    difference, with its colour bar."""
    scale = max((abs(value) for row in grid.values for value in row), default=0.0) or 1.0
    bar = ('<div class="colour-bar" role="img" aria-label="colour scale: B more (red) to A more (blue)">'
           f'<span class="cb-end">−{scale:.2f} (B more)</span><span class="cb-ramp" style="background: '
           f'linear-gradient(to right, rgba({MORE_IN_B_RGB}, 1), rgba({MORE_IN_B_RGB}, 0) 50%, '
           f'rgba({MORE_IN_A_RGB}, 0) 50%, rgba({MORE_IN_A_RGB}, 1));"></span><span class="cb-end">+{scale:.2f} '
           '(A more)</span><span class="cb-swatch hm-zero"></span><span>exactly equal; no label: under .005</span></div>')
    table = _map_table(grid, lambda value, title: _difference_cell(value, scale, title), "hm hm-difference")
    return f'<div class="map-caption">{_text(caption)}</div><div class="hm-wrap">{table}</div>{bar}'


def _note(message: str) -> str:
    return f'<p class="note">{_text(message)}</p>'


def _text(value: str) -> str:
    return html.escape(str(value), quote=False)


def _attr(value: str) -> str:
    return html.escape(str(value), quote=True)


# The style of the views' HTML (their classes) and of the page's layout, served with the page
CSS = """
.panel { min-width: 0 !important; }  /* a long word or caption wraps or scrolls; it never widens its panel */
.panel-description { min-height: 3em; }
/* a dropdown's text stops before its arrow (Gradio draws the arrow over the input's right end) */
.wrap-inner input[role="combobox"] { padding-right: calc(2 * var(--size-5) + 4px); text-overflow: ellipsis; }
.map-caption { font-size: 12px; color: #4b5563; padding-bottom: 4px; min-height: 3em; overflow-wrap: anywhere; }
.hm-wrap, .links-wrap { overflow-x: auto; max-width: 100%; }
table.hm { border-collapse: collapse; font-size: 13px; }
table.hm th, table.hm td { border: 1px solid #e5e7eb; padding: 0; }
table.hm td.hm-cell { width: 30px; min-width: 30px; height: 24px; text-align: center; font-size: 10px; }
table.hm th.hm-target { text-align: right; padding: 0 6px; font-weight: normal; white-space: nowrap; }
table.hm th.hm-source { vertical-align: bottom; font-weight: normal; padding: 4px 0; }
table.hm th.hm-source span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
table.hm th.hm-corner { font-size: 10px; color: #6b7280; font-weight: normal; padding: 2px 4px; }
.hm-zero { background: repeating-linear-gradient(135deg, #9ca3af 0 1px, #ffffff 1px 4px); }
table.hm.hm-small td.hm-cell { width: 9px; min-width: 9px; height: 9px; }
table.hm.hm-small td, table.hm.hm-small th { border-color: #f3f4f6; }
.small-maps { display: flex; flex-wrap: wrap; gap: 10px; }
figure.small-map { margin: 0; }
figure.small-map figcaption { font-size: 11px; color: #374151; }
figure.small-map.chosen table { outline: 2px solid #111827; }
.colour-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 4px; font-size: 11px; color: #4b5563;
              margin-top: 6px; }
.cb-ramp { width: 120px; height: 10px; border: 1px solid #d1d5db; }
.cb-swatch { width: 14px; height: 10px; border: 1px solid #d1d5db; margin-left: 10px; }
table.head-stats { border-collapse: collapse; font-size: 12px; font-variant-numeric: tabular-nums; }
table.head-stats caption { caption-side: top; text-align: left; color: #4b5563; padding-bottom: 4px; }
table.head-stats th, table.head-stats td { border-bottom: 1px solid #e5e7eb; padding: 2px 8px; text-align: right; }
table.head-stats th { font-weight: normal; white-space: nowrap; }
table.head-stats tr.chosen { background: #eff6ff; font-weight: 600; }
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
.translations { overflow-wrap: anywhere; }
.translations .line { margin-bottom: 6px; }
.translations ol { margin: 2px 0 0 18px; padding: 0; }
.translation-text { font-weight: 600; }
.score { color: #6b7280; font-size: 12px; font-variant-numeric: tabular-nums; }
.notice { background: #fef3c7; border-left: 4px solid #d97706; padding: 6px 10px; margin: 4px 0; font-size: 14px; }
.error { background: #fee2e2; border-left: 4px solid #dc2626; padding: 6px 10px; margin: 4px 0; font-size: 14px; }
.note { color: #6b7280; font-size: 13px; }
"""
