"""`hf-headattn-hub`: model cards, Hub upload and Gradio Spaces for saved model folders.

    hf-headattn-hub card --model runs/de-en --evaluation EVALUATION.json --dataset_name "Multi30k (task 1)"
    hf-headattn-hub push --model runs/de-en --repo_id user/de-en [--private]
    hf-headattn-hub space --model runs/de-en --model runs/de-en-csparsemax --output_dir runs/space
    hf-headattn-hub push --space runs/space --repo_id user/de-en-demo

Also `python -m hf_headattn.commands.hub`. The libraries: :mod:`hf_headattn.publish` (cards, upload) and
:mod:`hf_headattn.app.space`.
"""

from __future__ import annotations

import argparse

from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_verbose_and_version_arguments, check_model_flag,
                   configure_logging, skip_exit_collections)

# the libraries (huggingface_hub, and Transformers where they use it) are imported after parsing: `--help` is instant


EXAMPLES = """examples:
  # fill the family's card template from hf-headattn-evaluate's JSON into runs/de-en/README.md
  hf-headattn-hub card --model runs/de-en --evaluation runs/de-en/eval/test_2016_flickr.beam4.metrics.json \\
      --dataset_name "Multi30k (task 1)" --dataset_id bentrevett/multi30k --language de en --repo_id user/de-en
  # check the folder is complete, then upload model, tokenizer, code, pipeline and card in one commit
  hf-headattn-hub push --model runs/de-en --repo_id user/de-en --private
  # a Gradio Space with the web demo of two models (runs with torch, Transformers and gradio alone), then upload it
  hf-headattn-hub space --model runs/demo/model --model runs/demo-csparsemax/model --output_dir runs/space
  hf-headattn-hub push --space runs/space --repo_id user/headattn-demo
"""


def make_parser() -> argparse.ArgumentParser:
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-hub", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Model cards and Hub upload for saved model folders.\n"
                    "`hf-headattn-hub COMMAND --help` lists a command's flags.")
    add_verbose_and_version_arguments(parser)
    # subcommands take the underscore spelling (--output_dir) with the dashed one as an alias
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UnderscoreArgumentParser)

    def add_command(name, help):
        return commands.add_parser(name, help=help, description=help, formatter_class=HelpFormatter,
                                   epilog=EXAMPLES)

    card = add_command("card", "write <model>/README.md from an evaluation JSON")
    card.add_argument("--model", required=True, help="saved model folder")
    card.add_argument("--evaluation", required=True, help="metrics JSON written by hf-headattn-evaluate")
    card.add_argument("--dataset_name", required=True, help='e.g. "Multi30k (task 1)"')
    card.add_argument("--dataset_id", default=None, help="Hub dataset id, e.g. bentrevett/multi30k")
    card.add_argument("--dataset_config", default=None, help="Hub dataset configuration, if it has several")
    card.add_argument("--language", nargs=2, default=["de", "en"], metavar=("SOURCE", "TARGET"),
                      help="source and target language codes")
    card.add_argument("--repo_id", default=None, help="the Hub repository the snippets load from")
    card.add_argument("--model_name", default=None,
                      help="the card's title (None: --repo_id's last part, else the folder name)")
    card.add_argument("--license", default=None, help="Hub license id, e.g. apache-2.0 (omitted if not given)")
    card.add_argument("--training_data", default=None, help="text of the Training data section")
    card.add_argument("--limitation", action="append", default=[], help="an extra limitation bullet (repeatable)")
    push = add_command("push", "check the folder and upload it to the Hub")
    what = push.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="saved model folder with README.md")
    what.add_argument("--space", help="a Space folder written by `hf-headattn-hub space`, uploaded as a Gradio Space")
    push.add_argument("--repo_id", required=True, help="Hub repository, e.g. user/de-en (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--commit_message", default=None, help="None: huggingface_hub's default message")
    space = add_command("space", "write a Gradio Space folder with the web demo of one or more models")
    space.add_argument("--model", action="append", required=True,
                       help="saved model folder (copied into the Space) or Hub model id; repeat for side by side")
    space.add_argument("--output_dir", required=True, help="the Space folder to write")
    space.add_argument("--title", default=None, help="the Space's title (None: from the models' names)")
    space.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
    return parser


def main(argv=None):
    """The `hf-headattn-hub` command (also `python -m hf_headattn.commands.hub`)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    # card and push take a folder; space also takes Hub ids, but would write a mistyped folder in as one to download
    check_model_flag(parser, args.model, hub_ids=args.command == "space")
    from ..app.space import push_space, write_space
    from ..publish import push_to_hub, write_model_card

    if args.command == "card":
        try:  # the evaluation JSON is read and checked before README.md is written
            written = write_model_card(
                args.model, args.evaluation, dataset_name=args.dataset_name, dataset_id=args.dataset_id,
                dataset_config=args.dataset_config, language=tuple(args.language), repo_id=args.repo_id,
                model_name=args.model_name, license=args.license, training_data=args.training_data,
                limitations=args.limitation,
            )
        except (FileNotFoundError, ValueError) as error:
            parser.exit(1, f"{parser.prog} card: error: {error}\n")
        print("written:", written)
    elif args.command == "space":
        try:
            print("written:", write_space(args.model, args.output_dir, title=args.title, overwrite=args.overwrite))
        except ValueError as error:
            parser.exit(1, f"{parser.prog} space: error: {error}\n")
    elif args.space:
        message = {"commit_message": args.commit_message} if args.commit_message else {}
        try:
            print("uploaded:", _commit_url(push_space(args.space, args.repo_id, private=args.private, **message)))
        except (FileNotFoundError, ValueError) as error:
            parser.exit(1, f"{parser.prog} push: error: {error}\n")
    else:
        message = {"commit_message": args.commit_message} if args.commit_message else {}
        print("uploaded:", _commit_url(push_to_hub(args.model, args.repo_id, private=args.private, **message)))


def _commit_url(commit_info) -> str:
    """The address of the commit an upload made (what ``upload_folder``'s ``CommitInfo`` names)."""
    return str(getattr(commit_info, "commit_url", None) or commit_info)


if __name__ == "__main__":
    main()
