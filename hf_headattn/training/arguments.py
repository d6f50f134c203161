"""The training command's arguments, in the shape of Transformers' `run_translation.py`: the package's model, data
and run argument groups (dataclasses whose fields are the flags, as `HfArgumentParser` reads them; the data's and
the run's in `argument_groups`) beside `Seq2SeqTrainingArguments`, so every Trainer flag works under Transformers'
own name; the command line's words (or one JSON/YAML file of arguments) parsed into them; every flag and combination
checked before any data is read; and the model config the flags describe, each model flag naming the config
field(s) it sets (`config_flag`).

`hf-headattn-train --help` imports only this (Trainer's arguments, the variant registry, the configs); Trainer,
`datasets`, sacrebleu and the models are imported where they are used.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from ..cli import model_path_problem
from ..parallel_data import PAIR_FILE_FORMATS, format_suffix
from ..runtime.attention_base import ConfigFieldError
from ..runtime.attention_registry import ATTENTION_VARIANTS
from ..runtime.configuration_headattn import HeadAttnConfig
from ..runtime.configuration_headattn_rnn import ATTENTION_SCORES, ATTENTION_TRANSFORMS, SINKS, HeadAttnRNNConfig
from ..runtime.fertility import FERTILITY_STRATEGIES
from ..runtime.guided_alignment import GUIDED_ALIGNMENT_COSTS
from .argument_groups import DataArguments, RunArguments, TokenizerArguments, TrainingArgumentParser, config_flag
from .checkpoints import find_checkpoint
from .command_words import arguments_file, load_arguments_file, preset_named_in, under_preset
from .guided_links import EFLOMAL
from .presets import preset_defaults

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

def attention_spec(flag: str, value: str):
    """A plain variant name, or a JSON dict / list of dicts."""
    if not value.lstrip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"--{flag} {value!r} is not valid JSON: {error}") from None


def guided_alignment_heads(flag: str, value: str) -> list[int]:
    """--guided_alignment_heads "0,2" -> [0, 2]."""
    try:
        return [int(head) for head in str(value).split(",")]
    except ValueError:
        raise ValueError(f"--{flag} {value!r}: give head indices separated by commas, e.g. 0 or 0,1") from None


DEFAULT_GUIDED_WEIGHT = 0.05  # Garg et al.'s lambda
LAYERS_HELP = "encoder and decoder layers (None: 3 for the Transformer, 1 for the LSTM)"
HEADS_HELP = "attention heads (None: 4 for the Transformer, 1 for the LSTM)"


@dataclass
class CommonModelArguments:
    """The model flags of both architectures."""

    architecture: str = config_flag("transformer", "Marian-style Transformer (HeadAttnConfig) or attentional LSTM "
                                    "(HeadAttnRNNConfig)", choices=["transformer", "rnn"])
    dropout: float = config_flag(0.1, "dropout probability", "dropout")
    label_smoothing: float = config_flag(0.1, "computed in the model's own loss (Trainer's --label_smoothing_factor "
                                              "would drop the auxiliary loss)", "label_smoothing")
    fertility: str = config_flag(
        "constant", "fertility bounds of csoftmax/csparsemax attention; guided and predicted align the training "
        "data with eflomal first, predicted then trains a bi-LSTM tagger for --fertility_predictor_epochs",
        "fertility", choices=list(FERTILITY_STRATEGIES), constrained_attention_only=True)
    constant_fertility: float = config_flag(2.0, "every source token's fertility with --fertility constant",
                                            "constant_fertility", constrained_attention_only=True)
    fertility_predictor_epochs: int = config_flag(5, "training epochs of the --fertility predicted tagger",
                                                  constrained_attention_only=True)
    guided_alignment: str | None = config_flag(
        None, "guided alignment (Garg et al., 2019): train the --guided_alignment_heads of the cross-attention to "
        "follow word links, 'eflomal' (aligned from the training pairs, symmetrised, cached by the corpus' "
        "fingerprint) or a Pharaoh file (i-j links of words from 0, one line per line of the training files; ipj "
        "possible links count as sure)")
    guided_alignment_weight: float | None = config_flag(
        None, "weight of the guided-alignment cost in the loss (None: 0.05, Garg et al.'s)",
        "guided_alignment_weight", unset=DEFAULT_GUIDED_WEIGHT, with_guided_alignment=True)
    guided_alignment_cost: str = config_flag(
        "ce", "; ".join(f"{name}: {meaning}" for name, meaning in GUIDED_ALIGNMENT_COSTS.items()),
        "guided_alignment_cost", choices=list(GUIDED_ALIGNMENT_COSTS), with_guided_alignment=True)
    guided_alignment_heads: str | None = config_flag(
        None, "the guided heads, comma-separated indices (None: 0, one head as Garg et al.); their mean attention "
        "is compared with the links, and --alignments reads them", "guided_alignment_heads",
        to_config=guided_alignment_heads, with_guided_alignment=True)


@dataclass
class TransformerArguments:
    """The model flags of --architecture transformer (HeadAttnConfig), marked (Transformer) in --help."""

    layers: int | None = config_flag(None, LAYERS_HELP, ("encoder_layers", "decoder_layers"), unset=3)
    heads: int | None = config_flag(None, HEADS_HELP, ("encoder_attention_heads", "decoder_attention_heads"),
                                    unset=4)
    d_model: int = config_flag(256, "(Transformer)", "d_model")
    ffn_dim: int = config_flag(1024, "(Transformer)", ("encoder_ffn_dim", "decoder_ffn_dim"))
    attention_dropout: float = config_flag(0.0, "(Transformer) dropout on the attention probabilities (as "
                                                "fairseq's attention dropout)", "attention_dropout")
    activation_dropout: float = config_flag(0.0, "(Transformer) dropout after the feed-forward activation (as "
                                                 "fairseq's activation dropout)", "activation_dropout")
    position_embedding: str = config_flag("sinusoidal", "(Transformer)", "position_embedding",
                                          choices=["sinusoidal", "none"])
    activation_function: str = config_flag(
        "swish", "(Transformer) of the feed-forward layers: swish as in the OPUS-MT Marian models, or any "
        "transformers.activations name (MarianConfig's default is gelu)", "activation_function")
    scale_embedding: bool = config_flag(
        True, "(Transformer) multiply token embeddings by sqrt(d_model), as the OPUS-MT Marian models do "
        "(MarianConfig's default is false)", "scale_embedding")
    encoder_self_attention: str = config_flag(
        "softmax", f"(Transformer) variant name or JSON spec, e.g. '{{\"type\": \"mma\", \"window\": 1}}'; "
        f"variants: {VARIANTS}", "encoder_self_attention", to_config=attention_spec)
    decoder_self_attention: str = config_flag(
        "softmax", f"(Transformer) variant name or JSON spec; variants: {VARIANTS}", "decoder_self_attention",
        to_config=attention_spec)
    cross_attention: str = config_flag(
        "softmax", f"(Transformer) variant name or JSON spec, e.g. '{{\"type\": \"dhicm\", \"layers\": [-1]}}'; "
        f"variants: {VARIANTS}", "cross_attention", to_config=attention_spec)
    guided_alignment_layer: int | None = config_flag(
        None, "(Transformer) the guided decoder layer, negative from the top (None: the penultimate, Garg et al.'s; "
        "the only one of a one-layer decoder)", "guided_alignment_layer", with_guided_alignment=True)
    guided_alignment_full_context: bool = config_flag(
        False, "(Transformer) Garg et al.'s full-context alignment: the guided heads are trained, and --alignments "
        "reads them, in a second decoder pass up to the guided layer whose self-attention is not causal (each "
        "target word sees the words after it); training pays for that pass", "guided_alignment_full_context",
        with_guided_alignment=True)


@dataclass
class RNNArguments:
    """The model flags of --architecture rnn (HeadAttnRNNConfig), marked (LSTM) in --help."""

    layers: int | None = config_flag(None, LAYERS_HELP, ("encoder_layers", "decoder_layers"), unset=1)
    heads: int | None = config_flag(None, HEADS_HELP, "num_heads", unset=1)
    embedding_size: int = config_flag(256, "(LSTM)", "embedding_size")
    hidden_size: int = config_flag(512, "(LSTM) decoder state and context size d", "hidden_size")
    hops: int = config_flag(1, "(LSTM) K, counting the first hop (Iida et al.)", "num_hops")
    hop_mode: str = config_flag("dependent", "(LSTM)", "hop_mode", choices=["dependent", "independent"])
    attention_score: str = config_flag("general", "(LSTM)", "attention_score", choices=list(ATTENTION_SCORES))
    attention_transform: str = config_flag("softmax", "(LSTM)", "attention_transform",
                                           choices=list(ATTENTION_TRANSFORMS))
    coverage_vector: bool = config_flag(False, "(LSTM) Tu et al.'s coverage vector (Malaviya et al.)",
                                        "coverage_vector")
    sink: str = config_flag(
        "token", "(LSTM) where constrained attention puts what no source token can take: a <SINK> token appended to "
        "every source sentence and read by the encoder (Malaviya et al.), a learned vector, or none", "sink",
        choices=list(SINKS))
    embedding_dropout: bool = config_flag(True, "(LSTM) apply --dropout to the embeddings (OpenNMT-py's 2017 LSTM "
                                                "does not)", "embedding_dropout")
    sink_every_transform: bool = config_flag(False, "(LSTM) with --sink token, append it for softmax and sparsemax "
                                                    "too (as Malaviya et al.'s scripts do)", "sink_every_transform")


@dataclass
class ModelArguments(RNNArguments, TransformerArguments, CommonModelArguments, TokenizerArguments):
    """The model the command builds (and the tokenizer it trains); flags marked (Transformer) or (LSTM) apply to
    that --architecture only. One argument group of the four classes' flags (--layers and --heads are both
    families', each setting its own config fields)."""

    _argument_group_name = "model"


# --architecture -> (the config class, the argument class of its own flags)
FAMILIES = {"transformer": (HeadAttnConfig, TransformerArguments), "rnn": (HeadAttnRNNConfig, RNNArguments)}


def family_flags(architecture: str) -> list[dataclasses.Field]:
    """The model flags an --architecture's config is built from: both families' and its own."""
    return [*dataclasses.fields(TokenizerArguments), *dataclasses.fields(CommonModelArguments),
            *dataclasses.fields(FAMILIES[architecture][1])]


def foreign_flags(architecture: str) -> dict[str, str]:
    """The flags of the other architectures only, which this one refuses -> the architecture they apply to."""
    own = {spec.name for spec in family_flags(architecture)}
    return {spec.name: other for other in FAMILIES if other != architecture
            for spec in dataclasses.fields(FAMILIES[other][1]) if spec.name not in own}


def flags_with(marker: str) -> list[str]:
    """The model flags whose metadata carries `marker` (e.g. constrained_attention_only)."""
    return [spec.name for spec in dataclasses.fields(ModelArguments) if spec.metadata.get(marker)]


ARGUMENT_GROUPS = (ModelArguments, DataArguments, RunArguments, Seq2SeqTrainingArguments)

# Trainer's counts that must be at least one, and what each counts: Trainer divides by them or sizes batches by them,
# and fails deep inside (a ZeroDivisionError for --gradient_accumulation_steps 0) or not at all (save_total_limit 0
# keeps every checkpoint)
TRAINER_COUNTS = {
    "per_device_train_batch_size": "pairs a device trains on per step",
    "per_device_eval_batch_size": "pairs a device validates at once",
    "gradient_accumulation_steps": "batches summed into one optimizer step",
    "eval_accumulation_steps": "validation steps gathered before moving to the CPU; omit it to gather all",
    "generation_num_beams": "beams of --predict_with_generate; 1: greedy",
    "save_total_limit": "checkpoints kept; omit it to keep every one",
}


def argument_parser(**presentation) -> HfArgumentParser:
    """`TrainingArgumentParser` over `ARGUMENT_GROUPS`, with the NMT defaults; `presentation` are argparse's own
    keywords (usage, description, epilog, formatter_class), which the command gives for its `--help`. Its errors name
    the command, also where `run.train(argv)` parses the words from Python."""
    parser = TrainingArgumentParser(ARGUMENT_GROUPS, prog="hf-headattn-train", **presentation)
    parser.set_defaults(**NMT_TRAINING_DEFAULTS)
    return parser


def parse_args(argv=None, parser: HfArgumentParser | None = None):
    """Command line (or one JSON/YAML file of arguments) -> (ModelArguments, DataArguments, RunArguments,
    Seq2SeqTrainingArguments), every flag and combination checked (`check_arguments`) before any data is read;
    a bad one exits with `parser`'s usage error that names the flag, as does a checkpoint that cannot be resumed
    (`find_checkpoint`; the run settles which one it resumes once it holds the folder's lock). `parser`:
    `argument_parser()`'s, or the command's (the same, with its `--help`)."""
    parser = parser or argument_parser()
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    try:
        if (path := arguments_file(argv)) is not None:
            values = {**NMT_TRAINING_DEFAULTS, **under_preset(read_arguments_file(path))}
            check_model_arguments(*model_and_data_arguments(values))
            parsed = parser.parse_dict(values)
        else:
            parser.set_defaults(**preset_defaults(preset_named_in(argv)))
            check_model_arguments(*model_and_data_arguments(vars(parser.parse_known_args(argv)[0])))
            parsed = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        check_arguments(*parsed)  # the rest: the model's flags are checked above, before Trainer's are built
    except (ValueError, OSError, yaml.YAMLError) as error:  # includes Trainer's own checks of its arguments
        parser.error(str(error))
    return parsed


def read_arguments_file(path: str | Path) -> dict:
    """The arguments of a JSON or YAML file (`hf-headattn-train ARGUMENTS.yaml`): argument names to values, each
    of the type its flag takes (`check_argument_types`)."""
    values = load_arguments_file(path)
    check_argument_types(values, path)
    return values


def check_argument_types(values: dict, source: str | Path) -> None:
    """Refuse, naming the flag, the value and the type it takes, a value of an arguments file that its flag's type
    does not accept: `HfArgumentParser.parse_dict` passes values on unconverted, so "sixteen" would reach Trainer as
    a batch size, and YAML reads 5e-4 (no dot) as text. Names no flag takes are left to parse_dict, which lists
    them."""
    hints = {}
    for group in ARGUMENT_GROUPS:
        hints.update(typing.get_type_hints(group))
    flags = {spec.name for group in ARGUMENT_GROUPS for spec in dataclasses.fields(group)}
    for name, value in values.items():
        if name in flags and not _fits(value, hints[name]):
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
                hint = f" (YAML reads {value} as text: write it with a dot before the exponent, e.g. 5.0e-4)"
            raise ValueError(f"{source}: {name}: {value!r} is {_kind_of(value)}, but --{name} takes "
                             f"{_describe_type(hints[name])}{hint}")


def _fits(value, expected) -> bool:
    """Whether an arguments file's `value` (what YAML/JSON can hold) is of the `expected` annotation's type."""
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in arguments)
    if origin is typing.Literal:
        return any(value is choice or (type(value) is type(choice) and value == choice) for choice in arguments)
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if expected in (list, tuple) or origin in (list, tuple):
        return isinstance(value, list) and all(_fits(item, arguments[0]) for item in value if arguments)
    if expected is dict or origin is dict:
        return isinstance(value, dict)
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        return isinstance(value, expected) or value in {member.value for member in expected}
    return True  # a class no file spells (a Path, a GenerationConfig): left to the parser and Trainer


def _kind_of(value) -> str:
    kinds = {bool: "true/false", int: "a whole number", float: "a decimal number", str: "text", list: "a list",
             dict: "a mapping", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _describe_type(expected) -> str:
    """An annotation as a user of an arguments file reads it: "a whole number or null", "text"."""
    origin, arguments = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        if str in arguments:  # an enum's values are text too
            arguments = [arm for arm in arguments if not (isinstance(arm, type) and issubclass(arm, enum.Enum))]
        return " or ".join(dict.fromkeys(_describe_type(arm) for arm in arguments))
    if origin is typing.Literal:
        return " or ".join(json.dumps(choice) for choice in arguments)
    if expected in (list, tuple) or origin in (list, tuple):
        return f"a list of {_describe_type(arguments[0])}" if arguments else "a list"
    if expected is dict or origin is dict:
        return "a mapping"
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in expected)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", type(None): "null"}
    return names.get(expected, getattr(expected, "__name__", str(expected)))


def data_seed(training_args) -> int:
    """The seed of what is drawn from the data (the batches' order, a --sample_train_pairs sample): --data_seed, else
    --seed, as Trainer seeds its own sampler."""
    return training_args.data_seed if training_args.data_seed is not None else training_args.seed


def check_arguments(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
                    training_args: Seq2SeqTrainingArguments) -> None:
    """Raise ValueError, naming the flag, for anything the command would otherwise find out late or not at all;
    the model's flags are `check_model_arguments`', which `parse_args` runs first (before Trainer's arguments)."""
    check_data_sources(data_args)
    check_data_sizes(model_args, data_args, training_args)
    check_numbers(model_args, data_args, run_args, training_args)
    check_run_options(run_args, training_args)
    if model_args.tokenizer is not None and (problem := model_path_problem(model_args.tokenizer, "--tokenizer")):
        raise ValueError(problem)
    output_dir, working_dir = Path(training_args.output_dir).resolve(), Path.cwd().resolve()
    if output_dir == working_dir or output_dir in working_dir.parents:
        raise ValueError(f"--output_dir {training_args.output_dir} is the current folder or holds it; the finished "
                         "model replaces the --output_dir whole, so give the run a folder of its own (e.g. runs/de-en)")
    find_checkpoint(run_args, training_args, warn=False)  # checked here; `train` settles it under the run's lock


def check_data_sources(data_args: DataArguments) -> None:
    """The training data given once, validation data that goes with it, files that exist and are named by their
    format."""
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


def check_data_sizes(model_args: ModelArguments, data_args: DataArguments,
                     training_args: Seq2SeqTrainingArguments) -> None:
    """Counts and lengths of the data, a sample, a stream and token-budget batches."""
    for name in ("max_train_pairs", "max_valid_pairs", "max_length", "max_tokens", "bucket_pool_pairs",
                 "preprocessing_num_workers"):
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be positive, got {value}")
    if data_args.sample_train_pairs and data_args.max_train_pairs is None:
        raise ValueError("--sample_train_pairs draws --max_train_pairs pairs at random; give --max_train_pairs too")
    if data_args.streaming:
        needed = {"--dataset": data_args.dataset is not None, "--max_steps": training_args.max_steps > 0,
                  "--tokenizer": model_args.tokenizer is not None}
        refused = {"--max_tokens": data_args.max_tokens is not None,
                   "--fertility guided/predicted": model_args.fertility != "constant",
                   "--sample_train_pairs": data_args.sample_train_pairs}
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


def check_numbers(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
                  training_args: Seq2SeqTrainingArguments) -> None:
    """No flag nan; Trainer's counts, seeds, learning rate and length of training in range."""
    for arguments in (model_args, data_args, run_args, training_args):
        for spec in dataclasses.fields(arguments):
            value = getattr(arguments, spec.name)
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"--{spec.name} is nan; give a number")
    for name, meaning in TRAINER_COUNTS.items():
        value = getattr(training_args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be a whole number >= 1 ({meaning}), got {value}")
    if training_args.dataloader_num_workers < 0:
        raise ValueError(f"--dataloader_num_workers must be a whole number >= 0 (0: load in the main process), got "
                         f"{training_args.dataloader_num_workers}")
    if training_args.save_strategy == "steps" and not training_args.save_steps > 0:
        raise ValueError(f"--save_steps must be > 0 (steps between checkpoints, or a fraction of the run below 1), "
                         f"got {training_args.save_steps}; --save_strategy no saves no checkpoints")
    for name in ("seed", "data_seed"):
        value = getattr(training_args, name)
        if value is not None and not 0 <= value <= 2**32 - 1:
            raise ValueError(f"--{name} must be a whole number in [0, {2**32 - 1}] (what numpy's seeding takes), "
                             f"got {value}")
    if not (math.isfinite(training_args.learning_rate) and training_args.learning_rate >= 0):
        raise ValueError(f"--learning_rate must be a finite number >= 0, got {training_args.learning_rate}")
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise ValueError(f"--max_steps must be positive (or -1: train for --num_train_epochs), got "
                         f"{training_args.max_steps}")
    if training_args.max_steps == -1 and not training_args.num_train_epochs > 0:
        raise ValueError(f"--num_train_epochs must be positive, got {training_args.num_train_epochs}")


def check_run_options(run_args: RunArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Trainer's options the command replaces, and the run's own: --lr_decay, --quiet/--verbose, early stopping."""
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
    if run_args.quiet and run_args.verbose:
        raise ValueError("--quiet shows nothing but warnings and errors and --verbose shows more: give one of them")
    if run_args.early_stopping_patience is not None:
        if run_args.early_stopping_patience < 1:
            raise ValueError(f"--early_stopping_patience must be positive, got {run_args.early_stopping_patience}")
        if not training_args.load_best_model_at_end:
            raise ValueError("--early_stopping_patience needs --load_best_model_at_end (and --metric_for_best_model "
                             "to watch something other than the validation loss)")


def check_model_arguments(model_args: ModelArguments, data_args: DataArguments) -> None:
    """The checks that need only the model's and the data's flags: choices, flags of the other architecture,
    fertility without constrained attention, and the config's own checks of the attention variants and their
    options (`build_config`). `parse_args` runs them before Trainer's arguments are built, whose checks import
    Transformers' whole model stack (~2.5 s on 2 cores), so that a misspelt variant is refused at once."""
    for arguments in (model_args, data_args):
        for spec in dataclasses.fields(arguments):
            choices, value = spec.metadata.get("choices"), getattr(arguments, spec.name)
            if choices and value not in choices:
                raise ValueError(f"--{spec.name} {value!r}: choose from {', '.join(map(str, choices))}")
    given = given_model_flags(model_args)
    for name, architecture in foreign_flags(model_args.architecture).items():
        if name in given:
            raise ValueError(f"--{name} applies to --architecture {architecture} only, not to --architecture "
                             f"{model_args.architecture}")
    config = build_config(model_args, data_args)
    if not config.uses_fertility():
        for name in flags_with("constrained_attention_only"):
            if name in given:
                where = ("--cross_attention" if model_args.architecture == "transformer"
                         else "--attention_transform")
                raise ValueError(f"--{name} applies to constrained attention only (csoftmax or csparsemax at "
                                 f"{where}); this model has none")
    if "fertility_predictor_epochs" in given and model_args.fertility != "predicted":
        raise ValueError("--fertility_predictor_epochs applies to --fertility predicted only")
    check_guided_alignment_arguments(model_args, data_args)


def given_model_flags(model_args: ModelArguments) -> set[str]:
    """The model flags whose value is not their default."""
    defaults = ModelArguments()
    return {spec.name for spec in dataclasses.fields(ModelArguments)
            if getattr(model_args, spec.name) != getattr(defaults, spec.name)}


def check_guided_alignment_arguments(model_args: ModelArguments, data_args: DataArguments) -> None:
    """--guided_alignment's flags: the others only with it, a Pharaoh file that exists and lines up with training
    files (not a --dataset, not a stream). The file's contents are checked once the corpus is read
    (`guided_links.read_pharaoh`), before training."""
    source = model_args.guided_alignment
    if source is None:
        given = given_model_flags(model_args)
        for name in flags_with("with_guided_alignment"):
            if name in given:
                raise ValueError(f"--{name} applies with --guided_alignment (eflomal or a Pharaoh file) only")
        return
    if data_args.streaming:
        raise ValueError("--guided_alignment reads the whole training corpus first (to check or make its links); a "
                         "--streaming run cannot")
    if source != EFLOMAL:
        if not Path(source).is_file():
            raise ValueError(f"--guided_alignment {source}: no such file; give 'eflomal' (links made from the "
                             "training pairs) or a Pharaoh file of i-j links, one line per training pair")
        if data_args.dataset is not None:
            raise ValueError(f"--guided_alignment {source}: a Pharaoh file lines up with training files' lines; a "
                             "--dataset has none: use --guided_alignment eflomal")


def model_and_data_arguments(values: dict) -> tuple[ModelArguments, DataArguments]:
    """The model's and the data's argument groups of `values` (flag names to values, as parsed), the other
    groups' flags passed over."""
    def group(cls):
        names = {spec.name for spec in dataclasses.fields(cls) if spec.init}
        return cls(**{name: value for name, value in values.items() if name in names})

    return group(ModelArguments), group(DataArguments)


def config_kwargs(model_args: ModelArguments) -> dict:
    """The config fields the model flags of `model_args`' --architecture set (their `config_field`s): a flag left
    None gives its `unset` value or the config's default, --guided_alignment's flags count only with it."""
    kwargs = {}
    for spec in family_flags(model_args.architecture):
        value = getattr(model_args, spec.name)
        if "config_field" not in spec.metadata or (spec.metadata.get("with_guided_alignment")
                                                   and model_args.guided_alignment is None):
            continue
        if value is None:
            value = spec.metadata.get("unset")
        elif "to_config" in spec.metadata:
            value = spec.metadata["to_config"](spec.name, value)
        if value is not None:
            kwargs.update(dict.fromkeys(spec.metadata["config_field"], value))
    return kwargs


def flag_of_config_field(architecture: str) -> dict[str, str]:
    """Config field -> the flag that sets it, for --architecture's config."""
    return {config_field: spec.name for spec in [*family_flags(architecture), *dataclasses.fields(DataArguments)]
            for config_field in spec.metadata.get("config_field", ())}


def build_config(model_args: ModelArguments, data_args: DataArguments, tokenizer=None):
    """The config of the model the flags describe. Before the tokenizer exists (to check the flags), its size is
    --vocab_size and its special tokens the trained tokenizer's (<pad>=0, </s>=1). The config's refusal of a field
    (ConfigFieldError) is a ValueError naming the flag that sets it."""
    config_class = FAMILIES[model_args.architecture][0]
    kwargs = config_kwargs(model_args)
    if tokenizer is not None:
        kwargs.update(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    else:
        kwargs.update(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    if config_class is HeadAttnConfig:
        kwargs["max_position_embeddings"] = max(512, data_args.max_length + 2)
    try:
        return config_class(**kwargs)
    except ConfigFieldError as error:
        flags = flag_of_config_field(model_args.architecture)
        named = list(dict.fromkeys(f"--{flags[name]}" for name in error.fields if name in flags))
        raise ValueError(f"{', '.join(named) or 'model flags'}: {error}") from None
    except ValueError as error:  # a check of Transformers' own config
        raise ValueError(f"model flags: {error}") from None
