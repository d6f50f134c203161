"""What the package's commands share: `--help` layout, the `--verbose` and `--json` flags, and the flag spelling.

One convention for every command: flags are spelled as Transformers spells them (`--output_dir`, `--num_beams`),
the dashed spelling (`--output-dir`) is accepted as an alias, and `--help` shows the underscore form only. Commands
print a short line for people (`BLEU 36.50 | chrF 57.00 | 1,000 sentences | written: DIR`); the full results are
in the files they write, and with `--json` on standard output.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import copy
import logging


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` shows every flag's default, and the description and examples laid out as written; a flag that has
    an underscore spelling and a dashed alias (as `HfArgumentParser` declares both) is shown by the former only."""

    def _format_action_invocation(self, action):
        shown = underscore_spellings(action.option_strings)
        if shown == action.option_strings:
            return super()._format_action_invocation(action)
        action = copy.copy(action)
        action.option_strings = shown
        return super()._format_action_invocation(action)


def underscore_spellings(option_strings: list[str]) -> list[str]:
    """`option_strings` without the dashed aliases of underscore spellings among them (`--vocab-size` beside
    `--vocab_size`)."""
    return [option for option in option_strings
            if not (option.startswith("--") and "-" in option[2:]
                    and "--" + option[2:].replace("-", "_") in option_strings)]


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also log progress details (INFO) of this package and of Transformers")


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """`--version`: the package's version, as every command prints it."""
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s (hf_headattn) {__version__}")


def add_verbose_and_version_arguments(parser: argparse.ArgumentParser) -> None:
    """The two flags every command shares: `--verbose` and `--version`."""
    add_verbose_argument(parser)
    add_version_argument(parser)


def add_json_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} instead of the short summary")


def configure_logging(verbose: bool) -> None:
    """Log lines with time and source; INFO with --verbose, else warnings and errors only."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=level)
    logging.getLogger("hf_headattn").setLevel(level)
    if verbose:
        import transformers

        transformers.logging.set_verbosity_info()
    quiet_libraries(verbose)


def quiet_libraries(verbose: bool, *, datasets: bool = False) -> None:
    """No progress bars of Transformers (loading weights, writing shards) and, with `datasets`, of datasets
    (generating splits, filtering) unless `verbose`: seconds of work the user cannot act on, and escape codes in
    log files. A command's own bar over a datasets map turns them on for its time
    (`training.data.datasets_progress_bar`). `datasets` is opt-in: importing it costs commands that never use it
    seconds of start-up."""
    from transformers.utils import logging as transformers_logging

    if verbose:
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.disable_progress_bar()
    if datasets:
        import datasets as datasets_library

        if verbose:
            datasets_library.enable_progress_bars()
        else:
            datasets_library.disable_progress_bars()


class UnderscoreArgumentParser(argparse.ArgumentParser):
    """Flags spelled as Transformers spells them (`--output_dir`, `--num_beams`), with the dashed spelling
    (`--output-dir`) accepted as an alias; `--help` shows the underscore form only."""

    def parse_known_args(self, args=None, namespace=None):
        import sys

        args = list(sys.argv[1:] if args is None else args)
        known = {option for action in self._actions for option in action.option_strings}
        respelled = []
        for position, argument in enumerate(args):
            if argument == "--":  # what follows is not a flag
                respelled += args[position:]
                break
            name, equals, value = argument.partition("=")
            underscored = "--" + name[2:].replace("-", "_")
            use = underscored if name.startswith("--") and name not in known and underscored in known else name
            respelled.append(use + equals + value)
        return super().parse_known_args(respelled, namespace)
