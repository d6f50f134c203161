"""The training command's data preparation started before its imports: a process forked before the command imports
torch and Transformers' model stack (~3.5 s of every run's start on 2 cores) reads the training files, trains the
tokenizer and tokenises the pairs meanwhile, and the command takes what it prepared when it reaches its data
(`DataPrefetch.take`), if it was made from the same recipe.

The forked process knows the run only from the command line's words, which it reads itself, as the command reads
them (`recipe.read_recipe`: the command's parser over its argument groups that import no torch; read before the
fork, Transformers' import that the parser needs would hold the fork back by about a second). The command compares
that recipe, with the files' SHA-256 as each side read them, against the one its own parsed and checked arguments
give (`recipe.data_recipe`); on any difference it stops the process and prepares the data itself, so a word read
otherwise (one the command refuses) costs time, never a different run. The process writes nothing in the run
folder (the command's lock and resume rules stay the command's): the tokenizer goes to a temporary folder the
command deletes, the token ids to `datasets`' cache, where the command's own tokenisation would have written them.
It is not started with several processes (torchrun), --help, torch already imported (the command called from
Python) or no `os.fork`, and HF_HEADATTN_DATA_PREFETCH=0 turns it off; where the words do not foresee the data (a
--dataset, a given --tokenizer, --sample_train_pairs, a run that resumes a checkpoint) it reports so and exits.

The process is speculative until the command's arguments are checked: what it writes to standard error (its
progress bars, its warnings) is held back until the command has parsed and checked every flag
(`DataPrefetch.show_output`), and a refused command stops it with nothing of it shown; it runs at a lower
scheduling priority, so that on a machine of few cores it does not delay the imports and checks that decide whether
the run goes ahead.

At 29k pairs the command reaches its first optimizer step about 2 s sooner (examples/benchmark_data_prep.py).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .command_words import HELP_WORDS

logger = logging.getLogger(__name__)


DISABLED = "HF_HEADATTN_DATA_PREFETCH"  # "0": never start the process
# how much lower the process' scheduling priority is than the command's (os.nice: 0 same, 19 lowest)
NICENESS = 10


def started_too_late() -> bool:
    """Whether torch is imported already (the command called from Python): nothing left to overlap, and a process
    forked now would copy torch's threads' state."""
    return "torch" in sys.modules


@dataclass
class PreparedData:
    """What the forked process prepared: the trained tokenizer and the tokenised training and validation pairs (as
    `data.tokenize_parallel` returns them)."""

    tokenizer: Any
    train_dataset: Any
    valid_dataset: Any


class DataPrefetch:
    """The forked data preparation of one training command (`start`), taken (`take`) or stopped (`close`); a
    context manager that stops it and removes its temporary folder on the way out."""

    def __init__(self, pid: int | None = None, reader: int | None = None, folder: Path | None = None,
                 output_gate: int | None = None):
        self.pid, self._reader, self._folder, self._output_gate = pid, reader, folder, output_gate

    @classmethod
    def start(cls, argv: list[str]) -> DataPrefetch:
        """Fork the data preparation for the command line's words `argv`, where torch is not imported yet; else an
        inactive DataPrefetch (whose `take` gives None). The forked process reads the words itself (`read_recipe`,
        whose parser imports Transformers): read here, they would hold the fork back by that import."""
        if (os.environ.get(DISABLED) == "0" or not hasattr(os, "fork") or started_too_late()
                or int(os.environ.get("WORLD_SIZE", "1")) > 1 or any(word in HELP_WORDS for word in argv)):
            return cls()
        argv = [str(word) for word in argv]
        # made here, so that the command removes it whenever it stops the process
        folder = Path(tempfile.mkdtemp(prefix="hf-headattn-train-data-"))
        reader, writer = os.pipe()
        gate_reader, gate_writer = os.pipe()  # one byte from the command: the arguments are valid, show the output
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the forked process: prepare, report, exit without the parent's exit handlers
            os.close(reader)
            os.close(gate_writer)
            status = 1
            try:
                os.setpgid(0, 0)  # its own group: `close` stops it with the pool it may fork
                os.nice(NICENESS)
                sys.stderr = held = HeldOutput(sys.stderr, gate_reader)
                _prepare_and_report(argv, folder, writer, parent=os.getppid())
                status = 0
                held.settle()  # what it held is shown (or dropped) once the command has checked its flags
            except BaseException:  # the command prepares the data itself and says what went wrong
                pass
            finally:
                os._exit(status)
        os.close(writer)
        os.close(gate_reader)
        try:  # as the process does itself: whichever runs first, `close` finds its group
            os.setpgid(pid, pid)
        except OSError:  # it did so already and may have exited
            pass
        return cls(pid, reader, folder, gate_writer)

    def silence(self) -> None:
        """Never show the process' standard error (the run is --quiet): the gate closes without a word."""
        if self._output_gate is not None:
            os.close(self._output_gate)
            self._output_gate = None

    def show_output(self) -> None:
        """Let the process' standard error through, what it held back included: the command has checked its
        arguments, so the preparation is the run's own."""
        if self._output_gate is not None:
            try:
                os.write(self._output_gate, b"1")
            except OSError:  # the process has exited already
                pass
            os.close(self._output_gate)
            self._output_gate = None

    @property
    def active(self) -> bool:
        return self.pid is not None

    def take(self, recipe: dict) -> PreparedData | None:
        """Wait for the forked process and return what it prepared if it was made from `recipe` (`data_recipe` of
        the command's arguments); None if it was not, failed, or none was started."""
        if not self.active:
            return None
        self.show_output()  # taken: the preparation is the run's (the process waits for this word to exit)
        with os.fdopen(self._reader, "rb") as pipe:
            self._reader = None
            message = pipe.read()
        os.waitpid(self.pid, 0)
        self.pid = None
        try:
            report = json.loads(message)
        except ValueError:
            logger.debug("the data preparation started with the command failed; the command prepares the data")
            return None
        if report is None:
            logger.debug("the data could not be foreseen from the command's words; the command prepares the data")
            return None
        if report["recipe"] != recipe:
            logger.debug("the data prepared during start-up was read from other flags than the command's (a flag "
                         "`read_recipe` gets wrong); the command prepares the data")
            return None
        from ..tokenization import load_tokenizer

        logger.debug("the tokenizer and token ids prepared during start-up are taken")
        return PreparedData(tokenizer=load_tokenizer(self._folder / "tokenizer"),
                            train_dataset=_receive(report["train"]), valid_dataset=_receive(report["validation"]))

    def close(self) -> None:
        """Stop the forked process if it still runs and remove its temporary folder."""
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None
        for name in ("_reader", "_output_gate"):
            if getattr(self, name) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> DataPrefetch:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class HeldOutput:
    """The forked process' standard error: what is written is kept until the command sends a byte down `gate` (its
    arguments are valid, `DataPrefetch.show_output`), then written out and passed through from then on; if the
    command closes `gate` without one (it refused its arguments), nothing is ever shown."""

    def __init__(self, stream, gate: int):
        self._stream, self._held, self._shown = stream, [], False
        self._lock = threading.Lock()
        self._gate = threading.Thread(target=self._wait_for, args=(gate,), daemon=True)
        self._gate.start()

    def settle(self) -> None:
        """Wait for the command's word (or its exit): what was held is then written out or dropped."""
        self._gate.join()

    def _wait_for(self, gate: int) -> None:
        released = os.read(gate, 1) == b"1"
        os.close(gate)
        if released:
            with self._lock:
                self._shown = True
                self._stream.write("".join(self._held))
                self._stream.flush()
                self._held.clear()

    def write(self, text: str) -> int:
        with self._lock:
            if self._shown:
                return self._stream.write(text)
            self._held.append(text)
            return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._shown:
                self._stream.flush()

    def isatty(self) -> bool:  # progress bars are drawn as they would be on the stream they end up on
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str):  # encoding, errors, ...: the stream's
        return getattr(self._stream, name)


def _prepare_and_report(argv: list[str], folder: Path, writer: int, parent: int) -> None:
    """In the forked process: read the recipe from the command's words `argv` (`read_recipe`), prepare its data as
    the command does (`run._train`: read, train the tokenizer on the training pairs, tokenise both splits) into
    `folder` and `datasets`' cache, and write where it is to `writer` as JSON (null where the data cannot be
    foreseen)."""
    from .recipe import data_recipe, read_recipe  # its parser imports Transformers: here, not before the fork

    read = read_recipe(argv)
    if read is None:
        with os.fdopen(writer, "wb") as pipe:
            pipe.write(b"null")
        return
    recipe, verbose = read
    from ..cli import quiet_libraries
    from .data import load_data, scan_data_files, tokenize_splits, train_corpus_tokenizer

    quiet_libraries(verbose, datasets=True)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    data_args = SimpleNamespace(**recipe, dataset=None, sample_train_pairs=False, streaming=False)
    data_logger = logging.getLogger(__package__ + ".data")
    data_logger.setLevel(logging.ERROR)  # the command reads the files too, and warns about them itself
    scans, file_sha256 = scan_data_files(data_args)
    train_text, valid_text, _ = load_data(data_args, scans)
    data_logger.setLevel(logging.NOTSET)  # its tokenisation's warnings are the run's only ones
    tokenizer = train_corpus_tokenizer(train_text, recipe["vocab_size"], recipe["tokenizer_model"],
                                       recipe["max_length"])
    tokenizer.save_pretrained(folder / "tokenizer")
    train, valid = tokenize_splits(train_text, valid_text, tokenizer, recipe["max_length"],
                                   recipe["preprocessing_num_workers"])
    report = {"recipe": data_recipe(recipe, file_sha256), "train": _send(train, folder / "train"),
              "validation": _send(valid, folder / "validation")}
    if os.getppid() != parent:  # the command is gone: nobody else removes the folder
        shutil.rmtree(folder, ignore_errors=True)
        return
    with os.fdopen(writer, "wb") as pipe:
        pipe.write(json.dumps(report).encode())


def _send(dataset, folder: Path) -> dict:
    """Where the command finds `dataset`: its cache files in `datasets`' cache, or, held in memory, saved into
    `folder`."""
    if dataset.cache_files:
        return {"files": [entry["filename"] for entry in dataset.cache_files], "columns": dataset.column_names}
    dataset.save_to_disk(str(folder))
    return {"saved": str(folder), "columns": dataset.column_names}


def _receive(sent: dict):
    from datasets import Dataset, concatenate_datasets

    if "saved" in sent:  # read into memory: the folder is removed after `take`
        return Dataset.load_from_disk(sent["saved"], keep_in_memory=True)
    dataset = concatenate_datasets([Dataset.from_file(file) for file in sent["files"]])
    return dataset.select_columns(sent["columns"])
