r"""The web page: translate in a browser and see where each model's attention goes, two models side by side.

    hf-headattn-app --model runs/demo/model --model runs/demo-csparsemax/model [--port 7860]

:mod:`.page` is the Gradio page (the ``app`` extra: ``pip install "gradio>=6,<7"``), :mod:`.panels` what each panel shows for a model
(translations with their attention, messages), :mod:`.views` the HTML and SVG views, and :mod:`.space` the Gradio
Space that ``hf-headattn-hub space`` writes. The command is :mod:`hf_headattn.commands.app`.

Travels into Hugging Face Spaces: a Space holds this package's modules (but :mod:`.space`) and every module of
hf_headattn they import (``translation.py`` and what it needs; :func:`hf_headattn.app.space.space_code_files`),
copied unchanged, and its models load through their own code (``trust_remote_code``). So these modules import, at
module level and in everything the page runs, only each other, the package's modules outside ``runtime/``, the
standard library, torch, Transformers and gradio; this ``__init__`` does not import :mod:`.space`, which needs
the publishing code.

Tooling, not model runtime: never copied into a checkpoint.
"""

from .page import PAGE_OUTPUTS, PANEL_OUTPUTS, build_demo, launch, translate_page
from .panels import (
    Comparison,
    DemoInputError,
    DemoModel,
    PanelResult,
    card_examples,
    compare_panels,
    describe_model,
    load_models,
    load_through_own_code,
    page_examples,
    split_lines,
    translate_panel,
)
from .views import render_panel

__all__ = [
    "PAGE_OUTPUTS",
    "PANEL_OUTPUTS",
    "Comparison",
    "DemoInputError",
    "DemoModel",
    "PanelResult",
    "build_demo",
    "card_examples",
    "compare_panels",
    "describe_model",
    "launch",
    "load_models",
    "load_through_own_code",
    "page_examples",
    "render_panel",
    "split_lines",
    "translate_page",
    "translate_panel",
]
