"""`hf-headattn-app`: a web page to translate with one or two models and compare where their attention goes.

    hf-headattn-app --model runs/demo/model --model runs/demo-csparsemax/model [--port 7860]
    python -m hf_headattn.commands.app --model runs/demo/model    # the same; then open http://127.0.0.1:7860

The page is :mod:`hf_headattn.app`; this command loads the models (:mod:`hf_headattn.loading`) and serves it.
"""

from __future__ import annotations

import argparse
import logging
import os

from ..app import page, panels
from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_verbose_and_version_arguments, check_model_flag,
                   configure_logging, skip_exit_collections)
from ..loading import DEVICES, add_trust_remote_code_argument, resolve_device
from ..translation import load_translator

# torch, Transformers and gradio are imported after parsing, so that `--help` is instant.

logger = logging.getLogger(__name__)

DEFAULT_PORT = 7860
DEFAULT_HOST = "127.0.0.1"

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
csoftmax / csparsemax cumulative attention against the fertility bounds. Needs gradio (the app extra): pip install "gradio>=6,<7".
"""


def make_parser() -> argparse.ArgumentParser:
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
    limits.add_argument("--max_lines", type=int, default=panels.DEFAULT_MAX_LINES, help="lines translated per request")
    limits.add_argument("--time_limit", type=float, default=panels.DEFAULT_TIME_LIMIT,
                        help="seconds a translation may take before it stops")
    limits.add_argument("--concurrency_limit", type=int, default=page.DEFAULT_CONCURRENCY,
                        help="translations running at once (the others wait in the queue)")
    limits.add_argument("--queue_size", type=int, default=page.DEFAULT_QUEUE_SIZE,
                        help="requests that may wait; more are turned away with a message")
    defaults = parser.add_argument_group("the page's starting settings")
    defaults.add_argument("--num_beams", type=int, default=panels.DEFAULT_NUM_BEAMS,
                          help=f"beams (1 to {panels.MAX_BEAMS})")
    defaults.add_argument("--max_new_tokens", type=int, default=panels.DEFAULT_MAX_NEW_TOKENS,
                          help=f"longest translation in tokens (1 to {panels.MAX_NEW_TOKENS})")
    add_verbose_and_version_arguments(parser)
    return parser


def main(argv=None) -> None:
    """The `hf-headattn-app` command (also `python -m hf_headattn.commands.app`)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    check_model_flag(parser, args.model)
    for name in ("max_lines", "concurrency_limit", "queue_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive number, got {getattr(args, name)}")
    if not args.time_limit > 0:
        parser.error(f"--time_limit must be positive, got {args.time_limit}")
    if not 1 <= args.num_beams <= panels.MAX_BEAMS:
        parser.error(f"--num_beams must be between 1 and {panels.MAX_BEAMS}, got {args.num_beams}")
    if not 1 <= args.max_new_tokens <= panels.MAX_NEW_TOKENS:
        parser.error(f"--max_new_tokens must be between 1 and {panels.MAX_NEW_TOKENS}, got {args.max_new_tokens}")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio  # noqa: F401
    except ImportError:
        parser.exit(1, f'{parser.prog}: error: the web page needs gradio (the app extra): pip install "gradio>=6,<7"\n')
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        parser.error(str(error))

    def load(name):
        translator = load_translator(name, device=str(device), trust_remote_code=args.trust_remote_code)
        if translator.backend != "model":
            raise ValueError(f"{name} is a CTranslate2 export, whose attention the page cannot draw (CTranslate2 gives "
                             "one layer's, heads averaged): give the model folder it was exported from")
        return translator.model, translator.tokenizer

    models = panels.load_models(args.model, load)
    for model in models:
        if model.error:  # the page says so too; the terminal should not stay silent
            logger.error("Model %s is not available in the page: %s", model.name, model.error)
    demo = page.build_demo(models, max_lines=args.max_lines, time_limit=args.time_limit,
                           concurrency_limit=args.concurrency_limit, queue_size=args.queue_size,
                           num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    page.launch(demo, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
