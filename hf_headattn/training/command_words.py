"""The training command's words as both of its readers take them, before the flags' parser (which imports torch):
the run's `arguments.parse_args` and the start-up data preparation's `data_prefetch.read_recipe`. One JSON/YAML file
of arguments instead of flags, and a --preset whose values sit under the flags given beside it, are read here once
for both, so that the preparation foresees the run's values the way the run reads them.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .presets import preset_defaults

HELP_WORDS = ("-h", "--help", "--version")  # the command prints and exits: no data to prepare

ARGUMENTS_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def arguments_file(argv: list[str]) -> Path | None:
    """The arguments file of `hf-headattn-train ARGUMENTS.yaml` (its one word), else None."""
    if len(argv) == 1 and argv[0].endswith(ARGUMENTS_FILE_SUFFIXES):
        return Path(argv[0])
    return None


def load_arguments_file(path: str | Path) -> dict:
    """An arguments file's mapping of argument names to values, as YAML reads them (JSON is YAML)."""
    values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of argument names to values")
    return values


def under_preset(values: dict) -> dict:
    """`values` (an arguments file's) over the defaults of the --preset they name."""
    return {**preset_defaults(values.get("preset")), **values}


def preset_named_in(argv: list[str]) -> str | None:
    """The NAME of `--preset NAME` or `--preset=NAME` among the words, read before the other flags: the preset
    sets their defaults."""
    for position, word in enumerate(argv):
        if word == "--":
            break
        if word == "--preset" and position + 1 < len(argv):
            return argv[position + 1]
        if word.startswith("--preset="):
            return word.partition("=")[2]
    return None
