"""What the package's commands share: `--help` layout, the `--verbose` and `--json` flags, the flag spelling (also of a
translator's refusals: `FLAG_SPELLING`), the checked number types of count-like flags (`positive_int`, ...) and the
check of a `--model` written as a path (`check_model_flag`).

One convention for every command: flags are spelled as Transformers spells them (`--output_dir`, `--num_beams`),
the dashed spelling (`--output-dir`) is accepted as an alias, and `--help` shows the underscore form only. Commands
print a short line for people (`BLEU 36.50 | chrF 57.00 | 1,000 sentences | written: DIR`); the full results are
in the files they write, and with `--json` on standard output.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import ctypes
import gc
import logging
import math
import os
import platform
import re
import sys
from pathlib import Path


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


# how every command shows progress (`progress.Progress`), for the --help of the flags that turn it on or off
PROGRESS_RULE = "a bar on a terminal, plain lines with the rate and ETA elsewhere (a log file, a pipe)"


def add_quiet_argument(parser) -> None:
    """`--quiet` / `-q`, the same in every command that has it: no progress, no summary line, errors only."""
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress, no summary line: errors only")


def add_json_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} instead of the short summary")


def skip_exit_collections() -> None:
    """Have the interpreter's exit freeze every object out of the cyclic garbage collector (`gc.freeze`, an exit
    handler), so that the collections CPython runs as it tears down its modules do not walk the ~450,000 objects
    torch, Transformers and datasets leave: `hf-headattn-train` of a tiny model on 29k pairs took 1.1-1.2 s from its
    last line to its exit, 0.2 s with this (four alternating rounds, 2-core Xeon). Exit stays orderly: the other
    exit handlers run, output is flushed, and every object is freed as its last reference goes; only objects held
    in reference cycles are left to the operating system, as `os._exit` leaves them all. Every command's `main`
    calls it; once registered, however often."""
    atexit.unregister(freeze_heap_and_silence_teardown)
    atexit.register(freeze_heap_and_silence_teardown)


def freeze_heap_and_silence_teardown() -> None:
    """The exit handler of `skip_exit_collections`. After the freeze, the objects it left uncollected are reported by
    extensions that count their own objects at teardown: triton's nanobind bindings, which torch imports wherever
    triton is installed, print ~40 lines of `nanobind: leaked 514 functions!` under the command's last line (its
    error message included). Those reports are the freeze's own doing, never the command's, so once everything the
    command wrote is flushed, standard error is pointed at the null device for the teardown (as triton does for its
    own compile workers)."""
    gc.freeze()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, detached or a broken pipe: nothing left to keep
            pass
    try:
        null_device = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    os.dup2(null_device, 2)
    os.close(null_device)


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


def close_progress_bars() -> None:
    """Close every tqdm bar still open (as an exception leaves them), so that each ends its line now rather than
    being drawn again under the command's last words when it is collected."""
    from tqdm import tqdm

    for bar in list(tqdm._instances):
        bar.close()


# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit systems (32 MiB)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_LARGEST_MMAP_THRESHOLD = 32 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory this process frees for its next allocations instead of handing it back
    to the kernel; what the decoding commands (translate, evaluate) do first. Returns whether it was set (glibc only;
    elsewhere, e.g. macOS or musl, nothing changes).

    Decoding frees and allocates tensors of a few to tens of MiB at every step (beam search's [rows, vocab] scores,
    each layer's cache grown by a position). By default glibc serves such blocks with fresh mappings and returns
    freed memory to the kernel, so each new block's pages fault in again, zeroed (`hf-headattn-translate` at beam 5
    over 1,000 lines: 527,000 page faults without this, 175,000 with it; docs/deploying.md). Blocks below 32 MiB now
    come from the heap, and the heap is trimmed only above 1 GiB free: the process keeps its high-water mark until
    it exits. The same as starting Python with
    `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824`."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _LARGEST_MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


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


# ------------------------------------------------------------------------------------------------ checked numbers
# argparse `type=` functions: a flag's value is refused while the command line is parsed, before any work, with
# what is accepted ("argument --num_beams: '0' is not a whole number >= 1").
def _checked(text: str, convert, accepted: str, holds) -> int | float:
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not holds(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}")
    return value


def positive_int(text: str) -> int:
    """A count that must be at least one: beams, batch sizes, n-best, tokens."""
    return _checked(text, int, "a whole number >= 1", lambda value: value >= 1)


def non_negative_int(text: str) -> int:
    """A count where 0 means "off" (no_repeat_ngram_size, top_k)."""
    return _checked(text, int, "a whole number >= 0", lambda value: value >= 0)


SEED_RANGE = (0, 2**32 - 1)  # what numpy's seeding (Transformers' set_seed) takes


def random_seed(text: str) -> int:
    return _checked(text, int, f"a whole number in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]",
                    lambda value: SEED_RANGE[0] <= value <= SEED_RANGE[1])


def positive_float(text: str) -> float:
    return _checked(text, float, "a finite number > 0", lambda value: math.isfinite(value) and value > 0)


def non_negative_float(text: str) -> float:
    return _checked(text, float, "a finite number >= 0", lambda value: math.isfinite(value) and value >= 0)


def finite_float(text: str) -> float:
    return _checked(text, float, "a finite number", math.isfinite)


def probability(text: str) -> float:
    """A probability mass that must leave something (top_p)."""
    return _checked(text, float, "a number in (0, 1]", lambda value: 0 < value <= 1)


EARLY_STOPPING = {"true": True, "false": False, "never": "never"}  # generate's early_stopping values, as spelled


def early_stopping(text: str) -> bool | str:
    """generate's `early_stopping`: true, false or never."""
    if text.lower() not in EARLY_STOPPING:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(EARLY_STOPPING)}")
    return EARLY_STOPPING[text.lower()]


def add_early_stopping_argument(parser) -> None:
    """`--early_stopping`, as the commands that run beam search share it (`parser`: a parser or an argument group)."""
    parser.add_argument("--early_stopping", type=early_stopping, default=None, metavar="{true,false,never}",
                        help="when beam search ends a sentence (None: the model's generation config): true, once it "
                             "has --num_beams finished hypotheses (fairseq's and CTranslate2's rule; fewer steps); "
                             "false (Transformers' default), once no running beam is likely to overtake them; never, "
                             "once none can")


# ------------------------------------------------------------------------------------------------ --model as a path
class FlagSpelling:
    """Options as the commands' flags spell them, for the refusals a translator raises
    (:class:`hf_headattn.translation.OptionRefused`): ``fast=False`` -> ``--decoding generate``, ``num_beams`` ->
    ``--num_beams``, a switch by its flag alone (``--alignments``), ``early_stopping=True`` -> ``--early_stopping
    true``; several processes (torchrun) have no flag."""

    WORDS = {"distributed": "several processes"}  # no flag says these
    SWITCHES = ("alignments", "attention", "do_sample", "force", "strict", "trust_remote_code")

    def name(self, option: str) -> str:
        return self.WORDS.get(option) or ("--decoding" if option == "fast" else f"--{option}")

    def with_value(self, option: str, value) -> str:
        if option in self.WORDS:
            return self.WORDS[option]
        if option == "fast":
            return f"--decoding {'fast' if value else 'generate'}"
        if option in self.SWITCHES and value is True:
            return self.name(option)
        return f"{self.name(option)} {str(value).lower() if isinstance(value, bool) else value}"


FLAG_SPELLING = FlagSpelling()


_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # how a Hugging Face Hub repository id is written: name or user/name


def model_path_problem(name: str | Path, flag: str = "--model", hub_ids: bool = True) -> str | None:
    """Why `name` cannot be what a command's `flag` means (None: it can): a name written as a local path that names
    no folder, or with `hub_ids=False` (commands that take local folders only) any name that is no folder. Every
    command taking a model checks this before any work: loading would take a mistyped path for a Hub id (download
    it, or write it into a Space as one).

    Written as a path: not a Hub id's ``name`` / ``user/name`` form (an absolute path, several folders, a
    backslash), starting with ``.``, or ``user/name`` whose ``user`` is a folder here (``runs/de-en`` with a folder
    ``runs``: a mistyped run folder, not a Hub namespace)."""
    text, path = str(name), Path(name)
    if path.is_dir():
        return None
    if path.exists():
        return f"{flag} {text} is a file; name the model's folder (the one holding config.json)"
    if not hub_ids:
        why = "a saved model folder is needed here"
    elif not _HUB_ID.fullmatch(text) or text.startswith("."):
        why = "it is written as a path, not as a Hub id user/name"
    elif "/" in text and path.parent.is_dir():
        why = f"it is written as a path: {path.parent} is a folder here"
    else:
        return None
    return f"{flag} {text}: no such folder ({why}); check the path"


def check_file_flags(parser: argparse.ArgumentParser, files: dict[str, str | Path | list | None]) -> None:
    """Exit with `parser`'s usage error (status 2) for the first of `files` (flag -> a path, a list of paths, or None
    where the flag is not given) that is not a file, in the words every command uses: `--source PATH: no such
    file`."""
    for flag, paths in files.items():
        for path in paths if isinstance(paths, list) else [paths]:
            if path is not None and not Path(path).is_file():
                parser.error(f"{flag} {path}: no such file")


def check_model_flag(parser: argparse.ArgumentParser, names, flag: str = "--model", hub_ids: bool = True) -> None:
    """Exit with `parser`'s usage error for the first of `names` (one name, a list, or None) that
    `model_path_problem` refuses."""
    for name in [names] if isinstance(names, (str, Path)) else names or []:
        problem = model_path_problem(name, flag, hub_ids)
        if problem:
            parser.error(problem)
