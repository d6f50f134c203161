r"""`hf-headattn-translate` (also `python -m hf_headattn.commands.translate`): translate a text file or standard
input with a saved model, one sentence a line, into text, n-best lists or JSON lines.

    hf-headattn-translate --model runs/de-en --input test.de --output test.en [--num_beams 5]
    hf-headattn-translate --model runs/de-en --nbest 3 --num_beams 5 --alignments --output_format jsonl < in.de

The flags become a translator (:func:`hf_headattn.translation.load_translator`: a model folder, a Hub id or a
CTranslate2 export, with the device, dtype and int8 asked for) and its ``translate`` (the library: batches, decoding,
scores, alignments, what each backend cannot honour); this module parses the flags, checks the files before the
model loads, words the translator's refusals with the flags, and writes the output into a temporary file renamed at
the end, so that an interrupted run leaves no partial file. Under torchrun every process translates its share and
the first writes the whole file. What an export cannot honour is refused before anything is read.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path

from ..cli import (FLAG_SPELLING, PROGRESS_RULE, HelpFormatter, UnderscoreArgumentParser,
                   add_early_stopping_argument, add_quiet_argument, add_verbose_and_version_arguments,
                   check_file_flags, check_model_flag, configure_logging, finite_float, keep_freed_memory,
                   non_negative_int, positive_float, positive_int, probability, random_seed, skip_exit_collections)
from ..output_files import new_file
from ..translation import (ALIGNMENT_HEADS, AUTO_BATCH_SIZE, DEFAULT_BATCH_ROWS, DEFAULT_BATCH_SIZE,
                           DEFAULT_MAX_TOKENS, GENERATE_BATCH_SIZE, OUTPUT_FORMATS, QUANTIZATIONS, OptionRefused,
                           check_options, format_translation, load_translator, read_lines)
from ..translation.quantization import CPU_DTYPE_FLAGS, cpu_has_any_flag
from ..translation.sentences import distributed_state
from ..translation.translator import DTYPES

# torch, Transformers and the models are imported where they are used, so that `--help` is instant.

logger = logging.getLogger(__name__)

DECODINGS = {"auto": None, "fast": True, "generate": False}  # --decoding -> the translator's `fast`

EXAMPLES = """examples:
  # a file, beam 5 (progress: a bar on a terminal, plain lines in a log)
  hf-headattn-translate --model runs/de-en --input test.de --output test.en --num_beams 5
  # standard input to standard output
  echo "Ein Mann fährt Fahrrad." | hf-headattn-translate --model runs/de-en
  # 3-best lists with scores and word alignments, one JSON object per input line
  hf-headattn-translate --model runs/de-en --input test.de --output test.jsonl --num_beams 5 --nbest 3 \\
      --alignments --output_format jsonl
  # a CTranslate2 export (hf-headattn-export) translates alike, through CTranslate2
  hf-headattn-translate --model runs/de-en-ct2 --input test.de --output test.en --num_beams 5
  # under several processes: each translates its share, the first writes the whole file in input order
  torchrun --nproc_per_node 2 -m hf_headattn.commands.translate --model runs/de-en --input test.de --output test.en

output (--output_format text):
  one line per input line, line i translating input line i (a blank line stays blank);
  with --alignments: "translation ||| alignment" (Marian's convention);
  with --nbest N > 1: N lines per non-blank input line, "i ||| translation ||| score" (Moses' n-best
  convention, i counting input lines from 0), " ||| alignment" appended with --alignments.
output (--output_format jsonl): one object per input line, blank lines included:
  {"source": ..., "translations": [{"text": ..., "score": ..., "alignment": "0-0 1-2 ..."}]} (best first; empty
  for a blank line; "alignment" with --alignments).
score: the model's log-probability of the hypothesis (end of sentence included) divided by
  length ** length_penalty: the score beam search ranks by, computed alike for greedy and sampled output.
alignment: Pharaoh "i-j" pairs (source word i, target word j, 0-based, words split at whitespace) from the
  cross-attention of one decoder layer, heads averaged; the LSTM family: its attention, heads averaged.
"""


def make_parser() -> argparse.ArgumentParser:
    from ..loading import DEVICES, add_trust_remote_code_argument

    parser = UnderscoreArgumentParser(
        prog="hf-headattn-translate", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Translate a text file (one sentence a line) or standard input with a model folder or Hub id.\n"
                    "Flags use Transformers' underscore spelling; the dashed spelling (--num-beams) works too.")
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help="a saved model folder, a Hugging Face Hub id, or a CTranslate2 "
                                                      "export (hf-headattn-export)")
    add_trust_remote_code_argument(model, "--trust_remote_code")
    model.add_argument("--tokenizer", default=None, help="another tokenizer than the model's own (refused unless the "
                                                         "model was trained with it)")
    model.add_argument("--force", action="store_true",
                       help="only warn when --tokenizer is not the one the model was trained with")
    model.add_argument("--device", default="auto", help=f"{', '.join(DEVICES)} or cuda:N")
    model.add_argument("--dtype", default="auto", choices=DTYPES, help="weights' dtype (auto: as saved)")
    model.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                       help="int8: the linear layers quantized to int8 (dynamic quantization, CPU only)")
    files = parser.add_argument_group("input and output")
    files.add_argument("--input", default="-", help="UTF-8 text, one sentence a line (-: standard input)")
    files.add_argument("--output", default="-", help="where the translations go (-: standard output); written "
                                                     "to a temporary file renamed at the end")
    files.add_argument("--output_format", default="text", choices=OUTPUT_FORMATS, help="see below")
    files.add_argument("--nbest", type=positive_int, default=1, help="hypotheses per sentence (at most --num_beams)")
    files.add_argument("--alignments", action="store_true", help="add Pharaoh word alignments (see below)")
    files.add_argument("--alignment_layer", type=int, default=None,
                       help="decoder layer of the alignments (negative: from the end; None: a model trained with "
                            "guided alignment's guided layer, else the last)")
    files.add_argument("--alignment_heads", default="mean", choices=ALIGNMENT_HEADS,
                       help="mean: heads averaged (at a guided layer, its guided heads only); all: every head of "
                            "the layer averaged; hop: weighed by the model's weights over heads (multi-hop "
                            "models with dependent hops, DHICM)")
    decoding = parser.add_argument_group("decoding (None: the model's generation config)")
    decoding.add_argument("--num_beams", type=positive_int, default=None, help="beam size (1: greedy)")
    decoding.add_argument("--max_new_tokens", type=positive_int, default=None, help="longest translation in tokens")
    decoding.add_argument("--min_new_tokens", type=non_negative_int, default=None,
                          help="shortest translation in tokens (the end of sentence is not chosen before)")
    decoding.add_argument("--length_penalty", type=finite_float, default=None,
                          help="exponent of the length dividing beam scores")
    decoding.add_argument("--no_repeat_ngram_size", type=non_negative_int, default=None,
                          help="forbid repeating n-grams of this size (0: off)")
    add_early_stopping_argument(decoding)
    decoding.add_argument("--decoding", default="auto", choices=DECODINGS,
                          help="fast: greedy and beam search that drop finished sentences from their batch (the "
                               "translations of generate); generate: Transformers' generate (sampling always uses it); "
                               "auto: fast on the CPU, generate on CUDA, where the fast path was measured slower "
                               "(docs/deploying.md)")
    decoding.add_argument("--do_sample", action="store_true", help="sample instead of searching")
    decoding.add_argument("--top_k", type=non_negative_int, default=None,
                          help="sample from the k likeliest tokens (0: all)")
    decoding.add_argument("--top_p", type=probability, default=None, help="sample from the nucleus of this mass")
    decoding.add_argument("--temperature", type=positive_float, default=None, help="sampling temperature")
    decoding.add_argument("--seed", type=random_seed, default=None, help="random seed (sampling)")
    batching = parser.add_argument_group("batching (sentences are sorted by length, output keeps input order)")
    batching.add_argument("--batch_size", type=positive_int, default=None,
                          help=f"sentences per batch (default, when neither is given: on the fast path "
                               f"{DEFAULT_BATCH_ROWS} / --num_beams, at least {DEFAULT_BATCH_SIZE}; through generate "
                               f"{GENERATE_BATCH_SIZE} on a CPU, {DEFAULT_BATCH_SIZE} on a GPU; for an export "
                               f"{DEFAULT_BATCH_SIZE}; with --max_tokens {DEFAULT_MAX_TOKENS}; given one alone, the "
                               "other has no limit)")
    batching.add_argument("--max_tokens", type=positive_int, default=None, help="padded source tokens per batch")
    batching.add_argument("--strict", action="store_true",
                          help="refuse lines longer than the model takes (default: translate them cut, warning once)")
    shown = parser.add_argument_group("what is shown")
    shown.add_argument("--progress", action="store_true",
                       help=f"show progress on stderr also when reading standard input (default: when --input is a "
                            f"file): {PROGRESS_RULE}")
    add_quiet_argument(shown)
    add_verbose_and_version_arguments(shown)
    return parser


GENERATION_FLAGS = ("num_beams", "max_new_tokens", "min_new_tokens", "length_penalty", "no_repeat_ngram_size",
                    "early_stopping", "top_k", "top_p", "temperature")


def _check_paths(parser, args) -> None:
    if args.input != "-":
        check_file_flags(parser, {"--input": args.input})
    if args.output == "-":
        return
    output = Path(args.output)
    if args.input != "-" and output.resolve() == Path(args.input).resolve():
        parser.error(f"--output {args.output} is the input file: it would be overwritten while it is read")
    if output.is_dir():
        parser.error(f"--output {args.output} is a folder; name a file")
    if not output.parent.is_dir():
        parser.exit(1, f"{parser.prog}: error: cannot write --output {args.output}: its folder "
                       f"{output.parent} does not exist\n")


def main(argv=None) -> None:
    """The `hf-headattn-translate` command."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    keep_freed_memory()  # decoding reallocates tensors of MiBs at every step
    if args.quiet:
        logging.getLogger("hf_headattn").setLevel(logging.ERROR)
    if args.num_beams is not None and args.nbest > args.num_beams:
        parser.error(f"--nbest {args.nbest} is more than --num_beams {args.num_beams}: ask for at most num_beams "
                     "hypotheses (or raise --num_beams)")
    _check_options(parser, args)  # what an export cannot honour, before anything is read
    _check_paths(parser, args)
    check_model_flag(parser, args.model)
    check_model_flag(parser, args.tokenizer, "--tokenizer")
    try:
        sources = read_lines(args.input)  # a wrong encoding fails before the model loads
    except ValueError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    state = distributed_state()
    writes = state is None or state.is_main_process
    with contextlib.ExitStack() as output:
        handle = sys.stdout
        if args.output != "-" and writes:  # an unwritable output fails now, not after translating
            try:
                handle = output.enter_context(new_file(args.output))  # whole or not at all
            except OSError as error:
                parser.exit(1, f"{parser.prog}: error: cannot write --output {args.output}: {error.strerror}\n")
        translations, seconds = _translate(parser, args, sources, _load(parser, args))
        if not writes:
            return
        handle.write("".join(format_translation(translation, index, output_format=args.output_format,
                                                nbest=args.nbest, alignments=args.alignments)
                             for index, translation in enumerate(translations)))
        handle.flush()
    if not args.quiet:
        translated = sum(bool(translation.hypotheses) for translation in translations)
        destination = "stdout" if args.output == "-" else args.output
        print(f"{translated:,} lines translated ({len(sources) - translated:,} blank) in {seconds:.1f} s, "
              f"{translated / max(seconds, 1e-9):.1f} lines/s -> {destination}", file=sys.stderr)


def _options(args) -> dict:
    """The translator's options of the flags (decoding options not given: None, the model's own)."""
    return {"nbest": args.nbest, "scores": args.nbest > 1 or args.output_format == "jsonl",
            "alignments": args.alignments, "alignment_layer": args.alignment_layer,
            "alignment_heads": args.alignment_heads, "strict": args.strict, "fast": DECODINGS[args.decoding],
            "seed": args.seed, "do_sample": args.do_sample or None,
            **{name: getattr(args, name) for name in GENERATION_FLAGS}}


def _check_options(parser, args) -> None:
    """--model's options checked before anything is read: what an export cannot honour (a model's are checked once
    it is loaded), a folder that is neither, an export without ctranslate2."""
    try:
        check_options(args.model, **_options(args), tokenizer=args.tokenizer,
                      distributed=distributed_state() is not None)
    except OptionRefused as error:
        parser.error(str(error.spelled(FLAG_SPELLING)))
    except ValueError as error:
        parser.error(str(error))
    except ImportError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")


def _load(parser, args):
    try:
        translator = load_translator(args.model, device=args.device, dtype=args.dtype, quantize=args.quantize,
                                     tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code,
                                     force=args.force)
    except OptionRefused as error:
        parser.error(str(error.spelled(FLAG_SPELLING)))
    except (OSError, ValueError, ImportError) as error:
        parser.exit(1, f"{parser.prog}: error: cannot load --model {args.model}: {error}\n")
    device = translator.device
    if (translator.backend == "model" and device.type == "cpu" and args.dtype in CPU_DTYPE_FLAGS
            and not cpu_has_any_flag(CPU_DTYPE_FLAGS[args.dtype])):
        logger.warning(f"--dtype {args.dtype} on this CPU, which lacks {' and '.join(CPU_DTYPE_FLAGS[args.dtype])}: "
                       f"PyTorch emulates {args.dtype} arithmetic here, slower than float32; for a faster CPU "
                       "model use --quantize int8")
    return translator


def _translate(parser, args, sources, translator):
    """(translations, seconds) of `sources` through `translator`, as the flags ask."""
    batch_size, max_tokens = ((args.batch_size, args.max_tokens) if args.batch_size or args.max_tokens
                              else (AUTO_BATCH_SIZE, DEFAULT_MAX_TOKENS))
    started = time.perf_counter()
    try:
        translations = translator.translate(
            sources, **_options(args), batch_size=batch_size, max_tokens=max_tokens,
            progress=not args.quiet and (args.progress or args.input != "-"),
            desc=f"translating {Path(args.input).name if args.input != '-' else 'stdin'}")
    except OptionRefused as error:
        parser.error(str(error.spelled(FLAG_SPELLING)))
    except ValueError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    return translations, time.perf_counter() - started


if __name__ == "__main__":
    main()
