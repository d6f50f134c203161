"""`hf-headattn-evaluate`: translate a test set with a saved model folder and score it (`hf_headattn.evaluation`).

    hf-headattn-evaluate --help            # or: python -m hf_headattn.commands.evaluate --help
"""

from __future__ import annotations

import argparse
import json

from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_early_stopping_argument, add_json_argument,
                   add_quiet_argument, add_verbose_and_version_arguments, check_file_flags, check_model_flag,
                   configure_logging, finite_float, keep_freed_memory, non_negative_float, positive_int,
                   skip_exit_collections)
from ..evaluation import TOKENIZE_CHOICES, evaluate_model
from ..metrics import DEFAULT_LENGTH_BUCKETS, DROP_ALIGNMENT_RUNS
from ..translation.batches import AUTO_BATCH_SIZE


EXAMPLES = """examples:
  # beam 4 on Multi30k's 2016 test set, with DROP (eflomal trained on the training pairs, cached)
  hf-headattn-evaluate --model runs/de-en \\
      --source ../shared/data/multi30k/test_2016_flickr.de --reference ../shared/data/multi30k/test_2016_flickr.en \\
      --train_source ../shared/data/multi30k/train.de --train_target ../shared/data/multi30k/train.en \\
      --output_dir runs/de-en/eval
  # -> runs/de-en/eval/test_2016_flickr.beam4.hyp.en and test_2016_flickr.beam4.metrics.json, and one line with
  #    BLEU, chrF, TER, REP, DROP, the number of sentences and the metrics file ("written: ...")
  # greedy, no DROP, output capped at 64 tokens -> test_2016_flickr.greedy-maxlen64.*; --json prints the whole JSON
  hf-headattn-evaluate --model runs/de-en --source test.de --reference test.en --output_dir runs/de-en/eval \\
      --num_beams 1 --max_length 64 --json
  # a CTranslate2 export of the model (hf-headattn-export): the same files, translated by CTranslate2
  hf-headattn-evaluate --model runs/de-en-ct2 --source test.de --reference test.en --output_dir runs/de-en-ct2/eval
"""


def make_parser() -> argparse.ArgumentParser:
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-evaluate", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Translate a test set with a saved model folder (either family, loaded through its own code;\n"
                    "local folders only) and write the hypotheses and a JSON of BLEU, chrF, TER, REP, DROP and\n"
                    "BLEU by source length. Flags use Transformers' underscore spelling; the dashed one works too.")
    parser.add_argument("--model", required=True,
                        help="saved model folder (either family), or a CTranslate2 export (hf-headattn-export)")
    parser.add_argument("--source", required=True, help="test source file, one sentence a line")
    parser.add_argument("--reference", required=True, help="test reference file, line-aligned with --source")
    parser.add_argument("--output_dir", required=True, help="where the hypotheses and the metrics JSON go")
    parser.add_argument("--train_source", help="source side of the DROP aligner's training corpus")
    parser.add_argument("--train_target", help="target side of it; DROP is only computed with both")
    parser.add_argument("--num_beams", type=positive_int, default=4, help="beam size (1: greedy)")
    parser.add_argument("--batch_size", type=positive_int, default=None,
                        help="sentences translated at once (default: hf-headattn-translate's: 640 / --num_beams on the "
                             "fast path, at least 128; 32 through generate on a CPU, 128 on a GPU; 128 for an "
                             "export)")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA if available), cpu, cuda or cuda:N; the CPU decodes through the fast path, "
                             "CUDA through generate, where the fast path was measured slower (docs/deploying.md)")
    parser.add_argument("--max_length", type=positive_int, default=None,
                        help="longest output in tokens (None: the folder's generation_config.max_length)")
    parser.add_argument("--coverage_penalty", type=non_negative_float, default=0.0,
                        help="beta of Wu et al.'s coverage penalty re-ranking the beam (LSTM models; 0: none)")
    parser.add_argument("--length_penalty", type=finite_float, default=None,
                        help="beam scores are log-probability / length ** this (None: the model's generation config, "
                             "Transformers' 1.0; 0: the log-probability alone, OpenNMT-py's -alpha 0)")
    add_early_stopping_argument(parser)
    parser.add_argument("--length_buckets", type=positive_int, nargs="+", default=list(DEFAULT_LENGTH_BUCKETS),
                        metavar="N", help="source-length bucket boundaries of BLEU by length")
    parser.add_argument("--tokenize", default="13a", choices=TOKENIZE_CHOICES, help="word tokenisation of REP/DROP")
    parser.add_argument("--test_name", default=None, help="name of the test set in file names and the JSON (None: "
                                                          "the source file name without its suffix)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier result of this test name and decoding in --output_dir (refused "
                             "otherwise: it may be another test set of the same file name)")
    parser.add_argument("--tokenizer", default=None,
                        help="another tokenizer folder than the model's own (refused unless the model was trained "
                             "with it)")
    parser.add_argument("--force", action="store_true",
                        help="only warn when --tokenizer is not the one the model was trained with, or when the "
                             "folder's saved code is not the installed package's (refused otherwise: the scores "
                             "would be of other code than a user of the folder runs)")
    parser.add_argument("--drop_runs", type=positive_int, default=DROP_ALIGNMENT_RUNS,
                        help="eflomal alignment runs pooled into DROP; their spread goes into the JSON")
    parser.add_argument("--drop_cache_dir", default=None,
                        help="cache of DROP's trained aligner and alignments (None: $HF_HEADATTN_CACHE/drop or "
                             "~/.cache/hf_headattn/drop)")
    add_json_argument(parser, "the whole metrics JSON (also written to --output_dir)")
    add_quiet_argument(parser)
    add_verbose_and_version_arguments(parser)
    return parser


def main(argv=None) -> None:
    """The `hf-headattn-evaluate` command (also `python -m hf_headattn.commands.evaluate`); exits 0 once the results
    are written."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    keep_freed_memory()  # decoding reallocates tensors of MiBs at every step
    if (args.train_source is None) != (args.train_target is None):
        parser.error("--train_source and --train_target go together")
    check_model_flag(parser, args.model, hub_ids=False)  # evaluation runs only a local folder's code
    check_file_flags(parser, {"--source": args.source, "--reference": args.reference,
                              "--train_source": args.train_source, "--train_target": args.train_target})
    check_model_flag(parser, args.tokenizer, "--tokenizer")

    try:  # what the library refuses (a damaged file, named; mismatched test files; ...) is one line, not a traceback
        results = evaluate_model(
            args.model, args.source, args.reference,
            num_beams=args.num_beams, batch_size=args.batch_size or AUTO_BATCH_SIZE, device=args.device,
            train_source=args.train_source, train_target=args.train_target, output_dir=args.output_dir,
            max_length=args.max_length, buckets=args.length_buckets, tokenize=args.tokenize, test_name=args.test_name,
            drop_runs=args.drop_runs, drop_cache_dir=args.drop_cache_dir, coverage_penalty=args.coverage_penalty,
            length_penalty=args.length_penalty, early_stopping=args.early_stopping, tokenizer=args.tokenizer,
            force=args.force, overwrite=args.overwrite, progress=not args.quiet,
        )
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    elif not args.quiet:
        print(summary_line(results))


def summary_line(results: dict) -> str:
    """`BLEU 36.50 | chrF 57.00 | TER 45.10 | 1,000 sentences | written: FILE`: the command's output for people (the
    JSON it wrote holds everything, DROP's spread over its alignment runs included)."""
    names = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER", "rep": "REP", "drop": "DROP"}
    scores = [f"{label} {results[name]:.2f}" for name, label in names.items() if results[name] is not None]
    return " | ".join([*scores, f"{results['test_set']['sentences']:,} sentences",
                       f"written: {results['files']['metrics']}"])


if __name__ == "__main__":
    main()
