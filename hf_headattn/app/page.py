"""The web page (Gradio): a text box (one sentence a line; its hint and examples from the models' cards), the
decoding settings (beams, n-best, max new tokens) and a Translate button; two panels side by side, each showing one
of the loaded models (:mod:`.panels`) through the views (:mod:`.views`), one layer and heads choice for both, and the
difference of their maps.

The page is built as one row per section (models, translations, maps, every head, links, ...), each with a column
per panel, so a section starts at the same height in both panels whatever wraps above it.

Errors are logged with their traceback and shown as one line, never as a stack trace. Requests wait in Gradio's queue
(``concurrency_limit`` at a time, at most ``queue_size`` waiting) and each translation stops at ``time_limit``
seconds.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .panels import (
    DEFAULT_MAX_LINES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NUM_BEAMS,
    DEFAULT_TIME_LIMIT,
    FALLBACK_EXAMPLE,
    MAX_BEAMS,
    MAX_NEW_TOKENS,
    Comparison,
    DemoInputError,
    DemoModel,
    PanelResult,
    compare_panels,
    one_line,
    page_examples,
    run_with_time_limit,
    split_lines,
    translate_panel,
)
from .views import (
    ALIGNMENT_VIEW,
    CSS,
    VIEWS,
    default_layer,
    linked_head_choices,
    linked_layer_choices,
    render_difference,
    render_notices,
    render_panel,
    render_translations,
    view_choices,
)

# gradio is imported where it is used.

__all__ = ["PAGE_OUTPUTS", "PANEL_OUTPUTS", "build_demo", "launch", "page_outputs", "panel_outputs",
           "translate_page", "update_views"]

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 1  # one translation at a time: a CPU machine (a free Space has 2 cores) is busy with one
DEFAULT_QUEUE_SIZE = 16
PANELS = 2
DEFAULT_TITLE = "hf_headattn: translate and compare attention"

# What a translation puts in the page: these, then each panel's PANEL_OUTPUTS
PAGE_OUTPUTS = ("notice", "layer", "heads", "difference", "comparison")
PANEL_OUTPUTS = ("description", "notices", "translations", "show", *VIEWS, "state")


def _offline_theme():
    """Gradio's default theme with the system's fonts: its own fonts would be fetched from the web."""
    import gradio as gr

    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "monospace"])


@dataclass(frozen=True)
class _Controls:
    """The page's top: the source text box, the decoding settings, the Translate button and the page's notice."""

    text: Any
    beams: Any
    nbest: Any
    new_tokens: Any
    button: Any
    notice: Any


@dataclass(frozen=True)
class _LinkedViews:
    """What both panels share: one layer and heads choice, and the difference of their maps."""

    layer: Any
    heads: Any
    difference: Any


class _Sections:
    """The page's sections, each a row with one column per panel, so that a section starts at the same height in
    both panels whatever wraps above it; `panels` gathers each panel's components by name."""

    def __init__(self, panel_count: int):
        self.panels = [{} for _ in range(panel_count)]

    def row(self, heading: str | None = None):
        """A section (under `heading`), yielding each panel's index and its components inside the panel's column."""
        import gradio as gr

        if heading:
            gr.Markdown(heading)
        with gr.Row(equal_height=False):
            for index, panel in enumerate(self.panels):
                with gr.Column(elem_classes=["panel", f"panel-{index}"], min_width=0):
                    yield index, panel


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
    sections = _Sections(min(PANELS, len(models)))
    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        controls = _build_controls(title, page_examples(models), num_beams=num_beams, max_new_tokens=max_new_tokens)
        _build_model_sections(sections, models)
        linked = _build_attention_sections(sections)
        for panel in sections.panels:
            panel["state"] = gr.State(None)  # the panel's PanelResult, which the views are drawn from
        comparison = gr.State(None)
        _connect_translation(controls, linked, comparison, sections.panels, models,
                             translate_settings=dict(max_lines=max_lines, time_limit=time_limit),
                             concurrency_limit=concurrency_limit)
        _connect_views(linked, comparison, sections.panels)
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=queue_size)
    return demo


def _build_controls(title: str, examples: list[str], *, num_beams: int, max_new_tokens: int) -> _Controls:
    import gradio as gr

    gr.Markdown(f"# {title}\nType sentences in the models' source language, one a line, and press "
                "**Translate**. Each panel translates with the model chosen above it and shows where its "
                "cross-attention went; the layer and heads chosen below apply to both.")
    text = gr.Textbox(label="source text (one sentence a line)", lines=3, elem_id="source-text",
                      placeholder=examples[0] if examples else FALLBACK_EXAMPLE)
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
    return _Controls(text, beams, nbest, new_tokens, button, notice)


def _build_model_sections(sections: _Sections, models: Sequence[DemoModel]) -> None:
    """Each panel's model choice, its description and notices; then its hypotheses."""
    import gradio as gr

    names = [model.name for model in models]
    for index, panel in sections.row():
        panel["model"] = gr.Dropdown(names, value=names[index], label="model", elem_id=f"model-{index}")
        panel["description"] = gr.Markdown(models[index].description, elem_id=f"description-{index}",
                                           elem_classes=["panel-description"])
        panel["notices"] = gr.HTML(elem_id=f"notices-{index}")
    for index, panel in sections.row():
        panel["show"] = gr.Dropdown([], label="hypothesis", elem_id=f"show-{index}")
        panel["translations"] = gr.HTML(elem_id=f"translations-{index}")


def _build_attention_sections(sections: _Sections) -> _LinkedViews:
    """The views of where attention went: the linked layer and heads choice, each panel's heat map and every head,
    the difference, the word alignment, the weights over heads and the fertility bounds."""
    import gradio as gr

    gr.Markdown("**Cross-attention**, source words x target words (hover a cell for its value): one layer and "
                "heads choice for both panels")
    with gr.Row(elem_id="linked-controls"):
        layer = gr.Dropdown([], label="layer (both panels)", elem_id="layer")
        heads = gr.Dropdown([], label="heads (both panels)", elem_id="heads")
    for index, panel in sections.row():
        panel["heatmap"] = gr.HTML(elem_id=f"heatmap-{index}")
    for index, panel in sections.row("**Every head of the layer**, with each head's share of exact zeros and its "
                                     "entropy"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=160):
                panel["grid"] = gr.HTML(elem_id=f"grid-{index}")
            with gr.Column(scale=2, min_width=160):
                panel["statistics"] = gr.HTML(elem_id=f"statistics-{index}")
    gr.Markdown("**Difference**, the left panel's map minus the right's, on the left panel's translation")
    difference = gr.HTML(elem_id="difference")
    for index, panel in sections.row("**Word alignment** (Pharaoh links, from what the alignment reads)"):
        panel["links"] = gr.HTML(elem_id=f"links-{index}")
    for index, panel in sections.row("**Weights over heads**"):
        panel["importances"] = gr.HTML(elem_id=f"importances-{index}")
    for index, panel in sections.row("**Cumulative attention against fertility bounds**"):
        panel["fertility"] = gr.HTML(elem_id=f"fertility-{index}")
    return _LinkedViews(layer, heads, difference)


def _connect_translation(controls: _Controls, linked: _LinkedViews, comparison, panels: list[dict],
                         models: Sequence[DemoModel], *, translate_settings: dict, concurrency_limit: int) -> None:
    """The Translate button, and each panel's model choice: the whole page again (:func:`translate_page`)."""
    by_name = {model.name: model for model in models}

    def on_translate(source, beam_count, best_count, token_count, *chosen):
        return translate_page(by_name, source, chosen, beam_count, best_count, token_count, **translate_settings)

    def on_model(source, beam_count, best_count, token_count, *chosen):
        if not (source or "").strip():  # nothing typed yet: show the models, translate nothing
            return page_outputs([PanelResult(name, by_name[name].description) for name in chosen])
        return on_translate(source, beam_count, best_count, token_count, *chosen)

    translate_inputs = [controls.text, controls.beams, controls.nbest, controls.new_tokens,
                        *(panel["model"] for panel in panels)]
    translate_outputs = [controls.notice, linked.layer, linked.heads, linked.difference, comparison,
                         *(panel[name] for panel in panels for name in PANEL_OUTPUTS)]
    controls.button.click(on_translate, inputs=translate_inputs, outputs=translate_outputs, api_name="translate",
                          concurrency_limit=concurrency_limit, concurrency_id="translate")
    for panel in panels:  # another model: both panels again, as the linked choices and the difference need
        panel["model"].input(on_model, inputs=translate_inputs, outputs=translate_outputs, api_name=False,
                             concurrency_limit=concurrency_limit, concurrency_id="translate")


def _connect_views(linked: _LinkedViews, comparison, panels: list[dict]) -> None:
    """Another layer, heads or hypothesis: the views redrawn from the panels' states (:func:`update_views`)."""
    view_inputs = [linked.layer, linked.heads, comparison,
                   *(panel[name] for panel in panels for name in ("state", "show"))]
    view_outputs = [*(panel[name] for panel in panels for name in VIEWS), linked.difference]
    for control in (linked.layer, linked.heads, *(panel["show"] for panel in panels)):
        control.input(update_views, inputs=view_inputs, outputs=view_outputs, api_name=False,
                      show_progress="hidden")


def translate_page(models: dict[str, DemoModel], source: str, chosen: Sequence[str], num_beams, nbest,
                   max_new_tokens, *, max_lines: int = DEFAULT_MAX_LINES,
                   time_limit: float = DEFAULT_TIME_LIMIT) -> tuple:
    """What the Translate button puts in the page (:func:`page_outputs`) for the `chosen` models, one a panel. Never
    raises: what goes wrong is a message in the page (and a traceback in the log)."""
    try:
        lines, notices = split_lines(source, max_lines)
    except DemoInputError as error:
        return page_outputs([PanelResult(name, models[name].description) for name in chosen], notices=[str(error)])
    results, done = [], {}
    for name in chosen:
        if name not in done:  # both panels on one model: translate once
            done[name] = _translate_safely(models[name], lines, num_beams, nbest, max_new_tokens, time_limit)
        results.append(done[name])
    comparison = None
    if len(results) == 2 and all(result.lines for result in results):
        comparison = _compare_safely(models[chosen[0]], models[chosen[1]], results[0])
    return page_outputs(results, comparison, notices)


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
        return PanelResult(model.name, model.description, error=f"Translating failed: {one_line(error)}")


def _compare_safely(first: DemoModel, second: DemoModel, first_result: PanelResult) -> Comparison:
    try:
        return compare_panels(first, second, first_result)
    except Exception as error:  # the panels still show; the difference view says what failed
        logger.exception("Comparing %s with %s failed", first.name, second.name)
        return Comparison(refusal=f"Comparing the two models failed: {one_line(error)}")


def page_outputs(results: Sequence[PanelResult], comparison: Comparison | None = None,
                 notices: Sequence[str] = ()) -> tuple:
    """The page's outputs (:data:`PAGE_OUTPUTS`), then each panel's (:data:`PANEL_OUTPUTS`), for the panels'
    `results`: the linked layer and heads choices reset to the last layer both models have and what the alignment
    reads."""
    import gradio as gr

    layers, heads = linked_layer_choices(results), linked_head_choices(results)
    layer = default_layer(results)
    head = ALIGNMENT_VIEW if heads else None
    difference = render_difference(results, comparison, None, layer, head)
    return (render_notices(None, notices), gr.update(choices=layers, value=layer), gr.update(choices=heads, value=head),
            difference, comparison, *(value for result in results for value in panel_outputs(result, layer, head)))


def panel_outputs(result: PanelResult, layer: str | None = None, heads: str | None = ALIGNMENT_VIEW) -> tuple:
    """One panel's outputs, in :data:`PANEL_OUTPUTS` order, for `result`: its views show the first line's best
    hypothesis for the page's `layer` and `heads` choice."""
    import gradio as gr

    shows = view_choices(result)
    views = render_panel(result, None, layer, heads)
    show = gr.update(choices=shows, value=shows[0][1] if shows else None)
    return (result.description, render_notices(result), render_translations(result), show,
            *(views[name] for name in VIEWS), result)


def update_views(layer: str | None, heads: str | None, comparison: Comparison | None, *states_and_shows) -> tuple:
    """Every panel's views (:data:`VIEWS`), then the difference, after a layer, heads or hypothesis choice;
    `states_and_shows` alternates each panel's result and its hypothesis choice. A failure is a message in the
    heat map's (the difference's) place."""
    results, shows = states_and_shows[0::2], states_and_shows[1::2]
    outputs = []
    for result, show in zip(results, shows):
        try:
            views = render_panel(result, show, layer, heads)
            outputs += [views[name] for name in VIEWS]
        except Exception as error:
            logger.exception("Drawing the attention failed")
            outputs += [_drawing_failed(error), *[""] * (len(VIEWS) - 1)]
    try:
        outputs.append(render_difference(results, comparison, shows[0] if shows else None, layer, heads))
    except Exception as error:
        logger.exception("Drawing the difference failed")
        outputs.append(_drawing_failed(error))
    return tuple(outputs)


def _drawing_failed(error: Exception) -> str:
    return f'<div class="error">{html.escape(f"Drawing the attention failed: {one_line(error)}", quote=False)}</div>'


def launch(demo, *, host: str | None = None, port: int | None = None, **launch_kwargs):
    """Serve `demo` with the page's theme and style; `host` / `port` default to Gradio's (GRADIO_SERVER_NAME,
    GRADIO_SERVER_PORT, else 127.0.0.1:7860), so a Space's settings apply. No stack trace reaches the page
    (``show_error=False``; the handlers already turn errors into messages). The terminal gets one line, the page's
    address, instead of Gradio's advice (``share=True``) that a local page does not need; ``quiet=True`` drops that
    line too."""
    quiet = launch_kwargs.pop("quiet", False)
    block = not launch_kwargs.pop("prevent_thread_lock", False)
    launched = demo.launch(server_name=host, server_port=port, theme=_offline_theme(), css=CSS, show_error=False,
                           quiet=True, prevent_thread_lock=True, **launch_kwargs)
    if not quiet:
        print(f"page: {demo.local_url} (Ctrl+C stops it)", flush=True)
    if block:
        demo.block_thread()
    return launched