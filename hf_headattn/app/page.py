"""The web page (Gradio): a text box (one sentence a line), the decoding settings (beams, n-best, max new tokens)
and a Translate button; two panels side by side, each showing one of the loaded models (:mod:`.panels`) through the
views (:mod:`.views`).

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

from .panels import (
    DEFAULT_MAX_LINES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NUM_BEAMS,
    DEFAULT_TIME_LIMIT,
    MAX_BEAMS,
    MAX_NEW_TOKENS,
    DemoInputError,
    DemoModel,
    PanelResult,
    one_line,
    run_with_time_limit,
    split_lines,
    translate_panel,
)
from .views import (
    ALIGNMENT_VIEW,
    CSS,
    head_choices,
    layer_choices,
    render_notices,
    render_panel,
    render_translations,
    view_choices,
)

# gradio is imported where it is used.

__all__ = ["PANEL_OUTPUTS", "build_demo", "launch", "panel_outputs", "translate_page", "update_views"]

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 1  # one translation at a time: a CPU machine (a free Space has 2 cores) is busy with one
DEFAULT_QUEUE_SIZE = 16
PANELS = 2
EXAMPLES_SHOWN = 10
DEFAULT_TITLE = "hf_headattn: translate and compare attention"

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
        return PanelResult(model.name, model.description, error=f"Translating failed: {one_line(error)}")


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
        message = html.escape(f"Drawing the attention failed: {one_line(error)}", quote=False)
        return (f'<div class="error">{message}</div>', "", "", "")
    return views["heatmap"], views["links"], views["importances"], views["fertility"]


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