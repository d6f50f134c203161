"""`hf-headattn-export` (also `python -m hf_headattn.commands.export`): export a model folder or Hub id for
deployment, as a CTranslate2 model (:func:`hf_headattn.export.export_ctranslate2`).

    hf-headattn-export --format ctranslate2 --model runs/de-en --output_dir runs/de-en-ct2 [--quantization int8]
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..cli import (HelpFormatter, UnderscoreArgumentParser, add_verbose_and_version_arguments, check_model_flag,
                   configure_logging, skip_exit_collections)
from ..export import CTRANSLATE2_QUANTIZATIONS, EXPORT_COMMAND, FORMATS, export_ctranslate2, import_ctranslate2
from ..output_files import check_output_folder

EXAMPLES = """examples:
  # a float32 CTranslate2 model, and an int8 one
  hf-headattn-export --format ctranslate2 --model runs/de-en --output_dir runs/de-en-ct2
  hf-headattn-export --format ctranslate2 --model runs/de-en --output_dir runs/de-en-ct2-int8 --quantization int8
  # then translate or evaluate with it as with the model (through CTranslate2), or in Python:
  hf-headattn-translate --model runs/de-en-ct2 --input test.de --output test.en --num_beams 5
  #   from hf_headattn.export import translate_with_ctranslate2
  #   translate_with_ctranslate2("runs/de-en-ct2", ["Ein Mann fährt Fahrrad."], beam_size=5)

what exports: softmax Transformer models with Marian's settings (those HeadAttnForConditionalGeneration.to_marian
accepts); other variants and the LSTM family are refused (translate them with hf-headattn-translate, whose fast path
and --quantize int8 run every variant).
"""


def make_parser():
    from ..loading import add_trust_remote_code_argument

    parser = UnderscoreArgumentParser(
        prog="hf-headattn-export", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Export a model folder (or Hub id) for deployment: CTranslate2, through to_marian and "
                    "CTranslate2's own converter. Needs ctranslate2 (the deploy extra: pip install \"ctranslate2>=4.5\").")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to export to")
    parser.add_argument("--model", required=True, help="a saved model folder, or a Hugging Face Hub id")
    add_trust_remote_code_argument(parser, "--trust_remote_code")
    parser.add_argument("--output_dir", required=True, help="the folder to write (refused if it exists)")
    parser.add_argument("--quantization", default="float32", choices=CTRANSLATE2_QUANTIZATIONS,
                        help="CTranslate2's weight type")
    parser.add_argument("--overwrite", action="store_true", help="replace --output_dir if it exists and this command wrote it")
    add_verbose_and_version_arguments(parser)
    return parser


def main(argv=None) -> None:
    """The `hf-headattn-export` command."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    skip_exit_collections()
    check_model_flag(parser, args.model)
    output_dir = Path(args.output_dir)
    try:  # before the model loads
        check_output_folder(output_dir, command=EXPORT_COMMAND, overwrite=args.overwrite,
                            inputs=[args.model] if Path(args.model).exists() else [])
    except ValueError as error:
        parser.error(str(error))
    try:
        import_ctranslate2()
    except ImportError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    from ..loading import load_model_and_tokenizer

    try:
        model, tokenizer = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: cannot load --model {args.model}: {error}\n")
    try:
        written = export_ctranslate2(model, tokenizer, output_dir, quantization=args.quantization,
                                     overwrite=args.overwrite, source=args.model)
    except ValueError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(f"CTranslate2 model ({args.quantization}) written: {written}", file=sys.stderr)


if __name__ == "__main__":
    main()
