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
