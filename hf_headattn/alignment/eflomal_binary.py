"""eflomal's binary, run as a child process of this one: its input files written, its two directions' links read
back, its progress messages followed by a progress bar.

eflomal's own ``Aligner.align`` starts the binary with this process's standard error, so following its messages
would mean redirecting file descriptor 2 of the whole process, and with it whatever any other thread writes there
meanwhile (the web page serves requests on several). Here the package still writes the binary's input files
(``Aligner.prepare_files``), but the binary is started here, with the command line ``Aligner.align`` builds, and
with a progress bar its standard error is a pipe of its own, read in the calling thread.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from ..progress import Progress

from .symmetrization import Links

# What the eflomal binary reports besides a model's end (swallowed under a progress bar, as its quiet mode does).
_EFLOMAL_MESSAGES = ("Read texts", "Vocabulary sizes", "Created alignment structures", "Randomized alignment",
                     "Aligning with model", "Final argmax", "Writing alignments", "Done: ")
_MODEL_DONE = "Done: "


def eflomal_package(needed_by: str):
    """The eflomal package, imported only by what aligns (``import hf_headattn`` stays free of it)."""
    try:
        import eflomal
    except ImportError as error:
        raise ImportError(f"{needed_by} needs the eflomal word aligner: `pip install eflomal`") from error
    return eflomal


def run_eflomal(aligner, source_lines: list[str], target_lines: list[str], *, priors: str | None = None,
                quiet: bool = True, progress: str | None = None) -> tuple[list[Links], list[Links]]:
    """One eflomal run of `aligner` (an ``eflomal.Aligner``, which holds the options) over the numbered lines:
    (forward links, reverse links) per sentence pair. `priors`: the text of a priors file (``--priors``). `quiet`
    silences the binary; `progress`, a progress bar of that description over its sampling iterations instead."""
    with tempfile.TemporaryDirectory(prefix="hf_headattn_align_") as directory:
        folder = Path(directory)
        with open(folder / "source", "wb") as source_file, open(folder / "target", "wb") as target_file, \
                open(folder / "priors", "w", encoding="utf-8") as priors_file:
            aligner.prepare_files(source_lines, source_file, target_lines, target_file,
                                  None if priors is None else io.StringIO(priors), priors_file)
        iterations = _sampling_iterations(aligner, len(source_lines))
        command = _command(aligner, iterations, folder, with_priors=priors is not None,
                           quiet=quiet and progress is None)
        if progress is not None:
            status = _run_following(command, iterations, progress)
        else:
            if not quiet:  # as eflomal's own run shows it
                print(" ".join(command), file=sys.stderr, flush=True)
            status = subprocess.run(command).returncode
        if status != 0:
            raise RuntimeError(f"eflomal exited with status {status}; run with quiet=False to see its messages")
        return (_read_links(folder / "forward.links", len(source_lines), "forward"),
                _read_links(folder / "reverse.links", len(source_lines), "reverse"))


def _sampling_iterations(aligner, n_sentences: int) -> list[int]:
    """The Gibbs sampling iterations of each model the binary runs (IBM1, then HMM, then fertility, up to
    ``aligner.model``): ``aligner.n_iterations``, or eflomal's default, which shrinks as the corpus grows."""
    if aligner.n_iterations is not None:
        counts = tuple(aligner.n_iterations)
    else:  # the formula of eflomal's Python package (eflomal.pyx)
        iters = max(2, int(round(aligner.rel_iterations * 5000 / math.sqrt(n_sentences))))
        quarter = max(1, iters // 4)
        if aligner.model == 1:
            counts = (iters, 0, 0)
        elif aligner.model == 2:
            counts = (max(2, quarter), iters, 0)
        else:
            counts = (max(2, quarter), quarter, iters)
    # the binary always runs IBM1 (-1), and HMM (-2) and fertility (-3) up to the model asked for
    return [int(count) for count in counts[: max(1, min(aligner.model, 3))]]


def _command(aligner, iterations: list[int], folder: Path, *, with_priors: bool, quiet: bool) -> list[str]:
    """The binary's command line, as ``eflomal.Aligner.align`` builds it, writing the links into `folder`."""
    binary = Path(eflomal_package("align_corpus").__file__).parent / "bin" / "eflomal"
    command = [str(binary), "-m", str(aligner.model), "-s", str(folder / "source"), "-t", str(folder / "target"),
               "-n", str(aligner.n_samplers), "-N", str(aligner.null_prior)]
    for model, count in enumerate(iterations, start=1):
        command += [f"-{model}", str(count)]
    command += ["-f", str(folder / "forward.links"), "-r", str(folder / "reverse.links")]
    if quiet:
        command.append("-q")
    if aligner.score_model > 0:
        command += ["-M", str(aligner.score_model)]
    if with_priors:
        command += ["-p", str(folder / "priors")]
    return command


def _run_following(command: list[str], iterations: list[int], description: str) -> int:
    """Run the binary with a progress bar over its sampling iterations, read from its standard error (a pipe of the
    child's alone): both directions run side by side, so every two "Done" lines one model has finished. Anything
    else it writes there is passed on to this process's standard error. Returns its exit status."""
    model_iterations = [count for count in iterations if count > 0]
    finished_halves = 0
    with Progress(desc=description, unit="iteration", total=sum(model_iterations)) as bar, \
            subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace") as child:
        for line in child.stderr:
            if line.startswith(_MODEL_DONE):
                finished_halves += 1
                if finished_halves % 2 == 0 and finished_halves // 2 <= len(model_iterations):
                    bar.update(model_iterations[finished_halves // 2 - 1])
            elif not line.startswith(_EFLOMAL_MESSAGES):
                bar.write(line.rstrip("\n"), file=sys.stderr)
    return child.returncode


def _read_links(path: Path, n_sentences: int, direction: str) -> list[Links]:
    if not path.exists():
        raise RuntimeError(f"eflomal wrote no {direction} alignments; run with quiet=False to see its messages")
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n_sentences:
        raise RuntimeError(
            f"eflomal wrote {len(lines)} {direction} alignment lines for {n_sentences} sentence pairs; "
            "run with quiet=False to see its messages"
        )
    return [[tuple(int(x) for x in link.split("-")) for link in line.split()] for line in lines]
