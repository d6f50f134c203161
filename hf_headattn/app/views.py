"""The HTML and SVG views of a panel: the cross-attention as a heat map of source words x target words, the word
alignment as links, the weights over heads as bars, constrained attention against the fertility bounds, the
translations with their scores, and the page's style sheet (:data:`CSS`).

Words are what splitting at whitespace gives, as the alignments count them: a word's cell sums the attention its
source tokens got, averaged over the word's target tokens.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from .panels import LineResult, PanelResult

__all__ = [
    "ALIGNMENT_VIEW",
    "CSS",
    "MEAN_VIEW",
    "WordGrid",
    "head_choices",
    "layer_choices",
    "render_fertility",
    "render_heatmap",
    "render_importances",
    "render_links",
    "render_notices",
    "render_panel",
    "render_translations",
    "view_choices",
    "word_grid",
]

ALIGNMENT_VIEW = "alignment"  # the heads choice that shows what the alignment reads
MEAN_VIEW = "mean"
# A row of word attention summing to less than this left the rest on no source token (the constrained variants' sink)
FULL_ROW = 0.999
HEAD_COLOURS = ("#7c3aed", "#db2777", "#0891b2", "#65a30d", "#ea580c", "#4f46e5", "#0d9488", "#ca8a04")


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



# The style of the views' HTML (their classes), served with the page
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
