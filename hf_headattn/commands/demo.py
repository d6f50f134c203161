"""`hf-headattn-demo`: train and translate on a toy corpus, offline (writes runs/demo).

    hf-headattn-demo [--cross_attention csparsemax] [--epochs 10] [--output_dir runs/demo-csparsemax]

Also `python -m hf_headattn.commands.demo`. The library is :func:`hf_headattn.demo.run`.
"""

import json

from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_json_argument, add_verbose_and_version_arguments,
                   configure_logging, positive_float, skip_exit_collections)
from ..demo import DEFAULT_OUTPUT_DIR, run
from ..runtime.attention_base import CROSS_ATTENTION
from ..runtime.attention_registry import ATTENTION_VARIANTS

CROSS_ATTENTION_VARIANTS = sorted(name for name, variant in ATTENTION_VARIANTS.items()
                                  if CROSS_ATTENTION in variant.sites)

EXAMPLES = f"""examples:
  # the toy corpus in runs/demo/data, the model in runs/demo/model, BLEU and exact match in
  # runs/demo/demo_results.json (36 s on a quiet 2-core CPU)
  hf-headattn-demo
  # constrained sparsemax cross-attention, 10 epochs, elsewhere
  hf-headattn-demo --cross_attention csparsemax --epochs 10 --output_dir runs/demo-csparsemax
  # then translate with the saved folder, no hf_headattn needed:
  #   pipeline("translation", model="{DEFAULT_OUTPUT_DIR}/model", trust_remote_code=True)
"""


def make_parser() -> UnderscoreArgumentParser:
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-demo", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Train a small model on a generated German->English toy corpus, reload the saved folder\n"
                    "through its own code and translate held-out sentences with pipeline('translation'). Offline.\n"
                    "Flags use Transformers' underscore spelling; the dashed one works too.")
    parser.add_argument("--output_dir", default=DEFAULT_OUTPUT_DIR,
                        help="folder for the corpus (data/), the model (model/) and demo_results.json")
    parser.add_argument("--epochs", type=positive_float, default=5, help="training epochs over the 3,000 toy pairs")
    parser.add_argument("--cross_attention", default="softmax", choices=CROSS_ATTENTION_VARIANTS,
                        help="attention variant of the cross-attention")
    add_json_argument(parser, "the test results (demo_results.json)")
    add_verbose_and_version_arguments(parser)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    summary = run(args.output_dir, args.epochs, args.cross_attention, show=not args.json)
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
