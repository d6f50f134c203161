"""The training command, in the shape of Transformers' `examples/pytorch/translation/run_translation.py`:
`HfArgumentParser` over this package's model, data and run arguments and `Seq2SeqTrainingArguments`, so every
Trainer flag works under Transformers' own name. Also the helpers around it: parallel data loading, tokenisation,
BLEU/chrF and fertility preparation. The Trainer it runs is `trainer.HeadAttnSeq2SeqTrainer`.

    hf-headattn-train --help            # or: python -m hf_headattn.training --help

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml
from transformers import HfArgumentParser, Seq2SeqTrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .cli import HelpFormatter
from .runtime.attention_registry import ATTENTION_VARIANTS
from .runtime.configuration_headattn import HeadAttnConfig
from .runtime.configuration_headattn_rnn import ATTENTION_SCORES, ATTENTION_TRANSFORMS, SINKS, HeadAttnRNNConfig
from .runtime.fertility import FERTILITY_STRATEGIES
from .parallel_data import PAIR_FILE_FORMATS, PairFiles, format_suffix, read_pairs
from .parallel_data import read_parallel_files  # noqa: F401  (the examples and benchmarks read through training)
from .run_folder import TOKENIZER_SCRATCH, RunLock, RunRefused, carry_over, clean_leftovers, replace_folder, sibling
from .run_manifest import build_manifest, check_resume
from .tokenization import SUPPORTED_MODELS, load_tokenizer, tokenizer_fingerprint, train_tokenizer

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, IterableDataset

# `hf-headattn-train --help` imports only what the parser shows (Trainer's arguments, the variant registry, the
# configs); Trainer, `datasets`, sacrebleu and the models are imported where they are used.


logger = logging.getLogger(__name__)


MULTI30K_FILES = ("train.de", "train.en", "val.de", "val.en", "test_2016_flickr.de", "test_2016_flickr.en")


def multi30k_paths(data_dir: str | Path) -> dict[str, Path]:
    """The Multi30k De-En files (see ../shared/data/multi30k/README) by name, checked to exist."""
    data_dir = Path(data_dir)
    missing = [name for name in MULTI30K_FILES if not (data_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{data_dir} lacks {', '.join(missing)}; point --data-dir at the Multi30k folder "
                                f"(it holds {', '.join(MULTI30K_FILES)})")
    return {name: data_dir / name for name in MULTI30K_FILES}


def load_hub_translation_dataset(
    name: str,
    config_name: str | None,
    source_lang: str,
    target_lang: str,
    split: str,
    max_pairs: int | None = None,
    streaming: bool = False,
    revision: str | None = None,
) -> Dataset | IterableDataset:
    """A Hugging Face dataset (Hub name or local folder; `revision`: a Hub branch, tag or commit) whose rows hold a
    `translation` dict keyed by language, or one column per language, -> Dataset with `source` and `target` columns
    (an IterableDataset read as a stream with `streaming`)."""
    from datasets import load_dataset

    dataset = load_dataset(name, config_name, split=split, streaming=streaming, revision=revision)
    if max_pairs is not None:
        dataset = dataset.take(max_pairs) if streaming else dataset.select(range(min(max_pairs, len(dataset))))
    first = next(iter(dataset))
    columns = list(first)  # a stream may not know its columns before it is read
    if "translation" in columns:
        languages = set(first["translation"])
        if not {source_lang, target_lang} <= languages:
            raise ValueError(
                f"Dataset {name!r} has languages {sorted(languages)}; asked for {source_lang!r} -> {target_lang!r}"
            )
        return dataset.map(
            lambda row: {"source": row["translation"][source_lang], "target": row["translation"][target_lang]},
            remove_columns=columns,
        )
    missing = [lang for lang in (source_lang, target_lang) if lang not in columns]
    if missing:
        raise ValueError(f"Dataset {name!r} has neither a 'translation' column nor columns {missing}; "
                         f"columns: {columns}")
    return dataset.map(lambda row: {"source": row[source_lang], "target": row[target_lang]}, remove_columns=columns)


def tokenize_parallel(dataset: DatasetDict | Dataset | IterableDataset, tokenizer, max_length: int = 128,
                      num_proc: int | None = None, split: str = "training"):
    """Add `input_ids`, `attention_mask` and `labels` (a batched `datasets.map`, cached on disk; on the fly for a
    stream). Pairs longer than `max_length` tokens on either side are truncated, with a warning that counts them
    (for a stream, a warning at the first one); `split` names the data in it (a DatasetDict's own keys win)."""
    from datasets import DatasetDict, IterableDataset

    def encode(batch):
        # Tokenised whole once, so the long pairs can be counted; only those are tokenised again, truncated.
        encoded = tokenizer(batch["source"], text_target=batch["target"], verbose=False)
        encoded["truncated"] = [len(source) > max_length or len(target) > max_length
                                for source, target in zip(encoded["input_ids"], encoded["labels"])]
        if long_rows := [row for row, truncated in enumerate(encoded["truncated"]) if truncated]:
            shortened = tokenizer([batch["source"][row] for row in long_rows],
                                  text_target=[batch["target"][row] for row in long_rows],
                                  max_length=max_length, truncation=True)
            for key, values in shortened.items():
                for row, value in zip(long_rows, values):
                    encoded[key][row] = value
        return encoded

    if isinstance(dataset, IterableDataset):
        warned = False

        def encode_and_warn(batch):
            nonlocal warned
            encoded = encode(batch)
            if any(encoded.pop("truncated")) and not warned:
                warned = True
                logger.warning(f"a {split} pair is longer than --max_length {max_length} tokens and is truncated "
                               "(a stream is not counted ahead); raise --max_length to keep such pairs whole")
            return encoded

        return dataset.map(encode_and_warn, batched=True, remove_columns=["source", "target"])
    encoded = dataset.map(encode, batched=True, num_proc=num_proc, remove_columns=["source", "target"],
                          desc="tokenising")
    for name, part in encoded.items() if isinstance(encoded, DatasetDict) else [(split, encoded)]:
        if truncated := sum(part["truncated"]):
            logger.warning(f"{truncated} of {len(part)} {name} pairs are longer than --max_length {max_length} "
                           "tokens on one side and are truncated; raise --max_length to keep them whole")
    return encoded.remove_columns("truncated")


def prepare_fertility(model, tokenizer, sources: list[str], targets: list[str], predictor_epochs: int = 5,
                      seed: int = 0) -> None:
    """Fill in what the GUIDED and PREDICTED fertility strategies (Malaviya et al., 2018, Sec. 4) learn from the
    training data: eflomal alignments of its subword tokens give each source token's fertility; GUIDED keeps
    the largest per token id in the encoder's `source_fertility.guided_fertility` table, PREDICTED trains the
    encoder's bi-LSTM `source_fertility.fertility_predictor` on them (+1 slack). Works for both model families;
    nothing to do for CONSTANT or models without constrained attention."""
    from .alignment import corpus_token_fertilities, guided_fertility_table, train_fertility_predictor

    config, bounds = model.config, model.get_encoder().source_fertility
    if bounds is None or config.fertility == "constant":
        return
    source_ids, fertilities = corpus_token_fertilities(
        tokenizer, list(sources), list(targets), seed=seed,
        progress=f"fertility: aligning {len(sources):,} training pairs (eflomal)")
    if config.fertility == "guided":
        with torch.no_grad():
            bounds.guided_fertility.copy_(guided_fertility_table(source_ids, fertilities, config.vocab_size))
    else:
        train_fertility_predictor(bounds.fertility_predictor, source_ids, fertilities, epochs=predictor_epochs,
                                  seed=seed)



# ------------------------------------------------------------------------------------------------ the command

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
  torchrun --nproc_per_node 2 -m hf_headattn.training ... --output_dir runs/ddp
"""

VARIANTS = ", ".join(sorted(ATTENTION_VARIANTS))

# Trainer's defaults are for fine-tuning; these fit training an NMT model from scratch. Flags and args files
# override them.
NMT_TRAINING_DEFAULTS = dict(
    num_train_epochs=10,
    per_device_train_batch_size=64,
    per_device_eval_batch_size=64,
    learning_rate=5e-4,
    lr_scheduler_type="inverse_sqrt",
    warmup_steps=200,
    logging_steps=50,
    eval_strategy="steps",
    eval_steps=500,
    save_strategy="steps",
    save_steps=500,
    save_total_limit=2,
    dataloader_pin_memory=torch.cuda.is_available(),  # pinning without an accelerator only warns
    use_cpu=not torch.cuda.is_available(),  # so that --bf16 trains on a CPU-only machine too
)

# --preset NAME: a named recipe, applied on top of NMT_TRAINING_DEFAULTS; flags (or an args file's entries) given
# beside it override it.
TRAINING_PRESETS = {
    # The recipe of the project's quality anchor: Transformers' MarianMTModel of the command's default shape
    # (d_model 256, 3 + 3 layers, 4 heads, FFN 1024, shared and tied embeddings, joint BPE of 8,000) reached
    # greedy BLEU 36.4 on Multi30k test_2016_flickr after 2,090 optimizer steps of batches of ~2,000 target
    # tokens. --max_tokens counts source + target tokens with padding: 4,500 gives 2,090 real target tokens a
    # batch on Multi30k De-En (212 batches an epoch). These batches sort the whole training set by length; adding
    # --bucket_pool_pairs 6850 --max_tokens 4900 (pooled buckets, as many real tokens a batch) reaches the anchor's
    # BLEU (RESULTS.md), but the preset stays as every recorded run used it.
    "multi30k-anchor": dict(
        vocab_size=8000,
        tokenizer_model="bpe",
        dropout=0.1,
        label_smoothing=0.1,
        max_tokens=4500,
        max_steps=2090,
        learning_rate=5e-4,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=1000,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=50,
        eval_steps=500,
        save_steps=250,
    ),
    # Malaviya et al. (2018), footnote 4 and their running scripts: OpenNMT-py's 2017 defaults with a 2-layer
    # bidirectional LSTM encoder (250 units a direction), a 2-layer decoder of 500 with input feeding, Luong's
    # general attention, embeddings of 500, dropout 0.3, uniform initialisation +-0.1, SGD at 1.0 halved from epoch
    # 9 or once validation perplexity rises, gradient norm 5, 64 sentences a batch, 13 epochs, no label smoothing,
    # and the <SINK> token appended to every source sentence (whatever the transform). Their joint BPE had 32,000
    # merges on 150k-560k pairs; the vocabulary stays the user's choice (--vocab_size).
    "malaviya2018": dict(
        architecture="rnn",
        layers=2,
        embedding_size=500,
        hidden_size=500,
        dropout=0.3,
        label_smoothing=0.0,
        attention_score="general",
        sink="token",
        sink_every_transform=True,
        optim="sgd",
        learning_rate=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        lr_decay="opennmt",
        lr_decay_factor=0.5,
        lr_decay_start_at=8,
        max_grad_norm=5.0,
        per_device_train_batch_size=64,
        num_train_epochs=13,
        max_steps=-1,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_steps=50,
    ),
}


@dataclass
class ModelArguments:
    """The model the command builds (and the tokenizer it trains); flags marked (Transformer) or (LSTM) apply to
    that --architecture only."""

    _argument_group_name = "model"

    architecture: str = field(default="transformer", metadata={
        "choices": ["transformer", "rnn"],
        "help": "Marian-style Transformer (HeadAttnConfig) or attentional LSTM (HeadAttnRNNConfig)"})
    tokenizer: str | None = field(default=None, metadata={
        "help": "an existing tokenizer folder; by default one is trained on the training text"})
    vocab_size: int = field(default=8000, metadata={"help": "size of the tokenizer trained on the training text"})
    tokenizer_model: str = field(default="bpe", metadata={"choices": list(SUPPORTED_MODELS),
                                                          "help": "subword model of the trained tokenizer"})
    layers: int | None = field(default=None, metadata={
        "help": "encoder and decoder layers (None: 3 for the Transformer, 1 for the LSTM)"})
    heads: int | None = field(default=None, metadata={
        "help": "attention heads (None: 4 for the Transformer, 1 for the LSTM)"})
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    label_smoothing: float = field(default=0.1, metadata={
        "help": "computed in the model's own loss (Trainer's --label_smoothing_factor would drop the auxiliary loss)"})
    fertility: str = field(default="constant", metadata={
        "choices": list(FERTILITY_STRATEGIES),
        "help": "fertility bounds of csoftmax/csparsemax attention; guided and predicted align the training data "
                "with eflomal first, predicted then trains a bi-LSTM tagger for --fertility_predictor_epochs"})
    constant_fertility: float = field(default=2.0, metadata={"help": "every source token's fertility with "
                                                                     "--fertility constant"})
    fertility_predictor_epochs: int = field(default=5, metadata={"help": "training epochs of the --fertility "
                                                                       "predicted tagger"})
    d_model: int = field(default=256, metadata={"help": "(Transformer)"})
    ffn_dim: int = field(default=1024, metadata={"help": "(Transformer)"})
    position_embedding: str = field(default="sinusoidal", metadata={
        "choices": ["sinusoidal", "none"], "help": "(Transformer)"})
    activation_function: str = field(default="swish", metadata={
        "help": "(Transformer) of the feed-forward layers: swish as in the OPUS-MT Marian models, or any "
                "transformers.activations name (MarianConfig's default is gelu)"})
    scale_embedding: bool = field(default=True, metadata={
        "help": "(Transformer) multiply token embeddings by sqrt(d_model), as the OPUS-MT Marian models do "
                "(MarianConfig's default is false)"})
    encoder_self_attention: str = field(default="softmax", metadata={
        "help": f"(Transformer) variant name or JSON spec, e.g. '{{\"type\": \"mma\", \"window\": 1}}'; variants: "
                f"{VARIANTS}"})
    decoder_self_attention: str = field(default="softmax", metadata={
        "help": f"(Transformer) variant name or JSON spec; variants: {VARIANTS}"})
    cross_attention: str = field(default="softmax", metadata={
        "help": f"(Transformer) variant name or JSON spec, e.g. '{{\"type\": \"dhicm\", \"layers\": [-1]}}'; "
                f"variants: {VARIANTS}"})
    embedding_size: int = field(default=256, metadata={"help": "(LSTM)"})
    hidden_size: int = field(default=512, metadata={"help": "(LSTM) decoder state and context size d"})
    hops: int = field(default=1, metadata={"help": "(LSTM) K, counting the first hop (Iida et al.)"})
    hop_mode: str = field(default="dependent", metadata={"choices": ["dependent", "independent"],
                                                         "help": "(LSTM)"})
    attention_score: str = field(default="general", metadata={"choices": list(ATTENTION_SCORES), "help": "(LSTM)"})
    attention_transform: str = field(default="softmax", metadata={"choices": list(ATTENTION_TRANSFORMS),
                                                                  "help": "(LSTM)"})
    coverage_vector: bool = field(default=False, metadata={
        "help": "(LSTM) Tu et al.'s coverage vector (Malaviya et al.)"})
    sink: str = field(default="token", metadata={"choices": list(SINKS), "help": (
        "(LSTM) where constrained attention puts what no source token can take: a <SINK> token appended to every "
        "source sentence and read by the encoder (Malaviya et al.), a learned vector, or none")})
    sink_every_transform: bool = field(default=False, metadata={
        "help": "(LSTM) with --sink token, append it for softmax and sparsemax too (as Malaviya et al.'s scripts do)"})


TRANSFORMER_FLAGS = ("d_model", "ffn_dim", "position_embedding", "activation_function", "scale_embedding",
                     "encoder_self_attention", "decoder_self_attention", "cross_attention")
RNN_FLAGS = ("embedding_size", "hidden_size", "hops", "hop_mode", "attention_score", "attention_transform",
             "coverage_vector", "sink", "sink_every_transform")
FERTILITY_FLAGS = ("fertility", "constant_fertility", "fertility_predictor_epochs")

# config field -> the flag that sets it, to name the flag in the config's own error messages
CONFIG_FIELD_FLAGS = {
    "vocab_size": "vocab_size", "d_model": "d_model", "encoder_layers": "layers", "decoder_layers": "layers",
    "encoder_attention_heads": "heads", "decoder_attention_heads": "heads", "num_heads": "heads",
    "encoder_ffn_dim": "ffn_dim", "decoder_ffn_dim": "ffn_dim", "max_position_embeddings": "max_length",
    "position_embedding": "position_embedding", "activation_function": "activation_function",
    "scale_embedding": "scale_embedding", "encoder_self_attention": "encoder_self_attention",
    "decoder_self_attention": "decoder_self_attention", "cross_attention": "cross_attention",
    "dropout": "dropout", "label_smoothing": "label_smoothing", "fertility": "fertility",
    "constant_fertility": "constant_fertility", "embedding_size": "embedding_size", "hidden_size": "hidden_size",
    "num_hops": "hops", "hop_mode": "hop_mode", "attention_score": "attention_score",
    "attention_transform": "attention_transform",
}


@dataclass
class DataArguments:
    """Where the parallel text comes from and how it is batched: two line-aligned text files a split
    (--train_source/--train_target), one TSV or JSON lines file a split (--train_file), or a Hugging Face dataset
    (--dataset). Files are UTF-8, optionally compressed (.gz, .xz); lines end at \\n, \\r\\n or \\r. Without
    validation data, the last 5% of the training pairs are held out."""

    _argument_group_name = "data"

    train_source: str | None = field(default=None, metadata={"help": "source side of the training text, one "
                                                                      "sentence a line"})
    train_target: str | None = field(default=None, metadata={"help": "target side, line-aligned with "
                                                                      "--train_source"})
    valid_source: str | None = field(default=None, metadata={"help": "source side of the validation text"})
    valid_target: str | None = field(default=None, metadata={"help": "target side of the validation text"})
    train_file: str | None = field(default=None, metadata={
        "help": "the training pairs in one file: TSV (.tsv, source<TAB>target a line) or JSON lines (.jsonl, .json: "
                'run_translation\'s {"translation": {"de": ..., "en": ...}} a line, keyed by --source_lang and '
                "--target_lang)"})
    validation_file: str | None = field(default=None, metadata={"help": "the validation pairs in one TSV or JSON "
                                                                         "lines file (as --train_file)"})
    dataset: str | None = field(default=None, metadata={"help": "Hugging Face dataset name or local dataset folder "
                                                                 "(instead of text files)"})
    dataset_config: str | None = field(default=None, metadata={"help": "the --dataset's configuration"})
    dataset_revision: str | None = field(default=None, metadata={
        "help": "the --dataset's Hub branch, tag or commit (recorded in the run manifest; None: the default branch)"})
    source_lang: str = field(default="de", metadata={"help": "source language key of a --dataset or a JSON lines "
                                                              "--train_file"})
    target_lang: str = field(default="en", metadata={"help": "target language key of a --dataset or a JSON lines "
                                                              "--train_file"})
    train_split: str = field(default="train", metadata={"help": "training split of a --dataset"})
    valid_split: str = field(default="validation", metadata={"help": "validation split of a --dataset"})
    max_train_pairs: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_valid_pairs: int | None = field(default=None, metadata={
        "help": "use only the first N validation pairs (what each evaluation scores: loss, and BLEU/chrF with "
                "--predict_with_generate)"})
    max_length: int = field(default=128, metadata={"help": "longer sentences are truncated to this many tokens"})
    max_tokens: int | None = field(default=None, metadata={
        "help": "token-budget batches: length-bucketed batches of at most this many source + target tokens, padding "
                "included (at least 2 x --max_length), instead of --per_device_train_batch_size sentences"})
    bucket_pool_pairs: int | None = field(default=None, metadata={
        "help": "with --max_tokens: sort pairs by length only within pools of N pairs drawn at random every epoch "
                "(OpenNMT's pooled batches, Transformers' group_by_length), so that a pair's batch companions change "
                "from epoch to epoch, at the cost of some padding; by default pairs are sorted over the whole "
                "training set and meet the same companions every epoch"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenisation"})
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
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "stop after this many evaluations without improvement of --metric_for_best_model (needs "
                "--load_best_model_at_end)"})


def make_parser() -> HfArgumentParser:
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, RunArguments, Seq2SeqTrainingArguments),
        prog="hf-headattn-train",
        usage="%(prog)s [flags below] | %(prog)s ARGUMENTS.json | %(prog)s ARGUMENTS.yaml",
        description="Train a HeadAttn translation model with Seq2SeqTrainer and save a folder that loads anywhere "
                    "through trust_remote_code (model, tokenizer, code, pipeline).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,  # shows --vocab_size, not its alias --vocab-size
    )
    parser.set_defaults(**NMT_TRAINING_DEFAULTS)
    # Trainer's flags land in argparse's default group; title it and list it after the package's own groups
    trainer_group = parser._optionals
    trainer_group.title = "Trainer (Seq2SeqTrainingArguments: every Transformers Trainer flag, NMT defaults)"
    parser._action_groups.remove(trainer_group)
    parser._action_groups.append(trainer_group)
    return parser


def parse_args(argv=None):
    """Command line (or one JSON/YAML file of arguments) -> (ModelArguments, DataArguments, RunArguments,
    Seq2SeqTrainingArguments), every flag and combination checked (`check_arguments`) before any data is read;
    a bad one exits with a usage error that names the flag, as does a checkpoint that cannot be resumed
    (`find_checkpoint`; `train` settles which one it resumes once it holds the folder's lock)."""
    parser = make_parser()
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    try:
        if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
            arguments_file = Path(argv[0])
            values = yaml.safe_load(arguments_file.read_text())  # JSON is YAML
            if not isinstance(values, dict):
                raise ValueError(f"{arguments_file} must hold a mapping of argument names to values")
            parsed = parser.parse_dict({**NMT_TRAINING_DEFAULTS, **_preset(values.get("preset")), **values})
        else:
            preset_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
            preset_parser.add_argument("--preset")
            parser.set_defaults(**_preset(preset_parser.parse_known_args(argv)[0].preset))
            parsed = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        check_arguments(*parsed)
    except (ValueError, OSError, yaml.YAMLError) as error:  # includes Trainer's own checks of its arguments
        parser.error(str(error))
    return parsed


def _preset(name: str | None) -> dict:
    if name is None:
        return {}
    if name not in TRAINING_PRESETS:
        raise ValueError(f"--preset {name!r}: choose from {', '.join(TRAINING_PRESETS)}")
    return TRAINING_PRESETS[name]


def check_arguments(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
                    training_args: Seq2SeqTrainingArguments) -> None:
    """Raise ValueError, naming the flag, for anything the command would otherwise find out late or not at all."""
    for arguments in (model_args, data_args):
        for spec in dataclasses.fields(arguments):
            choices, value = spec.metadata.get("choices"), getattr(arguments, spec.name)
            if choices and value not in choices:
                raise ValueError(f"--{spec.name} {value!r}: choose from {', '.join(map(str, choices))}")

    # data
    text_files = data_args.train_source is not None or data_args.train_target is not None
    if text_files + (data_args.train_file is not None) + (data_args.dataset is not None) != 1:
        raise ValueError("give the training data once: --train_source/--train_target (two text files), --train_file "
                         "(one TSV or JSON lines file) or --dataset")
    if text_files and (data_args.train_source is None or data_args.train_target is None):
        raise ValueError("--train_source and --train_target go together")
    if (data_args.valid_source is None) != (data_args.valid_target is None):
        raise ValueError("--valid_source and --valid_target go together")
    validation_files = data_args.valid_source is not None or data_args.validation_file is not None
    if data_args.valid_source is not None and data_args.validation_file is not None:
        raise ValueError("give the validation data once: --valid_source/--valid_target or --validation_file")
    if validation_files and data_args.dataset is not None:
        raise ValueError(f"--valid_source/--valid_target and --validation_file are for file data; a --dataset is "
                         f"validated on its --valid_split ({data_args.valid_split})")
    for name in ("train_source", "train_target", "valid_source", "valid_target", "train_file", "validation_file"):
        path = getattr(data_args, name)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"--{name} {path}: no such file")
    for name in ("train_file", "validation_file"):
        path = getattr(data_args, name)
        if path is not None and format_suffix(path) not in PAIR_FILE_FORMATS:
            raise ValueError(f"--{name} {path}: name it by its format, .tsv or .jsonl (or .json), optionally "
                             "compressed (.gz, .xz); two line-aligned text files are given as --train_source and "
                             "--train_target (--valid_source and --valid_target)")
    for name in ("max_train_pairs", "max_valid_pairs", "max_length", "max_tokens", "bucket_pool_pairs",
                 "preprocessing_num_workers"):
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be positive, got {value}")
    if data_args.streaming:
        needed = {"--dataset": data_args.dataset is not None, "--max_steps": training_args.max_steps > 0,
                  "--tokenizer": model_args.tokenizer is not None}
        refused = {"--max_tokens": data_args.max_tokens is not None,
                   "--fertility guided/predicted": model_args.fertility != "constant"}
        if not all(needed.values()) or any(refused.values()):
            raise ValueError(f"--streaming needs {', '.join(needed)} (a stream has no length and is not read twice) "
                             f"and excludes {' and '.join(refused)} (they read the whole corpus first)")
    if data_args.bucket_pool_pairs is not None and data_args.max_tokens is None:
        raise ValueError(f"--bucket_pool_pairs {data_args.bucket_pool_pairs} pools the token-budget batches of "
                         "--max_tokens; give --max_tokens too")
    if data_args.max_tokens is not None:
        if data_args.max_tokens < 2 * data_args.max_length:
            raise ValueError(f"--max_tokens {data_args.max_tokens} cannot hold a pair of --max_length "
                             f"{data_args.max_length} sentences; give at least {2 * data_args.max_length}")
        if training_args.train_sampling_strategy != "random":
            raise ValueError(f"--max_tokens builds its own length-bucketed batches; drop --train_sampling_strategy "
                             f"{training_args.train_sampling_strategy}")

    # training
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise ValueError(f"--max_steps must be positive (or -1: train for --num_train_epochs), got "
                         f"{training_args.max_steps}")
    if training_args.max_steps == -1 and not training_args.num_train_epochs > 0:
        raise ValueError(f"--num_train_epochs must be positive, got {training_args.num_train_epochs}")
    if training_args.push_to_hub:
        raise ValueError("--push_to_hub: Trainer's upload copies each checkpoint's model into --output_dir while "
                         "training, beside the previous model, and uploads the run's local records; upload the "
                         "finished folder with hf-headattn-hub card and hf-headattn-hub push (checked, only what a "
                         "user of the model needs)")
    if training_args.label_smoothing_factor:
        raise ValueError("--label_smoothing_factor makes Trainer recompute the loss from the logits and drop the "
                         "attention variants' auxiliary loss; use --label_smoothing (the model's own) instead")
    if run_args.lr_decay is not None:
        if training_args.eval_strategy != "epoch":
            raise ValueError(f"--lr_decay {run_args.lr_decay} decays after each epoch's validation: give "
                             f"--eval_strategy epoch (got {training_args.eval_strategy})")
        if not 0 < run_args.lr_decay_factor < 1:
            raise ValueError(f"--lr_decay_factor must be in (0, 1), got {run_args.lr_decay_factor}")
        if run_args.lr_decay_start_at < 1:
            raise ValueError(f"--lr_decay_start_at counts epochs from 1, got {run_args.lr_decay_start_at}")
        if training_args.metric_for_best_model not in (None, "loss", "eval_loss"):
            raise ValueError(f"--lr_decay {run_args.lr_decay} watches the validation loss; drop "
                             f"--metric_for_best_model {training_args.metric_for_best_model}")
        training_args.metric_for_best_model = "loss"  # what Trainer steps the decay with
    if run_args.early_stopping_patience is not None:
        if run_args.early_stopping_patience < 1:
            raise ValueError(f"--early_stopping_patience must be positive, got {run_args.early_stopping_patience}")
        if not training_args.load_best_model_at_end:
            raise ValueError("--early_stopping_patience needs --load_best_model_at_end (and --metric_for_best_model "
                             "to watch something other than the validation loss)")

    # model: flags of the other architecture, fertility without constrained attention, the config's own checks
    defaults = ModelArguments()
    foreign = RNN_FLAGS if model_args.architecture == "transformer" else TRANSFORMER_FLAGS
    for name in foreign:
        if getattr(model_args, name) != getattr(defaults, name):
            raise ValueError(f"--{name} applies to --architecture {'rnn' if foreign is RNN_FLAGS else 'transformer'} "
                             f"only, not to --architecture {model_args.architecture}")
    config = build_config(model_args, data_args)
    if not config.uses_fertility():
        for name in FERTILITY_FLAGS:
            if getattr(model_args, name) != getattr(defaults, name):
                where = ("--cross_attention" if model_args.architecture == "transformer"
                         else "--attention_transform")
                raise ValueError(f"--{name} applies to constrained attention only (csoftmax or csparsemax at "
                                 f"{where}); this model has none")
    if (model_args.fertility_predictor_epochs != defaults.fertility_predictor_epochs
            and model_args.fertility != "predicted"):
        raise ValueError("--fertility_predictor_epochs applies to --fertility predicted only")
    if model_args.tokenizer is not None and not Path(model_args.tokenizer).is_dir():
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", model_args.tokenizer) or model_args.tokenizer.startswith("."):
            raise ValueError(f"--tokenizer {model_args.tokenizer}: no such folder (nor a Hub repository id)")

    # the run folder
    output_dir, working_dir = Path(training_args.output_dir).resolve(), Path.cwd().resolve()
    if output_dir == working_dir or output_dir in working_dir.parents:
        raise ValueError(f"--output_dir {training_args.output_dir} is the current folder or holds it; the finished "
                         "model replaces the --output_dir whole, so give the run a folder of its own (e.g. runs/de-en)")
    find_checkpoint(run_args, training_args)  # checked here; `train` settles it under the run's lock


def find_checkpoint(run_args: RunArguments, training_args: Seq2SeqTrainingArguments) -> str | None:
    """The checkpoint this run resumes from: --resume_from_checkpoint, else the last complete checkpoint in
    --output_dir (none with --overwrite_output_dir). Refuses an --output_dir that already holds a finished model,
    --overwrite_output_dir with a checkpoint of the --output_dir it would delete, and a checkpoint without optimizer
    state unless --reset_optimizer."""
    output_dir = Path(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None:
        if not (Path(checkpoint) / "trainer_state.json").is_file():
            raise ValueError(f"--resume_from_checkpoint {checkpoint}: not a checkpoint folder (it has no "
                             "trainer_state.json)")
        if run_args.overwrite_output_dir and output_dir.resolve() in Path(checkpoint).resolve().parents:
            raise ValueError(f"--overwrite_output_dir would delete --resume_from_checkpoint {checkpoint} with the other "
                             f"checkpoints of --output_dir {output_dir}; resume without --overwrite_output_dir, or copy "
                             "the checkpoint elsewhere first")
    elif run_args.overwrite_output_dir or not output_dir.is_dir():
        return None
    else:
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None and any((output_dir / name).exists() for name in ("config.json", "train_results.json")):
            raise ValueError(f"--output_dir {output_dir} already holds a trained model and no checkpoint to resume "
                             "from; add --overwrite_output_dir to train again there, or choose another --output_dir")
    missing = [name for name in ("optimizer.pt", "scheduler.pt")
               if checkpoint is not None and not (Path(checkpoint) / name).is_file()]
    if missing and not run_args.reset_optimizer:
        raise ValueError(f"{checkpoint} has no {' or '.join(missing)} (saved with --save_only_model, or deleted): "
                         "resuming it would restart the optimizer's moments and the learning-rate schedule; add "
                         "--reset_optimizer to resume it so, or --overwrite_output_dir to start over")
    return checkpoint


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The highest-numbered checkpoint-N folder that was written to the end (Trainer writes trainer_state.json
    last, so a run killed while saving leaves a folder without it)."""
    checkpoints = sorted(checkpoint_folders(output_dir), key=lambda path: int(path.name.split("-")[-1]), reverse=True)
    for checkpoint in checkpoints:
        if (checkpoint / "trainer_state.json").is_file():
            return str(checkpoint)
        logger.warning(f"{checkpoint} is incomplete (killed while saving?); not resuming from it")
    return None


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return [path for path in output_dir.iterdir()
            if path.is_dir() and re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-\d+", path.name)]


def attention_spec(flag: str, value: str):
    """A plain variant name, or a JSON dict / list of dicts."""
    if not value.lstrip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"--{flag} {value!r} is not valid JSON: {error}") from None


def build_config(model_args: ModelArguments, data_args: DataArguments, tokenizer=None):
    """The config of the model the flags describe. Before the tokenizer exists (to check the flags), its size is
    --vocab_size and its special tokens the trained tokenizer's (<pad>=0, </s>=1)."""
    shared = dict(
        vocab_size=len(tokenizer) if tokenizer is not None else model_args.vocab_size,
        dropout=model_args.dropout,
        label_smoothing=model_args.label_smoothing,
        pad_token_id=tokenizer.pad_token_id if tokenizer is not None else 0,
        eos_token_id=tokenizer.eos_token_id if tokenizer is not None else 1,
        decoder_start_token_id=tokenizer.pad_token_id if tokenizer is not None else 0,
        fertility=model_args.fertility,
        constant_fertility=model_args.constant_fertility,
    )
    try:
        if model_args.architecture == "rnn":
            layers = model_args.layers if model_args.layers is not None else 1
            return HeadAttnRNNConfig(
                embedding_size=model_args.embedding_size,
                hidden_size=model_args.hidden_size,
                encoder_layers=layers,
                decoder_layers=layers,
                num_heads=model_args.heads if model_args.heads is not None else 1,
                num_hops=model_args.hops,
                hop_mode=model_args.hop_mode,
                attention_score=model_args.attention_score,
                attention_transform=model_args.attention_transform,
                coverage_vector=model_args.coverage_vector,
                sink=model_args.sink,
                sink_every_transform=model_args.sink_every_transform,
                **shared,
            )
        layers = model_args.layers if model_args.layers is not None else 3
        heads = model_args.heads if model_args.heads is not None else 4
        return HeadAttnConfig(
            d_model=model_args.d_model,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=model_args.ffn_dim,
            decoder_ffn_dim=model_args.ffn_dim,
            position_embedding=model_args.position_embedding,
            activation_function=model_args.activation_function,
            scale_embedding=model_args.scale_embedding,
            max_position_embeddings=max(512, data_args.max_length + 2),
            encoder_self_attention=attention_spec("encoder_self_attention", model_args.encoder_self_attention),
            decoder_self_attention=attention_spec("decoder_self_attention", model_args.decoder_self_attention),
            cross_attention=attention_spec("cross_attention", model_args.cross_attention),
            **shared,
        )
    except ValueError as error:
        message = str(error)
        if message.startswith("--"):  # attention_spec's, which names its flag already
            raise
        # the config quotes the field at fault in backticks, and names others (e.g. "divide d_model") plainly
        fields = ([name for name in CONFIG_FIELD_FLAGS if f"`{name}`" in message]
                  or [name for name in CONFIG_FIELD_FLAGS if re.search(rf"\b{name}\b", message)])
        flags = list(dict.fromkeys(f"--{CONFIG_FIELD_FLAGS[name]}" for name in fields))
        raise ValueError(f"{', '.join(flags) or 'model flags'}: {message}") from None


def build_model(config):
    """A freshly initialised model of the config's family."""
    from .runtime.modeling_headattn import HeadAttnForConditionalGeneration
    from .runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration

    if isinstance(config, HeadAttnRNNConfig):
        return HeadAttnRNNForConditionalGeneration(config)
    return HeadAttnForConditionalGeneration(config)


def check_checkpoint_config(config, checkpoint: str) -> None:
    """Refuse to resume a checkpoint of another model than the flags describe."""
    saved = type(config).from_pretrained(checkpoint).to_dict()
    ignored = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path", "auto_map",
               "custom_pipelines", "use_cache"}  # Trainer turns the cache off while training
    differences = [f"{key}: {saved.get(key)!r} there, {value!r} now" for key, value in config.to_dict().items()
                   if key not in ignored and saved.get(key) != value]
    if differences:
        raise ValueError(f"{checkpoint} holds a different model than these flags describe ({'; '.join(differences)}); "
                         "pass the flags it was trained with to resume, or --overwrite_output_dir to start over")


def data_files(data_args: DataArguments) -> dict[str, PairFiles]:
    """The files of the training and validation pairs, by split ("train", "validation"; none for a --dataset)."""
    languages = dict(source_lang=data_args.source_lang, target_lang=data_args.target_lang)
    files = {}
    for split, one_file, source, target in (
            ("train", data_args.train_file, data_args.train_source, data_args.train_target),
            ("validation", data_args.validation_file, data_args.valid_source, data_args.valid_target)):
        if one_file is not None:
            files[split] = PairFiles(file=Path(one_file), **languages)
        elif source is not None:
            files[split] = PairFiles(source=Path(source), target=Path(target))
    return files


def scan_data_files(data_args: DataArguments) -> tuple[dict, dict[str, str]]:
    """Read every data file once (`PairFiles.scan`: encoding, alignment, format, content hash) before anything
    else: (the scans by split, for `load_data`; the content hashes by flag, for the run manifest)."""
    scans = {split: files.scan() for split, files in data_files(data_args).items()}
    hashes = {path.resolve(): scan.sha256 for split_scans in scans.values() for path, scan in split_scans.items()}
    by_flag = {name: hashes[Path(getattr(data_args, name)).resolve()]
               for name in ("train_source", "train_target", "valid_source", "valid_target", "train_file",
                            "validation_file") if getattr(data_args, name) is not None}
    if "validation" in scans and sorted(scan.sha256 for scan in scans["validation"].values()) == sorted(
            scan.sha256 for scan in scans["train"].values()):
        logger.warning("the validation data is the training data: its loss (and BLEU) will measure memorisation, "
                       "and --load_best_model_at_end or early stopping will pick by it")
    return scans, by_flag


def load_data(data_args: DataArguments, scans: dict) -> tuple[Dataset, Dataset, dict]:
    """Training and validation pairs (`source`, `target` columns), and the training pairs' counts for
    train_results.json: `train_pairs_read`, `train_pairs_skipped_empty` (blank on either side) and
    `train_pairs_held_out` (the last 5% held out for validation when no validation data is given). `scans` are
    `scan_data_files`'."""
    from datasets import Dataset

    if data_args.dataset is not None:
        max_valid_pairs = data_args.max_valid_pairs
        if data_args.streaming and max_valid_pairs is None:
            max_valid_pairs = 1000
        train, valid = (
            load_hub_translation_dataset(data_args.dataset, data_args.dataset_config, data_args.source_lang,
                                         data_args.target_lang, split, max_pairs, data_args.streaming,
                                         data_args.dataset_revision)
            for split, max_pairs in ((data_args.train_split, data_args.max_train_pairs),
                                     (data_args.valid_split, max_valid_pairs))
        )
        if data_args.streaming:  # evaluated again and again: read it once
            valid = Dataset.from_list(list(valid))
        counts = {"train_pairs_read": None if data_args.streaming else len(train), "train_pairs_skipped_empty": 0,
                  "train_pairs_held_out": 0}
        return train, valid, counts
    files = data_files(data_args)
    train = read_pairs(files["train"], scans["train"], data_args.max_train_pairs, skip_empty=True)
    counts = {"train_pairs_read": train.read, "train_pairs_skipped_empty": train.skipped_empty}
    if "validation" not in files:
        # hold out the last 5% (at least one pair) of the training text
        split = train.dataset.train_test_split(test_size=max(1, len(train.dataset) // 20), shuffle=False)
        return split["train"], split["test"], {**counts, "train_pairs_held_out": len(split["test"])}
    valid = read_pairs(files["validation"], scans["validation"], data_args.max_valid_pairs, skip_empty=True)
    return train.dataset, valid.dataset, {**counts, "train_pairs_held_out": 0}


def train(argv=None) -> dict:
    """Run the training command (see `--help`) and return its metrics, which also go to train_results.json.

    A run is a transaction on its --output_dir: it holds the folder's lock from start to end (`run_folder.RunLock`)
    and settles what it resumes under it; a resume must be the same run (`run_manifest`), checked before any data
    is read; an overwritten run's checkpoints are deleted only once the new run has read its data and trained its
    tokenizer; the finished model replaces the folder whole (`save_finished_model`). What must stop a run is raised
    as `run_folder.RunRefused`."""
    model_args, data_args, run_args, training_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logger.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    output_dir = Path(training_args.output_dir)
    main_process = training_args.process_index == 0
    with RunLock(output_dir) if main_process else contextlib.nullcontext():
        with training_args.main_process_first(desc="run folder"):
            if main_process:
                clean_leftovers(output_dir)
            try:  # settled under the lock: the folder may have changed since the flags were checked
                training_args.resume_from_checkpoint = find_checkpoint(run_args, training_args)
            except ValueError as error:
                raise RunRefused(str(error)) from None
        return _train(model_args, data_args, run_args, training_args)


def _train(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
           training_args: Seq2SeqTrainingArguments) -> dict:
    # after parsing: --help and a bad flag answer without these
    from transformers import DataCollatorForSeq2Seq, EarlyStoppingCallback, set_seed

    from . import auto_classes  # noqa: F401  (Auto classes know both families, as after `from hf_headattn import ...`)
    from .trainer import HeadAttnSeq2SeqTrainer, translation_metrics

    output_dir, checkpoint = Path(training_args.output_dir), training_args.resume_from_checkpoint
    main_process = training_args.process_index == 0
    if checkpoint is not None:
        logger.info(f"resuming from {checkpoint} (--overwrite_output_dir starts over)")
        if run_args.reset_optimizer:
            logger.warning(f"--reset_optimizer: resuming {checkpoint} with a fresh optimizer and learning-rate "
                           "schedule (warmup again)")
    set_seed(training_args.seed)
    try:
        scans, file_sha256 = scan_data_files(data_args)
    except (ValueError, FileNotFoundError) as error:
        raise RunRefused(str(error)) from None

    def manifest(tokenizer) -> dict:
        return build_manifest(model_args, data_args, run_args, training_args,
                              tokenizer_sha256=tokenizer_fingerprint(tokenizer), file_sha256=file_sha256)

    # a tokenizer that exists already (given, or the checkpoint's) settles the model before any data is read
    tokenizer, config = None, None
    if model_args.tokenizer is not None or checkpoint is not None:
        tokenizer = _load_tokenizer(model_args.tokenizer or checkpoint)
        config = build_config(model_args, data_args, tokenizer)
    if checkpoint is not None:  # a resume is the same run, or refused
        try:
            check_resume(checkpoint, manifest(tokenizer))
            check_checkpoint_config(config, checkpoint)
        except ValueError as error:
            raise RunRefused(str(error)) from None

    try:
        train_text, valid_text, data_counts = load_data(data_args, scans)
    except ValueError as error:  # a TSV or JSON lines line that holds no pair, named
        raise RunRefused(str(error)) from None
    if tokenizer is None:
        scratch = output_dir / TOKENIZER_SCRATCH  # where the other processes read it
        with training_args.main_process_first(desc="tokenizer"):
            if main_process:
                tokenizer = train_tokenizer(
                    texts=_texts(train_text), vocab_size=model_args.vocab_size, model=model_args.tokenizer_model,
                    save_directory=scratch if training_args.world_size > 1 else None,
                    model_max_length=data_args.max_length,
                )
            else:
                tokenizer = load_tokenizer(scratch)
        config = build_config(model_args, data_args, tokenizer)
    with training_args.main_process_first(desc="tokenization"):
        train_dataset = tokenize_parallel(train_text, tokenizer, data_args.max_length,
                                          data_args.preprocessing_num_workers)
        valid_dataset = tokenize_parallel(valid_text, tokenizer, data_args.max_length,
                                          data_args.preprocessing_num_workers, split="validation")
    if run_args.overwrite_output_dir and main_process:  # only now that this run has its data and tokenizer
        for folder in checkpoint_folders(output_dir):
            shutil.rmtree(folder)

    model = build_model(config)
    if checkpoint is None:  # a checkpoint holds what this learns
        prepare_fertility(model, tokenizer, train_text["source"], train_text["target"],
                          predictor_epochs=model_args.fertility_predictor_epochs, seed=training_args.seed)
    model.generation_config.max_length = data_args.max_length
    if training_args.ddp_find_unused_parameters is None:
        # Every parameter gets a gradient except the PREDICTED fertility tagger's (trained above, by its own loop),
        # so DDP's search for unused parameters is only needed with it; elsewhere it costs an extra traversal of
        # the graph and a warning the user can do nothing about.
        training_args.ddp_find_unused_parameters = any(
            "fertility_predictor" in name for name, _ in model.named_parameters())

    trainer = HeadAttnSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer,
        compute_metrics=translation_metrics(tokenizer) if training_args.predict_with_generate else None,
        callbacks=([EarlyStoppingCallback(run_args.early_stopping_patience)]
                   if run_args.early_stopping_patience is not None else None),
        max_tokens=data_args.max_tokens,
        bucket_pool_pairs=data_args.bucket_pool_pairs,
        run_manifest=manifest(tokenizer),
        reset_optimizer=run_args.reset_optimizer,
        lr_decay=(dict(factor=run_args.lr_decay_factor, start_decay_at=run_args.lr_decay_start_at)
                  if run_args.lr_decay == "opennmt" else None),
    )
    metrics = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
    if training_args.eval_strategy != "no":
        metrics.update(_final_evaluation(trainer))
    metrics.update(global_step=trainer.state.global_step, world_size=training_args.world_size,
                   train_pairs=None if data_args.streaming else len(train_dataset), **data_counts,
                   parameters=sum(parameter.numel() for parameter in model.parameters()))
    save_finished_model(trainer, output_dir, metrics, run_args.keep_checkpoints)
    return metrics


def save_finished_model(trainer: HeadAttnSeq2SeqTrainer, output_dir: Path, metrics: dict,
                        keep_checkpoints: bool) -> None:
    """Save the model, config, generation config, tokenizer, code, run manifest and train_results.json into a
    staging sibling of `output_dir`, carry over what else the folder holds (its checkpoints only with
    `keep_checkpoints`), and swap the staging folder in (`run_folder.replace_folder`): killed at any moment, the
    folder holds the previous complete model or this one."""
    staging = sibling(output_dir, "partial")
    trainer.save_model(str(staging))  # by every process: a sharded model gathers its weights
    if trainer.is_world_process_zero():
        (staging / "train_results.json").write_text(json.dumps(_jsonable(metrics), indent=2) + "\n")
        if carried := carry_over(output_dir, staging, keep_checkpoints):
            logger.info(f"kept from {output_dir} beside the new model: {', '.join(carried)}")
        replace_folder(output_dir, staging)
        logger.info(summary_line(metrics, output_dir))
    trainer.accelerator.wait_for_everyone()


def _load_tokenizer(name_or_path: str):
    try:
        return load_tokenizer(name_or_path)
    except OSError as error:
        raise SystemExit(f"hf-headattn-train: error: cannot load the tokenizer {name_or_path}: {error}") from None


def _texts(dataset: Dataset):
    """Every source sentence, then every target sentence, read in slices (not all at once)."""
    for column in ("source", "target"):
        for batch in dataset.iter(batch_size=10_000):
            yield from batch[column]


def _final_evaluation(trainer: HeadAttnSeq2SeqTrainer) -> dict:
    """The evaluation of the model being saved: the one training already ran at its last step (or, with
    --load_best_model_at_end, at the best step), else a new one."""
    state = trainer.state
    best = trainer.args.load_best_model_at_end and state.best_global_step
    step = state.best_global_step if best else state.global_step
    for entry in reversed(state.log_history):
        if entry.get("step") == step and "eval_loss" in entry:
            return {key: value for key, value in entry.items() if key.startswith("eval_")}
    return trainer.evaluate()


def main(argv=None) -> None:
    try:
        train(argv)
    except RunRefused as error:
        raise SystemExit(f"hf-headattn-train: error: {error}") from None
    finally:
        # Under torchrun / accelerate launch, a process group left to interpreter exit can abort a rank in gloo's
        # teardown ("terminate called without an active exception") after training succeeded.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def summary_line(metrics: dict, output_dir: Path) -> str:
    """`trained 470 steps | 3,000 pairs | 3.9 min | train_loss 1.969 | eval_loss 0.926 | written: DIR`: what the
    command says at the end (every metric is in the folder's train_results.json)."""
    parts = [f"trained {metrics['global_step']:,} steps"]
    if metrics.get("train_pairs") is not None:
        parts.append(f"{metrics['train_pairs']:,} pairs")
    if metrics.get("train_runtime_total") is not None:
        parts.append(f"{metrics['train_runtime_total'] / 60:.1f} min")
    parts += [f"{name} {metrics[name]:.4g}" for name in ("train_loss", "eval_loss", "eval_bleu")
              if isinstance(metrics.get(name), float) and math.isfinite(metrics[name])]
    return " | ".join([*parts, f"written: {output_dir}"])


def _jsonable(metrics: dict) -> dict:
    return {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in metrics.items()}


if __name__ == "__main__":
    main()
