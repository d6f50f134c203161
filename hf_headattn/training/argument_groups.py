"""The training command's argument groups that import no torch: the tokenizer's flags, the data's and the run's, and
the parser that reads dataclass fields as flags. The command's parser (`arguments.argument_parser`) reads them
beside the model's and Trainer's; the start-up data preparation (`data_prefetch.read_recipe`), forked before torch
is imported, reads the command's words with the same groups and parser, so that it parses them as the run does.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from ..tokenization import SUPPORTED_MODELS
from .presets import TRAINING_PRESETS

# What a training step's summed token loss may be divided by (`HeadAttnSeq2SeqTrainer`'s loss_normalization)
LOSS_NORMALIZATIONS = ("tokens", "sentences")

# `config_flag`'s metadata keys, which are no argparse keywords (`TrainingArgumentParser` leaves them out)
CONFIG_FLAG_METADATA = ("config_field", "unset", "to_config", "constrained_attention_only", "with_guided_alignment",
                        "data_recipe")


def config_flag(default, help: str, config_field: str | tuple[str, ...] | None = None, **metadata):
    """A model flag; `config_field`: the config field(s) it sets (`config_kwargs`), which the config's
    ConfigFieldError names when it refuses the value. `metadata` also takes `choices`, `unset` (the config's value
    where the flag is None), `to_config` (flag name, value -> the config's value), `constrained_attention_only`
    and `with_guided_alignment` (the flag means something only with those; the config gets it only then), and
    `data_recipe` (the flag decides the tokenizer and the token ids: `data_prefetch.RECIPE_DEFAULTS`)."""
    if config_field is not None:
        metadata["config_field"] = (config_field,) if isinstance(config_field, str) else config_field
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class TokenizerArguments:
    """The model flags that decide the tokenizer (part of `arguments.ModelArguments`)."""

    tokenizer: str | None = config_flag(None, "an existing tokenizer folder; by default one is trained on the "
                                              "training text")
    vocab_size: int = config_flag(8000, "size of the tokenizer trained on the training text", "vocab_size",
                                  data_recipe=True)
    tokenizer_model: str = config_flag("bpe", "subword model of the trained tokenizer",
                                       choices=list(SUPPORTED_MODELS), data_recipe=True)


@dataclass
class DataArguments:
    """Where the parallel text comes from and how it is batched: two line-aligned text files a split
    (--train_source/--train_target), one TSV or JSON lines file a split (--train_file), or a Hugging Face dataset
    (--dataset). Files are UTF-8, optionally compressed (.gz, .xz); lines end at \\n, \\r\\n or \\r. Without
    validation data, the last 5% of the training pairs are held out."""

    _argument_group_name = "data"

    train_source: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "source side of the training text, one sentence a line"})
    train_target: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "target side, line-aligned with --train_source"})
    valid_source: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "source side of the validation text"})
    valid_target: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "target side of the validation text"})
    train_file: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "the training pairs in one file: TSV (.tsv, source<TAB>target a line) or JSON lines (.jsonl, .json: "
                'run_translation\'s {"translation": {"de": ..., "en": ...}} a line, keyed by --source_lang and '
                "--target_lang)"})
    validation_file: str | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "the validation pairs in one TSV or JSON lines file (as --train_file)"})
    dataset: str | None = field(default=None, metadata={"help": "Hugging Face dataset name or local dataset folder "
                                                                 "(instead of text files)"})
    dataset_config: str | None = field(default=None, metadata={"help": "the --dataset's configuration"})
    dataset_revision: str | None = field(default=None, metadata={
        "help": "the --dataset's Hub branch, tag or commit (recorded in the run manifest; None: the default branch)"})
    source_lang: str = field(default="de", metadata={
        "data_recipe": True,
        "help": "source language key of a --dataset or a JSON lines --train_file"})
    target_lang: str = field(default="en", metadata={
        "data_recipe": True,
        "help": "target language key of a --dataset or a JSON lines --train_file"})
    train_split: str = field(default="train", metadata={"help": "training split of a --dataset"})
    valid_split: str = field(default="validation", metadata={"help": "validation split of a --dataset"})
    max_train_pairs: int | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "use only the first N training pairs"})
    sample_train_pairs: bool = field(default=False, metadata={
        "help": "with --max_train_pairs, train on N pairs drawn at random (without replacement, kept in corpus order) "
                "instead of the first N: another sample for every --data_seed (--seed if unset), as Goindani & "
                "Shrivastava drew their low-resource training sets"})
    max_valid_pairs: int | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "use only the first N validation pairs (what each evaluation scores: loss, and BLEU/chrF with "
                "--predict_with_generate)"})
    max_length: int = field(default=128, metadata={
        "data_recipe": True,
        "help": "longer sentences are truncated to this many tokens",
        "config_field": ("max_position_embeddings",)})  # the Transformer's, at least max_length + 2 (`build_config`)
    max_tokens: int | None = field(default=None, metadata={
        "help": "token-budget batches: length-bucketed batches of at most this many source + target tokens, padding "
                "included (at least 2 x --max_length), instead of --per_device_train_batch_size sentences"})
    bucket_pool_pairs: int | None = field(default=None, metadata={
        "help": "with --max_tokens: sort pairs by length only within pools of N pairs drawn at random every epoch "
                "(OpenNMT's pooled batches, Transformers' group_by_length), so that a pair's batch companions change "
                "from epoch to epoch, at the cost of some padding; by default pairs are sorted over the whole "
                "training set and meet the same companions every epoch"})
    preprocessing_num_workers: int | None = field(default=None, metadata={
        "data_recipe": True,
        "help": "processes for tokenisation"})
    streaming: bool = field(default=False, metadata={
        "help": "read the training split of --dataset as a stream (nothing downloaded or cached whole; tokenised on "
                "the fly); needs --max_steps and --tokenizer. Validation pairs (--max_valid_pairs, 1,000 by default) "
                "are read into memory"})


@dataclass
class RunArguments:
    """Checkpoints, resuming and stopping. Checkpoints go to --output_dir/checkpoint-N (--save_steps,
    --save_total_limit); a run started on an --output_dir that holds checkpoints resumes from the last complete
    one; the finished model, tokenizer and code land in --output_dir itself."""

    _argument_group_name = "run"

    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "start over in an --output_dir that holds checkpoints or a trained model instead of resuming: its "
                "checkpoints are deleted once the new run has read its data and trained its tokenizer, its model is "
                "replaced when the new one is saved"})
    reset_optimizer: bool = field(default=False, metadata={
        "help": "resume from a checkpoint with a fresh optimizer and learning-rate schedule (warmup again): needed "
                "for a checkpoint without optimizer.pt and scheduler.pt (saved with --save_only_model); otherwise "
                "resuming restores them"})
    keep_checkpoints: bool = field(default=False, metadata={
        "help": "keep the checkpoint-N folders once training has finished (by default they are deleted: the "
                "finished model is in --output_dir)"})
    preset: str | None = field(default=None, metadata={
        "choices": list(TRAINING_PRESETS),
        "help": "a named recipe that sets the defaults of other flags (flags given beside it win); "
                + "; ".join(f"{name}: " + ", ".join(f"--{key} {value}" for key, value in preset.items())
                            for name, preset in TRAINING_PRESETS.items())})
    lr_decay: str | None = field(default=None, metadata={
        "choices": [None, "opennmt"],
        "help": "opennmt: OpenNMT-py's (2017) decay instead of --lr_scheduler_type: after each epoch's validation, "
                "multiply the learning rate by --lr_decay_factor once the epoch reaches --lr_decay_start_at or the "
                "validation loss rose, and after every later epoch (needs --eval_strategy epoch)"})
    lr_decay_factor: float = field(default=0.5, metadata={"help": "with --lr_decay opennmt (OpenNMT's "
                                                                  "-learning_rate_decay)"})
    lr_decay_start_at: int = field(default=8, metadata={
        "help": "with --lr_decay opennmt, the epoch after whose validation decay starts at the latest (OpenNMT's "
                "-start_decay_at: 8 halves the rate from epoch 9 on)"})
    loss_normalization: str = field(default="tokens", metadata={
        "choices": list(LOSS_NORMALIZATIONS),
        "help": "what an optimizer step's summed token loss is divided by before the backward pass: its target tokens "
                "(Transformers' default), or its sentences (OpenNMT-py 2017's, which Malaviya et al. trained with: "
                "gradients, and so what --max_grad_norm clips and SGD steps by, grow by the mean target length); "
                "the logged loss is per token either way"})
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "stop after this many evaluations without improvement of --metric_for_best_model (needs "
                "--load_best_model_at_end)"})
    verbose: bool = field(default=False, metadata={
        "help": "also show the libraries' progress bars (datasets' loading, Transformers' weight writing) and "
                "INFO logs; by default the command shows its own bars (tokenising, training, evaluating), the "
                "training logs and its result line"})
    quiet: bool = field(default=False, metadata={
        "aliases": ["-q"], "help": "no progress, no training logs, no result line: warnings and errors only (as "
                                   "--quiet in the other commands)"})


class TrainingArgumentParser(HfArgumentParser):
    """`HfArgumentParser`, which hands a field's metadata to argparse, less the keys `config_flag` adds."""

    @staticmethod
    def _parse_dataclass_field(parser, field):
        argparse_field = copy.copy(field)
        argparse_field.metadata = types.MappingProxyType(
            {key: value for key, value in field.metadata.items() if key not in CONFIG_FLAG_METADATA})
        HfArgumentParser._parse_dataclass_field(parser, argparse_field)
