"""What the training command's data is made from (its recipe): the flags that decide the tokenizer and the token
ids, read from the command line's words as the command's parser reads them (`read_recipe`, for the data preparation
forked at start-up, `data_prefetch`) or taken from the command's parsed arguments (`data_recipe`), which the command
compares before it takes the prepared data.

Imports no torch (the forked process reads the words before the command imports it), but Transformers'
HfArgumentParser: imported by the forked process, not before the fork.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .argument_groups import DataArguments, RunArguments, TokenizerArguments, TrainingArgumentParser
from .command_words import HELP_WORDS, arguments_file, load_arguments_file, preset_named_in, under_preset
from .presets import preset_defaults


@dataclass
class TrainerFlagsRead:
    """The two of Trainer's flags the preparation reads (the command's parser has them from
    `Seq2SeqTrainingArguments`, which imports torch)."""

    output_dir: str | None = None
    resume_from_checkpoint: str | None = None


# The argument groups the preparation reads the command's words with: the command's own, but the model's (whose
# variants' names import torch) and Trainer's
RECIPE_GROUPS = (TokenizerArguments, DataArguments, RunArguments, TrainerFlagsRead)
# The flags that decide the tokenizer and the token ids (marked data_recipe), with their defaults
RECIPE_DEFAULTS: dict[str, Any] = {spec.name: spec.default for group in (DataArguments, TokenizerArguments)
                                   for spec in dataclasses.fields(group) if spec.metadata.get("data_recipe")}
PATH_FLAGS = ("train_source", "train_target", "valid_source", "valid_target", "train_file", "validation_file")
# Flags under which the data cannot be foreseen from the words alone, or is not prepared from files at the start
UNFORESEEN_FLAGS = ("dataset", "tokenizer", "sample_train_pairs", "resume_from_checkpoint", "streaming")


def data_recipe(values: Mapping[str, Any], file_sha256: Mapping[str, str]) -> dict:
    """What the prepared data is made from: the recipe flags' values in `values` (the command's parsed
    ModelArguments and DataArguments, or `read_recipe`'s), files as absolute paths, and `file_sha256`
    (`data.scan_data_files`' hashes by flag)."""
    recipe = _recipe_flags(values)
    for name in PATH_FLAGS:
        if recipe[name] is not None:
            recipe[name] = str(Path(recipe[name]).resolve())
    return {**recipe, "file_sha256": dict(sorted(file_sha256.items()))}


def read_recipe(argv: list[str]) -> tuple[dict, bool] | None:
    """The recipe flags' values the command line's words (or its one JSON/YAML arguments file) give, a --preset's
    under them, read as the command's parser reads them (`RECIPE_GROUPS`, which import no torch), and whether
    --verbose is given; None where the data cannot be foreseen: `UNFORESEEN_FLAGS`, --help or --version, words this
    reading does not understand, or an --output_dir whose checkpoints the run would resume."""
    if any(word in HELP_WORDS for word in argv):
        return None
    parser = _RecipeParser(RECIPE_GROUPS)
    try:
        if (path := arguments_file(argv)) is not None:
            parsed = parser.parse_dict(under_preset(load_arguments_file(path)), allow_extra_keys=True)
        else:
            parser.set_defaults(**preset_defaults(preset_named_in(argv)))
            *parsed, _others = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True,
                                                                  look_for_args_file=False)
    except (Exception, SystemExit):  # whatever it is, the command's own parser says what is wrong
        return None
    values = {name: value for group in parsed for name, value in vars(group).items()}
    if any(values.get(name) not in (None, False) for name in UNFORESEEN_FLAGS):
        return None
    recipe = _recipe_flags(values)
    if recipe["train_source"] is None and recipe["train_file"] is None:
        return None
    output_dir = values.get("output_dir")
    if output_dir and not values.get("overwrite_output_dir") and any(Path(output_dir).glob("checkpoint-*")):
        return None  # resumed: the checkpoint's tokenizer is used
    return recipe, bool(values.get("verbose"))


class _RecipeParser(TrainingArgumentParser):
    """The command's parser of `RECIPE_GROUPS`, which raises (to `read_recipe`) instead of printing the usage."""

    def error(self, message):
        raise ValueError(message)


def _recipe_flags(values: Mapping[str, Any]) -> dict:
    return {name: values.get(name, default) for name, default in RECIPE_DEFAULTS.items()}
