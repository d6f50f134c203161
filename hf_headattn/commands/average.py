"""`hf-headattn-average`: average the weights of a run's last checkpoints into a model folder (`hf_headattn.averaging`).

    hf-headattn-average --help          # or: python -m hf_headattn.commands.average --help
"""

from __future__ import annotations

from pathlib import Path

from ..averaging import average_checkpoints, last_checkpoints
from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_verbose_and_version_arguments, configure_logging,
                   skip_exit_collections)

EXAMPLES = """examples:
  # the last 5 checkpoints of a run (train with e.g. --save_steps 200 --save_total_limit 5 to keep them)
  hf-headattn-average --last 5 runs/de-en --output_dir runs/de-en-avg5
  # named checkpoints
  hf-headattn-average --checkpoints runs/de-en/checkpoint-1800 runs/de-en/checkpoint-2000 --output_dir avg
"""


def make_parser():
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-average", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Average the weights of checkpoints of one training run into a model folder that loads like\n"
                    "any other (trust_remote_code), as fairseq's average_checkpoints.py does.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoints", nargs="+", metavar="DIR", help="checkpoint folders to average")
    which.add_argument("--last", nargs=2, metavar=("N", "RUN_DIR"),
                       help="the N newest checkpoint-* folders of a training run's output folder")
    parser.add_argument("--output_dir", required=True, help="the averaged model's folder (must not exist)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --output_dir if it exists and this command wrote it")
    parser.add_argument("--allow_different_runs", action="store_true",
                        help="average checkpoints of different runs (other seeds, data or settings of one "
                             "architecture and tokenizer): a model soup")
    add_verbose_and_version_arguments(parser)
    return parser


def main(argv=None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    try:
        if args.last:
            count, run_dir = args.last
            if not count.isdigit() or int(count) < 1:
                parser.error(f"--last N RUN_DIR: N must be a positive whole number, got {count!r}")
            checkpoints = last_checkpoints(run_dir, int(count))
        else:
            checkpoints = [Path(checkpoint) for checkpoint in args.checkpoints]
        output = average_checkpoints(checkpoints, args.output_dir, overwrite=args.overwrite,
                                     allow_different_runs=args.allow_different_runs)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(checkpoint.name for checkpoint in checkpoints)}) "
          f"| written: {output}")


if __name__ == "__main__":
    main()
