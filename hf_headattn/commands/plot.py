"""`hf-headattn-plot`: figures of trained models as PNG files (`hf_headattn.plotting`).

    hf-headattn-plot --help            # or: python -m hf_headattn.commands.plot --help
"""

from __future__ import annotations

import argparse

from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_verbose_and_version_arguments, check_file_flags,
                   check_model_flag, configure_logging, positive_int, skip_exit_collections)
from ..loading import add_trust_remote_code_argument, load_model_and_tokenizer, remote_code_allowed
from ..plotting import (ATTENTION_HEADS, head_importance_figure, learned_alphas, plot_attention_map,
                        plot_bleu_by_length, plot_learned_alphas, systems_from_files)


EXAMPLES = """examples:
  # a model to plot: the demo writes runs/demo/model (softmax cross-attention; --cross_attention dhicm for DHICM)
  hf-headattn-demo --cross_attention dhicm --output_dir runs/demo-dhicm
  # cross-attention map of one sentence (DHICM's Figures 1-2, Malaviya et al.'s Figure 2); either model family
  hf-headattn-plot attention-map --model runs/demo/model --sentence "ein hund läuft ." \\
      --output runs/demo/attention.png --heads all
  # DHICM head importances of one sentence (DHICM's Figure 3)
  hf-headattn-plot head-importances --model runs/demo-dhicm/model --sentence "ein hund läuft ." \\
      --output runs/demo-dhicm/head_importances.png
  # BLEU by source length of several systems (Cui et al.'s Figure 2), from hf-headattn-evaluate's JSONs
  hf-headattn-plot bleu-by-length --results runs/a/eval/test.beam4.metrics.json \\
      runs/b/eval/test.beam4.metrics.json --labels softmax MMA --output runs/bleu_by_length.png
  # each head's learned alpha of alpha-entmax models (--cross_attention entmax_alpha ...; Correia et al.'s Figure 2)
  hf-headattn-plot learned-alphas --models runs/alpha-1/model runs/alpha-2/model --labels "seed 1" "seed 2" \
      --output runs/learned_alphas.png
  # --model takes a local folder; a Hugging Face Hub id also needs --trust_remote_code (its code would run here)
"""


def make_parser() -> argparse.ArgumentParser:
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-plot", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Figures of trained models as PNG files: attention maps, DHICM head importances, BLEU by "
                    "length, learned entmax alphas.\n`hf-headattn-plot COMMAND --help` lists a command's flags.")
    add_verbose_and_version_arguments(parser)
    # subcommands take the underscore spelling (--num_beams) with the dashed one as an alias
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UnderscoreArgumentParser)

    def add_command(name, help):
        return commands.add_parser(name, help=help, description=help, formatter_class=HelpFormatter,
                                   epilog=EXAMPLES)

    heads = add_command("head-importances", "DHICM head importances of one sentence (Figure 3)")
    heads.add_argument("--model", required=True, help="saved model folder (loaded through its own code), or a Hub "
                                                       "id with --trust_remote_code")
    add_trust_remote_code_argument(heads)
    heads.add_argument("--sentence", required=True, help="source sentence")
    heads.add_argument("--module", default=None, help="e.g. encoder.layers.5.self_attn (None: the last encoder one)")
    heads.add_argument("--output", required=True, help="PNG file to write")

    attention = add_command("attention-map", "cross-attention map of one sentence (either family)")
    attention.add_argument("--model", required=True, help="saved model folder (loaded through its own code), or "
                                                           "a Hub id with --trust_remote_code")
    add_trust_remote_code_argument(attention)
    attention.add_argument("--sentence", required=True, help="source sentence")
    attention.add_argument("--layer", type=int, default=-1, help="decoder layer (negative: from the top)")
    attention.add_argument("--heads", default="mean", choices=ATTENTION_HEADS, help="head mean, or one panel a head")
    attention.add_argument("--target", default=None, help="force this target (e.g. the reference) instead of "
                                                          "the model's translation")
    attention.add_argument("--num_beams", type=positive_int, default=1, help="beam size of the translation")
    attention.add_argument("--output", required=True, help="PNG file to write")

    lengths = add_command("bleu-by-length", "BLEU by source length of several systems")
    lengths.add_argument("--results", required=True, nargs="+", help="evaluation JSONs (or example results.json)")
    lengths.add_argument("--labels", nargs="+", default=None, help="one per system (None: model folder names)")
    lengths.add_argument("--title", default=None, help="figure title")
    lengths.add_argument("--output", required=True, help="PNG file to write")

    alphas = add_command("learned-alphas", "each head's learned alpha of alpha-entmax models, by site and layer")
    alphas.add_argument("--models", required=True, nargs="+", help="saved model folders (e.g. one per seed)")
    alphas.add_argument("--labels", nargs="+", default=None, help="one per model (None: the folders' names)")
    alphas.add_argument("--title", default=None, help="figure title")
    alphas.add_argument("--output", required=True, help="PNG file to write; the alphas go beside it as JSON")
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()

    if args.command == "bleu-by-length":
        check_file_flags(parser, {"--results": args.results})
        try:  # every results file read and checked before the figure is drawn
            systems = systems_from_files(args.results, args.labels)
        except (FileNotFoundError, ValueError) as error:
            parser.exit(1, f"{parser.prog} bleu-by-length: error: {error}\n")
        print(f"written: {plot_bleu_by_length(systems, args.output, title=args.title)}")
        return

    if args.command == "learned-alphas":
        learned_alphas_command(parser, args)
        return

    check_model_flag(parser, args.model)
    try:
        remote_code_allowed(args.model, args.trust_remote_code)
    except ValueError as error:
        parser.error(str(error))
    try:  # a damaged folder, named (saved_files.DamagedFile), or one that is no model
        model, tokenizer = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: cannot load --model {args.model}: {error}\n")
    if args.command == "head-importances":
        print(f"written: {head_importance_figure(model, tokenizer, args.sentence, args.output, args.module)}")
    else:
        written = plot_attention_map(model, tokenizer, args.sentence, args.output, layer=args.layer, heads=args.heads,
                                     target=args.target, num_beams=args.num_beams)
        print(f"written: {written}")


def learned_alphas_command(parser, args) -> None:
    """Every model loaded and read before the figure is drawn; the figure, its alphas as JSON, one summary line
    per model."""
    import json

    from ..output_files import new_file

    labels = args.labels or [str(model) for model in args.models]
    if len(labels) != len(args.models):
        parser.exit(1, f"{parser.prog} learned-alphas: error: {len(labels)} labels for {len(args.models)} models\n")
    runs = {}
    for label, folder in zip(labels, args.models):
        check_model_flag(parser, folder)
        try:
            model, _ = load_model_and_tokenizer(folder)
        except (OSError, ValueError) as error:
            parser.exit(1, f"{parser.prog}: error: cannot load --models {folder}: {error}\n")
        runs[label] = learned_alphas(model)
    try:
        written = plot_learned_alphas(runs, args.output, title=args.title)
    except ValueError as error:
        parser.exit(1, f"{parser.prog} learned-alphas: error: {error}\n")
    beside = written.with_suffix(".json")
    with new_file(beside) as handle:
        handle.write(json.dumps(runs, indent=2) + "\n")
    for label, modules in runs.items():
        alphas = [alpha for module in modules.values() for alpha in module["alphas"]]
        print(f"{label}: {len(alphas)} heads, alpha {min(alphas):.3f}-{max(alphas):.3f}, mean "
              f"{sum(alphas) / len(alphas):.3f}" if alphas else f"{label}: no learned alphas")
    print(f"written: {written} and {beside}")


if __name__ == "__main__":
    main()
