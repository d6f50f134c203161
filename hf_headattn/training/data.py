"""A training run's data: the parallel text its flags name (two text files a split, one TSV or JSON lines file, or
a Hugging Face dataset), read into `datasets` Datasets of `source` and `target` columns and tokenised.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..parallel_data import PairFiles, PairsOnDisk, PairsRead, pairs_on_disk, random_rows, read_pairs

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, IterableDataset

    from .arguments import DataArguments

logger = logging.getLogger(__name__)


MULTI30K_FILES = ("train.de", "train.en", "val.de", "val.en", "test_2016_flickr.de", "test_2016_flickr.en")


def multi30k_paths(data_dir: str | Path) -> dict[str, Path]:
    """The Multi30k De-En files (see ../shared/data/multi30k/README) by name, checked to exist."""
    data_dir = Path(data_dir)
    missing = [name for name in MULTI30K_FILES if not (data_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{data_dir} lacks {', '.join(missing)}; point --data-dir at the Multi30k folder "
                                f"(it holds {', '.join(MULTI30K_FILES)})")
    return {name: data_dir / name for name in MULTI30K_FILES}


def load_hub_translation_dataset(
    name: str,
    config_name: str | None,
    source_lang: str,
    target_lang: str,
    split: str,
    max_pairs: int | None = None,
    streaming: bool = False,
    revision: str | None = None,
    sample_seed: int | None = None,
) -> Dataset | IterableDataset:
    """A Hugging Face dataset (Hub name or local folder; `revision`: a Hub branch, tag or commit) whose rows hold a
    `translation` dict keyed by language, or one column per language, -> Dataset with `source` and `target` columns
    (an IterableDataset read as a stream with `streaming`). `max_pairs` keeps the first pairs, or with `sample_seed`
    that many drawn at random (`random_rows`; not for a stream)."""
    from datasets import load_dataset

    dataset = load_dataset(name, config_name, split=split, streaming=streaming, revision=revision)
    if max_pairs is not None:
        if streaming:
            dataset = dataset.take(max_pairs)
        elif sample_seed is not None:
            dataset = dataset.select(random_rows(len(dataset), max_pairs, sample_seed))
        else:
            dataset = dataset.select(range(min(max_pairs, len(dataset))))
    first = next(iter(dataset))
    columns = list(first)  # a stream may not know its columns before it is read
    if "translation" in columns:
        languages = set(first["translation"])
        if not {source_lang, target_lang} <= languages:
            raise ValueError(
                f"Dataset {name!r} has languages {sorted(languages)}; asked for {source_lang!r} -> {target_lang!r}"
            )
        return dataset.map(
            lambda row: {"source": row["translation"][source_lang], "target": row["translation"][target_lang]},
            remove_columns=columns,
        )
    missing = [lang for lang in (source_lang, target_lang) if lang not in columns]
    if missing:
        raise ValueError(f"Dataset {name!r} has neither a 'translation' column nor columns {missing}; "
                         f"columns: {columns}")
    return dataset.map(lambda row: {"source": row[source_lang], "target": row[target_lang]}, remove_columns=columns)


# Below this many pairs one process tokenises faster than a pool of them, whose start-up costs about a second
# (examples/benchmark_data_prep.py)
PARALLEL_TOKENISATION_PAIRS = 50_000


def tokenization_processes(pairs: int, requested: int | None) -> int | None:
    """Processes for tokenising `pairs` pairs: `requested` (--preprocessing_num_workers) if given, else every core
    this process may run on for a large corpus and one (None: no pool) for a small one."""
    if requested is not None:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if cores > 1 and pairs >= PARALLEL_TOKENISATION_PAIRS else None


def tokenize_parallel(dataset: DatasetDict | Dataset | IterableDataset | PairsOnDisk, tokenizer, max_length: int = 128,
                      num_proc: int | None = None, split: str = "training"):
    """Replace `source` and `target` by `input_ids` and `labels` (`tokenization.encode_pairs` in a batched
    `datasets.map`, cached on disk, over `num_proc` processes, by default every core for a large corpus; on the fly
    for a stream). Pairs longer than `max_length` tokens on either side are truncated, with a warning that counts
    them (for a stream, a warning at the first one); `split` names the data in it (a DatasetDict's own keys win).

    The ids are stored as 32-bit integers and the attention mask not at all: a pair's mask is all ones until a batch
    pads it, and the collator (`tokenizer.pad`) writes it then. At 2.9M pairs the cache is 385 MB, where int64 ids
    and masks took 620 (the pages a run maps and reads from it shrink alike)."""
    import pyarrow.compute
    from datasets import DatasetDict, Features, IterableDataset, List, Value

    from ..tokenization import encode_pairs

    def encode(batch):
        encoded = encode_pairs(tokenizer, batch["source"], batch["target"], max_length)
        return {column: encoded[column] for column in features}

    ids = List(Value("int32"))
    features = Features({"input_ids": ids, "labels": ids, "truncated": Value("bool")})

    if isinstance(dataset, IterableDataset):
        warned = False

        def encode_and_warn(batch):
            nonlocal warned
            encoded = encode(batch)
            if any(encoded.pop("truncated")) and not warned:
                warned = True
                logger.warning(f"a {split} pair is longer than --max_length {max_length} tokens and is truncated "
                               "(a stream is not counted ahead); raise --max_length to keep such pairs whole")
            return encoded

        return dataset.map(encode_and_warn, batched=True, remove_columns=["source", "target"],
                           features=Features({"input_ids": ids, "labels": ids}))
    pairs = sum(map(len, dataset.values())) if isinstance(dataset, DatasetDict) else len(dataset)
    processes = tokenization_processes(pairs, num_proc)
    map_arguments = dict(function=encode, remove_columns=["source", "target"], desc="tokenising")
    if isinstance(dataset, PairsOnDisk):  # mapped over chunks of the pairs, each read from the files
        reader = PairChunkReader(dataset)

        def encode_chunks(batch):
            sources, targets = [], []
            for first, count in zip(batch["first"], batch["count"]):
                reader.read(first, count, sources, targets)
            return encode({"source": sources, "target": targets})

        dataset = pair_chunks(dataset, TOKENISED_CHUNK_PAIRS)
        map_arguments = dict(function=encode_chunks, batch_size=1, remove_columns=["first", "count"],
                             desc=f"tokenising, {TOKENISED_CHUNK_PAIRS:,} pairs a row")
    # Where a pool is forked: one that does not copy this heap (the freeze's collection costs ~0.3 s) and whose
    # processes tokenise on one thread each. Without a pool the Rust tokenizer keeps its threads, one a core: at
    # 29k pairs ~1.0 s against 1.5 s on one thread (2-core Xeon).
    with contextlib.ExitStack() as settings:
        settings.enter_context(datasets_progress_bar())  # the command's own step: minutes at millions
        if (processes or 1) > 1:
            settings.enter_context(heap_frozen_for_fork())
            settings.enter_context(tokenizers_parallelism_off())
        encoded = dataset.map(batched=True, num_proc=processes, features=features, **map_arguments)
    for name, part in encoded.items() if isinstance(encoded, DatasetDict) else [(split, encoded)]:
        if truncated := pyarrow.compute.sum(part.with_format("arrow")["truncated"]).as_py():
            logger.warning(f"{truncated} of {len(part)} {name} pairs are longer than --max_length {max_length} "
                           "tokens on one side and are truncated; raise --max_length to keep them whole")
    return encoded.remove_columns("truncated")


def train_corpus_tokenizer(train_text: Dataset | PairsOnDisk, vocab_size: int, model: str, max_length: int,
                           save_directory: str | Path | None = None):
    """The run's tokenizer: `tokenization.train_tokenizer` on every source and then every target sentence of the
    training pairs (`corpus_texts`, with a progress bar), truncating at `max_length` tokens; what the command and
    the data preparation it forks at start-up (`data_prefetch`) both train."""
    from ..tokenization import train_tokenizer

    return train_tokenizer(texts=corpus_texts(train_text, progress="training the tokenizer"), vocab_size=vocab_size,
                           model=model, save_directory=save_directory, model_max_length=max_length)


def tokenize_splits(train_text, valid_text, tokenizer, max_length: int, num_proc: int | None) -> tuple:
    """(training pairs, validation pairs), each tokenised by `tokenize_parallel`."""
    return (tokenize_parallel(train_text, tokenizer, max_length, num_proc),
            tokenize_parallel(valid_text, tokenizer, max_length, num_proc, split="validation"))


# `PairsOnDisk` are tokenised in chunks of this many pairs: a row of the map, read from the files in one go
TOKENISED_CHUNK_PAIRS = 1_000


def pair_chunks(pairs: PairsOnDisk, chunk_pairs: int) -> Dataset:
    """A Dataset of `first` and `count` rows that cut `pairs` into consecutive chunks of `chunk_pairs`, cached on
    disk under the files' contents and the pairs chosen (the tokenised Dataset mapped from it is cached beside it)."""
    from datasets import Dataset

    key = f"{pairs.content} {pairs.files.format} {pairs.skip_empty} {pairs.start} {pairs.stop} {chunk_pairs}"
    return Dataset.from_generator(_chunk_rows, gen_kwargs={"length": len(pairs), "chunk_pairs": chunk_pairs},
                                  fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32])


def _chunk_rows(length: int, chunk_pairs: int):
    for first in range(0, length, chunk_pairs):
        yield {"first": first, "count": min(chunk_pairs, length - first)}


class PairChunkReader:
    """Reads chunks of `PairsOnDisk`, keeping its place in the files from one chunk to the next: a tokenising
    process given a run of consecutive chunks reads its part of the files once (a chunk elsewhere starts the
    reading over). A copy (a tokenising process's, or the one `datasets` hashes) starts with nothing read."""

    def __init__(self, pairs: PairsOnDisk):
        self.pairs = pairs
        self._rows, self._next = None, None

    def __getstate__(self):
        return {"pairs": self.pairs}

    def __setstate__(self, state):
        self.__init__(state["pairs"])

    def read(self, first: int, count: int, sources: list[str], targets: list[str]) -> None:
        """Append pairs `first` to `first + count` to `sources` and `targets`."""
        if first != self._next:
            self._rows, self._next = self.pairs.pairs(first), first
        for source, target in itertools.islice(self._rows, count):
            sources.append(source)
            targets.append(target)
        self._next += count


@contextlib.contextmanager
def heap_frozen_for_fork():
    """Every object alive now frozen out of Python's cyclic garbage collector inside the block (`gc.freeze`), for a
    pool of processes forked there: they share this process's memory until they write to it, and the collector,
    walking every object it tracks, writes to them all (their reference counts and links), so that each worker soon
    holds its own copy of the whole heap (torch's and Transformers' modules). Frozen, they are never walked: the
    training command's anonymous memory while two workers tokenise 290k pairs fell from 703 to 465 MiB (summed PSS
    of the process and its workers, as examples/benchmark_data_prep.py samples it)."""
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def tokenizers_parallelism_off():
    """TOKENIZERS_PARALLELISM=false inside the block (as it was after it): the tokenisation pool's processes are
    forked from one whose Rust tokenizer already ran threads (the tokenizer's training), and `tokenizers` would
    otherwise print a warning from each of them as it turns its threads off there."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def data_files(data_args: DataArguments) -> dict[str, PairFiles]:
    """The files of the training and validation pairs, by split ("train", "validation"; none for a --dataset)."""
    languages = dict(source_lang=data_args.source_lang, target_lang=data_args.target_lang)
    files = {}
    for split, one_file, source, target in (
            ("train", data_args.train_file, data_args.train_source, data_args.train_target),
            ("validation", data_args.validation_file, data_args.valid_source, data_args.valid_target)):
        if one_file is not None:
            files[split] = PairFiles(file=Path(one_file), **languages)
        elif source is not None:
            files[split] = PairFiles(source=Path(source), target=Path(target))
    return files


def scan_data_files(data_args: DataArguments) -> tuple[dict, dict[str, str]]:
    """Read every data file once (`PairFiles.scan`: encoding, alignment, format, content hash) before anything
    else: (the scans by split, for `load_data`; the content hashes by flag, for the run manifest)."""
    scans = {split: files.scan() for split, files in data_files(data_args).items()}
    hashes = {path.resolve(): scan.sha256 for split_scans in scans.values() for path, scan in split_scans.items()}
    by_flag = {name: hashes[Path(getattr(data_args, name)).resolve()]
               for name in ("train_source", "train_target", "valid_source", "valid_target", "train_file",
                            "validation_file") if getattr(data_args, name) is not None}
    if "validation" in scans and sorted(scan.sha256 for scan in scans["validation"].values()) == sorted(
            scan.sha256 for scan in scans["train"].values()):
        logger.warning("the validation data is the training data: its loss (and BLEU) will measure memorisation, "
                       "and --load_best_model_at_end or early stopping will pick by it")
    return scans, by_flag


def load_data(data_args: DataArguments, scans: dict, seed: int = 0) -> tuple[Dataset | PairsOnDisk, Dataset, dict]:
    """Training pairs (`PairsOnDisk` for files, read again from them when tokenised; a Dataset of `source` and
    `target` columns for a --dataset or a --sample_train_pairs sample) and validation pairs (a Dataset), and the
    training pairs' counts for train_results.json: `train_pairs_read`, `train_pairs_skipped_empty` (blank on either
    side) and `train_pairs_held_out` (the last 5% held out for validation when no validation data is given).
    `scans` are `scan_data_files`'; `seed` draws the --sample_train_pairs sample."""
    from datasets import Dataset

    sample_seed = seed if data_args.sample_train_pairs else None
    if data_args.dataset is not None:
        max_valid_pairs = data_args.max_valid_pairs
        if data_args.streaming and max_valid_pairs is None:
            max_valid_pairs = 1000
        train, valid = (
            load_hub_translation_dataset(data_args.dataset, data_args.dataset_config, data_args.source_lang,
                                         data_args.target_lang, split, max_pairs, data_args.streaming,
                                         data_args.dataset_revision, split_seed)
            for split, max_pairs, split_seed in ((data_args.train_split, data_args.max_train_pairs, sample_seed),
                                                 (data_args.valid_split, max_valid_pairs, None))
        )
        if data_args.streaming:  # evaluated again and again: read it once
            valid = Dataset.from_list(list(valid))
        counts = {"train_pairs_read": None if data_args.streaming else len(train), "train_pairs_skipped_empty": 0,
                  "train_pairs_held_out": 0}
        return train, valid, counts
    files = data_files(data_args)
    first_pairs = data_args.max_train_pairs if sample_seed is None else None  # a sample is drawn from them all
    train = pairs_on_disk(files["train"], scans["train"], first_pairs, skip_empty=True)
    counts = {"train_pairs_read": train.read, "train_pairs_skipped_empty": train.skipped_empty}
    _refuse_no_pairs(files["train"], train, "to train on", "give a corpus of sentence pairs")
    pairs = train.dataset if sample_seed is None else train.dataset.sample(data_args.max_train_pairs, sample_seed)
    if "validation" not in files:
        if len(pairs) == 1:  # held out, it would leave nothing to train on
            raise ValueError(f"{_names(files['train'])}: one sentence pair and no validation data; "
                             "without --valid_source/--valid_target (--validation_file) the last 5% of the pairs, "
                             "at least one, are held out for validation: give validation files, or more pairs")
        # hold out the last 5% (at least one pair) of the training text
        kept_pairs = len(pairs) - max(1, len(pairs) // 20)
        if isinstance(pairs, PairsOnDisk):
            kept, held_out = pairs.split(kept_pairs)
            held_out = held_out.to_dataset()
        else:  # a --sample_train_pairs sample
            kept, held_out = pairs.select(range(kept_pairs)), pairs.select(range(kept_pairs, len(pairs)))
        return kept, held_out, {**counts, "train_pairs_held_out": len(held_out)}
    valid = read_pairs(files["validation"], scans["validation"], data_args.max_valid_pairs, skip_empty=True)
    _refuse_no_pairs(files["validation"], valid, "to validate on",
                     "give validation files of sentence pairs, or none: then the last 5% of the training pairs are "
                     "held out for validation")
    return pairs, valid.dataset, {**counts, "train_pairs_held_out": 0}


def _refuse_no_pairs(files: PairFiles, pairs: PairsRead, purpose: str, remedy: str) -> None:
    """A split of no usable pair (empty files, or every pair with a blank side) is refused, naming its files."""
    if len(pairs.dataset) == 0:
        blank = f" ({pairs.skipped_empty} with a blank side, skipped)" if pairs.skipped_empty else ""
        raise ValueError(f"{_names(files)}: no sentence pair {purpose}: {pairs.read} line(s) read{blank}; {remedy}")


def _names(files: PairFiles) -> str:
    return " / ".join(map(str, files.paths))


def corpus_texts(dataset: Dataset | PairsOnDisk, progress: str | None = None):
    """Every source sentence, then every target sentence, read in slices (not all at once); with `progress`, a
    progress bar of that name (sentences read, with ETA) while they are read."""
    from ..progress import Progress

    with Progress(total=2 * len(dataset), desc=progress, unit=" sentences", unit_scale=True,
              disable=progress is None) as bar:
        for side, column in enumerate(("source", "target")):
            if isinstance(dataset, PairsOnDisk):
                for number, pair in enumerate(dataset.pairs(), start=1):
                    yield pair[side]
                    if number % 10_000 == 0:
                        bar.update(10_000)
                bar.update(len(dataset) % 10_000)
                continue
            for batch in dataset.iter(batch_size=10_000):
                yield from batch[column]
                bar.update(len(batch[column]))


def pair_columns(dataset: Dataset | PairsOnDisk) -> tuple[list[str], list[str]]:
    """Every source and every target sentence, as lists."""
    return dataset.columns() if isinstance(dataset, PairsOnDisk) else (dataset["source"], dataset["target"])


@contextlib.contextmanager
def datasets_progress_bar():
    """datasets' progress bars on inside the block (a command's own step, such as tokenising, that takes long
    enough to want one), as they were after it, and following the package's progress rule (`progress.Progress`:
    plain lines where standard error is no terminal). datasets takes no class for its bars, so `Dataset.map`'s is
    swapped for the block's time."""
    import datasets
    from datasets import arrow_dataset

    from ..progress import Progress

    class DatasetsProgress(Progress, arrow_dataset.hf_tqdm):  # datasets' own switch (disable_progress_bars) kept
        pass

    disabled = not datasets.is_progress_bar_enabled()
    datasets.enable_progress_bars()
    own_bar, arrow_dataset.hf_tqdm = arrow_dataset.hf_tqdm, DatasetsProgress
    try:
        yield
    finally:
        arrow_dataset.hf_tqdm = own_bar
        if disabled:
            datasets.disable_progress_bars()
