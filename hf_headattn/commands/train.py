"""`hf-headattn-train`: train a translation model with Seq2SeqTrainer (`hf_headattn.training`).

    hf-headattn-train --help            # or: python -m hf_headattn.commands.train --help

The flags are the training library's argument groups (`training.arguments`) and Trainer's own; this module gives
them their `--help`, starts the data preparation before it imports torch (`training.data_prefetch`), runs the
training and turns a refused run into a usage error. The run ends with its result
line (`trained 100 steps | ... | written: DIR`), printed by the process that saved the model; the libraries'
progress bars are off unless --verbose.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli import HelpFormatter, add_version_argument, close_progress_bars, quiet_libraries, skip_exit_collections
from ..training.data_prefetch import DataPrefetch

if TYPE_CHECKING:
    from transformers import HfArgumentParser

EXAMPLES = """examples:
  # a small model on 2,000 Multi30k pairs (docs/training.md: its time), checkpoints every 500 steps
  hf-headattn-train --train_source ../shared/data/multi30k/train.de --train_target ../shared/data/multi30k/train.en \\
      --valid_source ../shared/data/multi30k/val.de --valid_target ../shared/data/multi30k/val.en \\
      --max_train_pairs 2000 --num_train_epochs 2 --output_dir runs/de-en
  # run it again after an interruption: it resumes from runs/de-en's last checkpoint (--overwrite_output_dir
  # starts over); token-budget batches, DHICM cross-attention, BLEU/chrF of greedy output at every evaluation
  hf-headattn-train ... --max_tokens 4000 --cross_attention dhicm --predict_with_generate --eval_steps 200
  # attention variants as JSON; the LSTM family; arguments from a JSON or YAML file
  hf-headattn-train ... --encoder_self_attention '{"type": "mma", "window": 1}' --position_embedding none
  hf-headattn-train ... --architecture rnn --heads 2 --hops 2 --attention_transform csparsemax --fertility predicted
  hf-headattn-train args.yaml
  # a Hugging Face dataset with a `translation` column; two processes
  hf-headattn-train --dataset wmt16 --dataset_config de-en --source_lang de --target_lang en --output_dir runs/wmt
  torchrun --nproc_per_node 2 -m hf_headattn.commands.train ... --output_dir runs/ddp
"""


def variants_help() -> str:
    """The registered attention variants, each with where it may sit and what it is (read when --help is built, so a
    variant registered in this process is listed)."""
    from ..runtime.attention_base import SITES
    from ..runtime.attention_registry import ATTENTION_VARIANTS

    short_sites = {site: site.replace("_attention", "").replace("_", " ") for site in SITES}
    lines = ["attention variants (--encoder_self_attention, --decoder_self_attention, --cross_attention):"]
    width = max(map(len, ATTENTION_VARIANTS))
    for name, variant in sorted(ATTENTION_VARIANTS.items()):
        sites = "every site" if set(variant.sites) == set(SITES) else ", ".join(map(short_sites.get, variant.sites))
        lines.append(f"  {name:{width}s}  {variant.description} [{sites}]")
    return "\n".join(lines) + "\n"


def make_parser() -> HfArgumentParser:
    from ..training.arguments import argument_parser

    parser = argument_parser(
        usage="%(prog)s [flags below] | %(prog)s ARGUMENTS.json | %(prog)s ARGUMENTS.yaml",
        description="Train a HeadAttn translation model with Seq2SeqTrainer and save a folder that loads anywhere "
                    "through trust_remote_code (model, tokenizer, code, pipeline).",
        epilog=variants_help() + "\n" + EXAMPLES,
        formatter_class=HelpFormatter,  # shows --vocab_size, not its alias --vocab-size
    )
    # Trainer's flags land in argparse's default group; title it and list it after the package's own groups
    trainer_group = parser._optionals
    trainer_group.title = "Trainer (Seq2SeqTrainingArguments: every Transformers Trainer flag, NMT defaults)"
    parser._action_groups.remove(trainer_group)
    parser._action_groups.append(trainer_group)
    add_version_argument(parser)
    return parser


# what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)
INTERRUPTED_STATUS = 130


def interrupted_line(output_dir: str, argv: list[str]) -> str:
    """What an interrupted run says: the checkpoint it left, and the command that resumes from it (the same one)."""
    from ..training.checkpoints import last_complete_checkpoint

    command = shlex.join(["hf-headattn-train", *argv])
    checkpoint = last_complete_checkpoint(output_dir, warn=False)
    if checkpoint is None:
        return f"hf-headattn-train: interrupted before its first checkpoint; `{command}` starts it again"
    return f"hf-headattn-train: interrupted; `{command}` resumes from {checkpoint}"


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    skip_exit_collections()
    # started before torch and Transformers' model stack are imported, so that the data preparation overlaps them
    with DataPrefetch.start(argv) as prefetch:
        import torch

        from ..training.arguments import parse_args
        from ..training.run import run_training, summary_line
        from ..training.run_folder import RunRefused

        arguments = parse_args(argv, make_parser())
        run_args, training_args = arguments[2], arguments[3]
        tqdm_disable = os.environ.get("TQDM_DISABLE")  # restored at the end: a caller's process keeps its bars
        if run_args.quiet:
            prefetch.silence()
            os.environ["TQDM_DISABLE"] = "1"  # every bar of this process, the libraries' and the package's
        else:
            prefetch.show_output()  # every flag is checked: the preparation is this run's
        quiet_libraries(run_args.verbose, datasets=True)
        try:
            metrics = run_training(*arguments, prefetch=prefetch)
            if training_args.process_index == 0 and not run_args.quiet:  # the process that saved the model
                print(summary_line(metrics, Path(training_args.output_dir)), flush=True)
        except RunRefused as error:
            raise SystemExit(f"hf-headattn-train: error: {error}") from None
        except KeyboardInterrupt:
            close_progress_bars()  # ends the interrupted bar's line, which it would otherwise draw again at exit
            if training_args.process_index == 0:
                print(interrupted_line(training_args.output_dir, argv), file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED_STATUS) from None
        finally:
            if tqdm_disable is None:
                os.environ.pop("TQDM_DISABLE", None)
            else:
                os.environ["TQDM_DISABLE"] = tqdm_disable
            # Under torchrun / accelerate launch, a process group left to interpreter exit can abort a rank in
            # gloo's teardown ("terminate called without an active exception") after training succeeded.
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
