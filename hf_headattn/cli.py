"""What the package's commands share: `--help` layout and the `--verbose` flag.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import logging


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` shows every flag's default, and the description and examples laid out as written."""


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also log progress details (INFO) of this package and of Transformers")


def configure_logging(verbose: bool) -> None:
    """Log lines with time and source; INFO with --verbose, else warnings and errors only."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=level)
    logging.getLogger("hf_headattn").setLevel(level)
    if verbose:
        import transformers

        transformers.logging.set_verbosity_info()


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
