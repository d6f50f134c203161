"""Sentence pairs read as they were written: two line-aligned text files, one TSV file (source<TAB>target) or one
JSON lines file as Transformers' `run_translation.py` reads it (``{"translation": {"de": ..., "en": ...}}`` a
line), each optionally compressed (``.gz``, ``.xz``).

* Lines end at "\\n", "\\r\\n" or "\\r" (classic Mac files), never at the other characters `str.splitlines` breaks
  at (U+2028, U+0085, form feeds: they occur inside sentences); a UTF-8 byte-order mark is dropped.
* Input that is not UTF-8 is refused, naming the file, the line and the byte.

Every command reads text this way, through this module: training (`pairs_on_disk` for the training pairs,
`read_pairs` for validation files), evaluation (`read_parallel_files`), translation and the demo (`read_lines`, which
also reads standard input), tokenizer training from files, and the web page's text box (`text_lines`).
* A source and a target of identical contents (the same file given twice, say) are refused: a model trained on
  them learns to copy. A plain text file that looks like JSON lines or TSV is refused with a hint.
* `read_pairs` builds a Dataset with `datasets` (`Dataset.from_generator`, memory-mapped in its cache) under a key
  that holds the files' content hashes, so an edited file is read again whatever its size and modification time.
  `pairs_on_disk` keeps no copy: its `PairsOnDisk` reads the files again whenever its pairs are asked for.

`scan_text_file` makes one pass over a file for its hash, line count and encoding check; the training command
records the hashes in its run manifest (`run_manifest`). `iter_lines` then yields the lines of a scanned file.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import itertools
import json
import logging
import lzma
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

COMPRESSIONS = {".gz": gzip.open, ".xz": lzma.open}
PAIR_FILE_FORMATS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}  # a one-file split, by its suffix
_SNIFFED_LINES = 20  # how many non-empty lines of a plain text file are looked at to tell JSON lines or TSV


def open_binary(path: str | Path):
    """The file's bytes, decompressed for a ``.gz`` or ``.xz`` name."""
    path = Path(path)
    return COMPRESSIONS.get(path.suffix, open)(path, "rb")


def format_suffix(path: str | Path) -> str:
    """``train.tsv.gz`` -> ``.tsv``: the suffix under the compression's."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSIONS else path.suffix


def iter_lines(path: str | Path):
    """The file's lines, without their ends ("\\n", "\\r\\n" or "\\r"), BOM dropped; a file scanned first
    (`scan_text_file`) decodes without error."""
    yield from _lines_of(open_binary(path))


def _lines_of(binary):
    with io.TextIOWrapper(binary, encoding="utf-8-sig", newline=None) as lines:
        for line in lines:  # universal newlines: "\r\n" and "\r" come back as "\n", nothing else ends a line
            yield line[:-1] if line.endswith("\n") else line


def read_lines(path: str | Path | None) -> list[str]:
    """The lines of a text file (optionally ``.gz``/``.xz``), or of standard input for ``None`` or ``"-"``, as
    every command reads text: without their ends ("\\n", "\\r\\n" or "\\r"), a byte-order mark dropped.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: bytes that are not UTF-8, naming the file (``<stdin>``), the line and the byte.
    """
    if path is None or str(path) == "-":
        data = sys.stdin.buffer.read()
        try:
            return text_lines(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise _decode_error("<stdin>", data) from None
    scan_text_file(path)
    return list(iter_lines(path))


def text_lines(text: str) -> list[str]:
    """The lines of a string (a text box's, standard input's) as `read_lines` reads a file's: split at "\\n",
    "\\r\\n" and "\\r" only, a leading byte-order mark dropped."""
    with io.StringIO(text.removeprefix("\ufeff"), newline=None) as lines:  # universal newlines, as for files
        return [line[:-1] if line.endswith("\n") else line for line in lines]


@dataclass(frozen=True)
class TextFileScan:
    """What one pass over a text file learns: the SHA-256 of its (decompressed) bytes, its number of lines as
    `iter_lines` splits them, and its first non-empty lines (to tell its format)."""

    path: Path
    sha256: str
    lines: int
    first_lines: tuple[str, ...]


def scan_text_file(path: str | Path) -> TextFileScan:
    """Hash, count and check a text file in one pass. Raises FileNotFoundError, or ValueError naming the line and
    byte where it is not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Text file not found: {path}")
    digest, decoder = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
    line_ends, last, carriage_return_before = 0, b"", False
    try:
        with open_binary(path) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                decoder.decode(chunk)
                # "\r\n" is one line end, also when a chunk ends between its two bytes
                crlf = chunk.count(b"\r\n") + (carriage_return_before and chunk.startswith(b"\n"))
                line_ends += chunk.count(b"\n") + chunk.count(b"\r") - crlf
                carriage_return_before, last = chunk.endswith(b"\r"), chunk[-1:]
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        with open_binary(path) as handle:
            raise _decode_error(str(path), handle.read()) from None  # read whole only on this error path
    except (OSError, EOFError, lzma.LZMAError) as error:  # a damaged .gz or .xz
        raise ValueError(f"{path}: cannot be read as {path.suffix} compressed text ({error})") from None
    first_lines = []
    for line in iter_lines(path):
        if line.strip():
            first_lines.append(line)
            if len(first_lines) == _SNIFFED_LINES:
                break
    return TextFileScan(path, digest.hexdigest(), line_ends + (last not in (b"", b"\n", b"\r")), tuple(first_lines))


def _decode_error(name: str, data: bytes) -> ValueError:
    """The error for text `data` (of file `name`) that is not UTF-8, naming its first undecodable line and byte."""
    for number, line in enumerate(re.split(rb"\r\n|\r|\n", data), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            character = len(line[:error.start].decode("utf-8")) + 1
            return ValueError(
                f"{name}, line {number}: not UTF-8 (byte 0x{line[error.start]:02x} at character {character}); "
                "convert the file to UTF-8 first (e.g. iconv -f latin1 -t utf-8)")
    return ValueError(f"{name}: not UTF-8 (a multi-byte character is cut off at the end of the file)")


@dataclass(frozen=True)
class PairFiles:
    """Where one split's sentence pairs are: `source` and `target`, two line-aligned text files, or `file`, one TSV
    or JSON lines file (by its suffix, under a compression's: ``.tsv``, ``.jsonl``/``.json``) whose pairs are keyed
    by `source_lang` and `target_lang`."""

    source: Path | None = None
    target: Path | None = None
    file: Path | None = None
    source_lang: str = "de"
    target_lang: str = "en"

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.file,) if self.file is not None else (self.source, self.target)

    @property
    def format(self) -> str:
        if self.file is None:
            return "text"
        suffix = format_suffix(self.file)
        if suffix not in PAIR_FILE_FORMATS:
            raise ValueError(f"{self.file}: a one-file split is TSV (.tsv) or JSON lines (.jsonl, .json), optionally "
                             f"compressed (.gz, .xz); got {suffix or 'no suffix'}. Two line-aligned text files are "
                             "given as source and target")
        return PAIR_FILE_FORMATS[suffix]

    def scan(self) -> dict[Path, TextFileScan]:
        """Scan every file (`scan_text_file`) and refuse what cannot be read as these pairs: misaligned or identical
        sides, and text files that are JSON lines or TSV."""
        file_format = self.format
        scans = {path: scan_text_file(path) for path in self.paths}
        if file_format != "text":
            return scans
        source, target = scans[self.source], scans[self.target]
        if source.lines != target.lines:
            raise ValueError(f"{self.source} has {source.lines} lines but {self.target} has {target.lines}; parallel "
                             "files must be line-aligned")
        # (blank files are alike without being a copy: they are refused as holding no pair, where pairs are needed)
        if self.source.resolve() == self.target.resolve() or (source.sha256 == target.sha256 and source.first_lines):
            same = "are the same file" if self.source.resolve() == self.target.resolve() else "have identical contents"
            raise ValueError(f"{self.source} and {self.target} {same}: a model trained on them learns to copy its "
                             "input; give the source-language and the target-language side")
        for scan in (source, target):
            _refuse_other_formats(scan)
        return scans


def _refuse_other_formats(scan: TextFileScan) -> None:
    """A plain text side whose lines are JSON objects or all hold a tab is another format given as text."""
    lines = scan.first_lines
    if lines and lines[0].lstrip().startswith("{"):
        try:
            record = json.loads(lines[0])
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            raise ValueError(f"{scan.path} looks like JSON lines (line 1 is a JSON object with keys "
                             f"{sorted(record)}), not plain text; give it as one JSON lines file of pairs "
                             "(the training command's --train_file / --validation_file, with a .jsonl name)")
    if lines and all("\t" in line for line in lines):
        raise ValueError(f"{scan.path} looks like TSV (its first {len(lines)} non-empty lines all hold a tab), not "
                         "plain text; give it as one TSV file of source<TAB>target pairs (the training command's "
                         "--train_file / --validation_file, with a .tsv name)")


def holds_pair(source: str, target: str) -> bool:
    """Whether neither side is blank: `skip_empty` drops the pairs that are not."""
    return bool(source.strip() and target.strip())


@dataclass(frozen=True)
class PairsOnDisk:
    """Pairs `start` to `stop` of a split's files (numbered in file order after the pairs with a blank side, with
    `skip_empty`), read from the files whenever they are asked for: nothing of the text is held in memory or copied
    into an Arrow cache. The training command's corpus is read so (`training.data`): an Arrow copy of its text is
    memory-mapped, and every page of it that the tokenizer's training and the tokenising processes read counts in
    the command's memory (at 2.9M pairs the copy is 409 MB, and it kept the command's peak over 1 GB)."""

    files: PairFiles
    content: str  # the files' content hashes: the key of what is made of these pairs
    skip_empty: bool
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def pairs(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, str]]:
        """(source, target) of pairs `start` to `stop` of these (all by default); the files are read from their
        start, skipping what comes before."""
        stop = len(self) if stop is None else min(stop, len(self))
        rows = iter_pairs(self.files)
        if self.skip_empty:
            rows = (row for row in rows if holds_pair(row["source"], row["target"]))
        for row in itertools.islice(rows, self.start + start, self.start + stop):
            yield row["source"], row["target"]

    def split(self, size: int) -> tuple[PairsOnDisk, PairsOnDisk]:
        """The first `size` of these pairs and the rest."""
        middle = self.start + size
        return (PairsOnDisk(self.files, self.content, self.skip_empty, self.start, middle),
                PairsOnDisk(self.files, self.content, self.skip_empty, middle, self.stop))

    def columns(self) -> tuple[list[str], list[str]]:
        """Every source and every target sentence, as lists (for a small split, or what needs them all at once)."""
        sources, targets = [], []
        for source, target in self.pairs():
            sources.append(source)
            targets.append(target)
        return sources, targets

    def to_dataset(self) -> Dataset:
        """These pairs in an in-memory Dataset of `source` and `target` columns (for a small split)."""
        from datasets import Dataset

        sources, targets = self.columns()
        return Dataset.from_dict({"source": sources, "target": targets})

    def sample(self, count: int, seed: int) -> Dataset:
        """`count` of these pairs drawn at random (`random_rows`) in an in-memory Dataset of `source` and `target`
        columns, read in one pass over the files."""
        from datasets import Dataset

        wanted = iter(random_rows(len(self), count, seed))
        sources, targets = [], []
        next_row = next(wanted, None)
        for row, (source, target) in enumerate(self.pairs()):
            if row == next_row:
                sources.append(source)
                targets.append(target)
                next_row = next(wanted, None)
            if next_row is None:
                break
        return Dataset.from_dict({"source": sources, "target": targets})


def random_rows(total: int, count: int, seed: int) -> list[int]:
    """`min(count, total)` row numbers of `range(total)` drawn uniformly without replacement with `seed`, in
    ascending order (the pairs keep their corpus order); the same for the same arguments on every machine."""
    return sorted(random.Random(seed).sample(range(total), min(count, total)))


@dataclass(frozen=True)
class PairsRead:
    """A split's pairs (`dataset`: a Dataset of `source` and `target` columns, or `PairsOnDisk`) and how many lines
    were read and skipped."""

    dataset: Dataset | PairsOnDisk
    read: int
    skipped_empty: int


def iter_pairs(files: PairFiles) -> Iterator[dict[str, str]]:
    """The split's pairs in file order, as `{"source": ..., "target": ...}`, each format read as `read_pairs`
    reads it (a TSV or JSON lines line that holds no pair raises ValueError naming the file and line)."""
    return _PAIR_GENERATORS[files.format](**_generator_arguments(files), content="")


def _generator_arguments(files: PairFiles) -> dict[str, str]:
    """What the format's pair generator reads: the files' paths (resolved) and a JSON lines file's languages."""
    paths = {f"path{index}": str(path.resolve()) for index, path in enumerate(files.paths)}
    languages = {"source_lang": files.source_lang, "target_lang": files.target_lang} if files.format == "jsonl" else {}
    return {**paths, **languages}


def pairs_on_disk(files: PairFiles, scans: dict[Path, TextFileScan] | None = None, max_pairs: int | None = None,
                  skip_empty: bool = False) -> PairsRead:
    """The split's pairs as `read_pairs` selects them, as `PairsOnDisk`: one pass over the files counts them (and
    finds a line that holds no pair) without keeping any."""
    scans = scans if scans is not None else files.scan()
    read = kept = 0
    for row in iter_pairs(files):
        read += 1
        kept += not skip_empty or holds_pair(row["source"], row["target"])
    skipped = read - kept
    _warn_skipped(files, skipped, kept)
    content = _content_key(files, scans)
    stop = kept if max_pairs is None else min(max_pairs, kept)
    return PairsRead(PairsOnDisk(files, content, skip_empty, 0, stop), read, skipped)


def read_pairs(files: PairFiles, scans: dict[Path, TextFileScan] | None = None, max_pairs: int | None = None,
               skip_empty: bool = False) -> PairsRead:
    """The split's pairs as a `datasets` Dataset, cached under the files' content hashes. `scans` are the files'
    scans if already made (`PairFiles.scan`). With `skip_empty`, pairs whose source or target is blank are dropped
    (and counted in the log); `max_pairs` keeps the first pairs after that."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    scans = scans if scans is not None else files.scan()
    if all(scans[path].lines == 0 for path in files.paths):  # `datasets` cannot infer columns from nothing
        return PairsRead(Dataset.from_dict({"source": [], "target": []}), 0, 0)
    # the content hashes are part of the cache key (no lists in gen_kwargs: `datasets` would take them for shards)
    content = _content_key(files, scans)
    try:
        dataset = Dataset.from_generator(_PAIR_GENERATORS[files.format],
                                         gen_kwargs={**_generator_arguments(files), "content": content})
    except DatasetGenerationError as error:
        if isinstance(error.__cause__, ValueError):  # ours, naming the file and line
            raise error.__cause__ from None
        raise
    read, skipped = len(dataset), 0
    if skip_empty:
        kept = dataset.filter(lambda batch: [holds_pair(source, target)
                                             for source, target in zip(batch["source"], batch["target"])],
                              batched=True, desc="dropping empty lines")
        skipped = len(dataset) - len(kept)
        _warn_skipped(files, skipped, len(kept))
        dataset = kept
    if max_pairs is not None:
        dataset = dataset.select(range(min(max_pairs, len(dataset))))
    return PairsRead(dataset, read, skipped)


def _content_key(files: PairFiles, scans: dict[Path, TextFileScan]) -> str:
    """The files' content hashes: the key of what is made of their pairs."""
    return " ".join(scans[path].sha256 for path in files.paths)


def _warn_skipped(files: PairFiles, skipped: int, kept: int) -> None:
    if skipped:
        logger.warning(f"{' / '.join(map(str, files.paths))}: skipped {skipped} pairs with an empty line, kept {kept}")


def read_parallel_files(source_path: str | Path, target_path: str | Path, max_pairs: int | None = None,
                        skip_empty: bool = False) -> Dataset:
    """Two line-aligned text files -> Dataset with `source` and `target` columns (see `read_pairs`)."""
    return read_pairs(PairFiles(source=Path(source_path), target=Path(target_path)), max_pairs=max_pairs,
                      skip_empty=skip_empty).dataset


def _text_pairs(path0: str, path1: str, content: str):
    for source, target in zip(iter_lines(path0), iter_lines(path1)):
        yield {"source": source, "target": target}


def _tsv_pairs(path0: str, content: str):
    for number, line in enumerate(iter_lines(path0), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path0}, line {number}: {len(fields)} tab-separated fields; a TSV line holds a source "
                             "and a target sentence separated by one tab")
        yield {"source": fields[0], "target": fields[1]}


def _jsonl_pairs(path0: str, source_lang: str, target_lang: str, content: str):
    for number, line in enumerate(iter_lines(path0), start=1):
        if not line.strip():  # holds no pair (JSON lines readers skip blank lines too)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path0}, line {number}: not JSON ({error.msg} at character {error.colno}); a JSON lines "
                             "file holds one object a line") from None
        translation = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(translation, dict) or not all(
                isinstance(translation.get(language), str) for language in (source_lang, target_lang)):
            raise ValueError(f'{path0}, line {number}: expected {{"translation": {{"{source_lang}": "...", '
                             f'"{target_lang}": "..."}}}} (run_translation\'s format; --source_lang and --target_lang '
                             f"name the keys), got {line[:120]}")
        yield {"source": translation[source_lang], "target": translation[target_lang]}


_PAIR_GENERATORS = {"text": _text_pairs, "tsv": _tsv_pairs, "jsonl": _jsonl_pairs}
