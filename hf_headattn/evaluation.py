r"""Evaluate a saved translation model on a test set: hypotheses file + JSON of every metric.

    hf-headattn-evaluate --model runs/de-en \
        --source ../shared/data/multi30k/test_2016_flickr.de --reference ../shared/data/multi30k/test_2016_flickr.en \
        --train_source ../shared/data/multi30k/train.de --train_target ../shared/data/multi30k/train.en \
        --output_dir runs/de-en/eval [--num_beams 4] [--batch_size 32] [--device auto] [--json]

Any saved folder of either model family works: it is loaded through its own code
(``AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)``, via :mod:`hf_headattn.loading`: only
local folders are accepted, so no Hub repository's code runs), exactly as a user of the
uploaded model would load it, and translates through its translator
(:func:`hf_headattn.translation.load_translator`), as a CTranslate2 export (``hf-headattn-export``) does, decoded by
CTranslate2 into the same files. The metrics are those of
:mod:`hf_headattn.metrics` (``all_metrics``): BLEU, chrF, TER, REP, DROP (only with the aligner's training corpus,
``--train_source/--train_target``) and BLEU by source length. The JSON also records what was evaluated and how (model type, parameters, decoding settings, test set,
sacrebleu signatures), so that :func:`hf_headattn.publish.write_model_card` and
:func:`hf_headattn.plotting.plot_bleu_by_length` need nothing else.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .cli import FLAG_SPELLING
from .loading import DEVICES, resolve_device
from .metrics import DEFAULT_LENGTH_BUCKETS, DROP_ALIGNMENT_RUNS, check_length_buckets
from .output_files import write_text
from .translation.batches import AUTO_BATCH_SIZE

if typing.TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

# torch, the models and the training helpers are imported where they are used, so that `--help` is instant.


__all__ = ["DEVICES", "EXAMPLES_IN_RESULTS", "decoding_name", "evaluate_model", "non_finite_field",
           "read_metrics_json", "resolve_device", "translate_and_score"]

EXAMPLES_IN_RESULTS = 3  # the first test sentences, kept in the JSON as worked examples (the model card shows one)
TOKENIZE_CHOICES = ("13a", "whitespace")


def _check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model folder not found: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a saved model folder: it has no config.json (a CTranslate2 "
                                "export has one too, beside its model.bin)")


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def decoding_name(num_beams: int, max_length: int | None = None, coverage_penalty: float = 0.0,
                  length_penalty: float | None = None, early_stopping: bool | str | None = None) -> str:
    """The decoding settings as they appear in output file names, so that runs with different settings never
    overwrite each other: ``"greedy"`` or ``"beam4"``, plus ``"-cp0.4"`` with a coverage penalty, ``"-lp0"`` when
    `length_penalty` overrides the folder's generation config, ``"-estrue"`` (``-esfalse``, ``-esnever``) when
    `early_stopping` does, and ``"-maxlen64"`` when `max_length` does."""
    name = "greedy" if num_beams == 1 else f"beam{num_beams}"
    if coverage_penalty:
        name += f"-cp{coverage_penalty:g}"
    if length_penalty is not None:
        name += f"-lp{length_penalty:g}"
    if early_stopping is not None:
        name += f"-es{str(early_stopping).lower()}"
    return name if max_length is None else f"{name}-maxlen{max_length}"


def _test_set_name(source_path: Path) -> str:
    """``test_2016_flickr.de`` -> ``test_2016_flickr``: the file name without its language suffix."""
    return source_path.stem if source_path.suffix else source_path.name


def _output_paths(output_dir: Path, test_name: str, decoding: str, reference_path: Path,
                  overwrite: bool) -> tuple[Path, Path]:
    """The hypotheses and metrics files of this test set and decoding, checked writable before anything runs: a
    test name that is a plain file name, an output folder that is not a file, and no earlier result under these
    names unless `overwrite` (two test sets of one file name would otherwise overwrite each other's)."""
    if not test_name or test_name in (".", "..") or Path(test_name).name != test_name or "\\" in test_name:
        raise ValueError(f"test_name {test_name!r} must be a plain file name: its files go into output_dir, "
                         "not elsewhere")
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"output_dir {output_dir} is a file, not a folder")
    paths = (output_dir / f"{test_name}.{decoding}.hyp{reference_path.suffix}",
             output_dir / f"{test_name}.{decoding}.metrics.json")
    existing = [path for path in paths if path.exists()]
    if existing and not overwrite:
        recorded = _recorded_test_set(paths[1])
        raise FileExistsError(
            f"{', '.join(map(str, existing))} already hold{'s' * (len(existing) == 1)} a result"
            + (f" (of {recorded})" if recorded else "") + "; pass overwrite=True (--overwrite) to replace it, or "
            "test_name (--test_name) to name this test set apart")
    return paths


def _recorded_test_set(metrics_path: Path) -> str | None:
    try:
        return json.loads(metrics_path.read_text(encoding="utf-8"))["test_set"]["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sacrebleu_signatures() -> dict[str, str]:
    """The signatures of the BLEU, chrF and TER settings ``metrics.corpus_scores`` uses (sacrebleu's defaults, one
    reference). sacrebleu only builds a signature after scoring, hence the one-sentence corpus."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    signatures = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF()), ("ter", TER())):
        metric.corpus_score(["a"], [["a"]])
        signatures[name] = str(metric.get_signature())
    return signatures


@dataclass(frozen=True)
class _Decoding:
    """How :func:`evaluate_model` decodes, as given (``batch_size`` may be ``"auto"``)."""

    num_beams: int
    batch_size: int | str
    max_length: int | None
    coverage_penalty: float
    length_penalty: float | None
    early_stopping: bool | str | None

    @property
    def name(self) -> str:
        return decoding_name(self.num_beams, self.max_length, self.coverage_penalty, self.length_penalty,
                             self.early_stopping)

    def translator_options(self, fast: bool) -> dict:
        return {"num_beams": self.num_beams, "max_length": self.max_length,
                "coverage_penalty": self.coverage_penalty or None, "length_penalty": self.length_penalty,
                "early_stopping": self.early_stopping, "fast": fast}


@dataclass(frozen=True)
class _Scoring:
    """How :func:`evaluate_model` scores: BLEU by length's buckets, REP's and DROP's word tokenisation, and DROP's
    aligner (its training corpus, None for no DROP; its runs and cache)."""

    buckets: Sequence[int]
    tokenize: str
    train_source: str | Path | None
    train_target: str | Path | None
    drop_runs: int
    drop_cache_dir: str | Path | None


@dataclass(frozen=True)
class _TestSet:
    name: str
    source_path: Path
    reference_path: Path
    sources: list[str]
    references: list[str]

    def record(self) -> dict:
        return {"name": self.name, "source": str(self.source_path.resolve()),
                "reference": str(self.reference_path.resolve()), "sentences": len(self.sources)}


def evaluate_model(
    model_dir: str | Path, source_path: str | Path, reference_path: str | Path, *,
    num_beams: int = 4, batch_size: int | str = AUTO_BATCH_SIZE, device: str = "auto",
    train_source: str | Path | None = None, train_target: str | Path | None = None, output_dir: str | Path,
    max_length: int | None = None, buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS, tokenize: str = "13a",
    test_name: str | None = None, drop_runs: int = DROP_ALIGNMENT_RUNS, drop_cache_dir: str | Path | None = None,
    coverage_penalty: float = 0.0, length_penalty: float | None = None, early_stopping: bool | str | None = None,
    tokenizer: str | Path | None = None, force: bool = False, overwrite: bool = False, progress: bool = True,
) -> dict:
    """Translate a test set with a saved model folder and score it; write the hypotheses and the metrics JSON.

    Args:
        model_dir: A folder written by ``save_pretrained`` / the training command, loaded through its own code
            (``trust_remote_code=True``); or a CTranslate2 export (``hf-headattn-export``), recognised by its files
            and translated with CTranslate2 (``coverage_penalty`` and ``tokenizer`` refused).
        source_path, reference_path: Line-aligned test files (one sentence a line).
        num_beams, batch_size: Beam size, and sentences a batch: a positive int, or ``"auto"`` (the default) for
            :func:`hf_headattn.translation.translate`'s. The JSON records the number used.
        device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        train_source, train_target, drop_runs, drop_cache_dir: The aligner's training corpus (both or neither; no
            DROP without it): eflomal trained on it once, then cached in `drop_cache_dir` (default
            :func:`hf_headattn.metrics.default_cache_dir`), `drop_runs` alignments of the test pairs pooled
            (:func:`hf_headattn.metrics.drop_alignment_runs`), their spread in ``metric_settings.drop_alignment``.
            The same test set, hypotheses and corpus give the same DROP on every call.
        output_dir: Where ``<test>.<decoding>.hyp<reference suffix>`` and ``<test>.<decoding>.metrics.json`` are
            written (created); ``<decoding>`` is :func:`decoding_name` (``greedy``, ``beam4``, ``beam4-maxlen64``).
        max_length: Overrides the folder's ``generation_config.max_length`` (tokens, counting the start token).
        coverage_penalty: beta of Wu et al.'s coverage penalty, which re-ranks the beam (LSTM models only, with
            ``num_beams >= 2``; Malaviya et al.'s COVPENALTY baseline); 0 decodes without it.
        length_penalty, early_stopping: Override the folder's generation config (with ``num_beams >= 2``; None
            keeps the folder's). Hypotheses rank by log-probability / length ** length_penalty (0: by the
            log-probability alone, OpenNMT-py's ``-alpha 0``). A sentence's search ends once it has `num_beams`
            finished hypotheses (True: fairseq's and CTranslate2's rule, the only one an export takes), once no
            running beam is likely to overtake them (False, Transformers' default), or once none can (``"never"``).
        buckets: Source-length bucket boundaries of BLEU by length (:func:`hf_headattn.metrics.bleu_by_length`).
        tokenize: Word tokenisation of REP and DROP: ``"13a"`` (sacrebleu's tokenizer splits punctuation off
            words, as the raw test text needs) or ``"whitespace"``.
        test_name: Name of the test set in file names and the JSON (a plain file name); default: the source file
            name without its language suffix (``test_2016_flickr.de`` -> ``test_2016_flickr``).
        tokenizer: Another tokenizer folder than the model folder's own: refused unless the model was trained with
            it (:func:`hf_headattn.loading.check_tokenizer`), or warned about with `force`.
        force: Only warn about such a tokenizer, and about a folder whose saved code is not the installed runtime.
        overwrite: Replace an earlier result of this test set name and decoding (it may be another test set's).
        progress: Show the translation's progress on standard error (:class:`hf_headattn.progress.Progress`).

    Returns:
        The dict written to the JSON: ``bleu``, ``chrf``, ``ter``, ``rep``, ``drop`` (None without a training
        corpus), ``bleu_by_length``; ``model``, ``test_set``, ``decoding``, ``metric_settings``, ``examples``,
        ``files``.

    Raises:
        FileNotFoundError: a missing model folder, config.json or text file.
        FileExistsError: an earlier result under the same file names, without `overwrite`.
        ValueError: mismatched line counts, an empty test set, only one of train_source/train_target, a bad
            device or setting, a tokenizer the model was not trained with, other saved code without `force`.

    Every argument is checked, and every file read, before the model translates.
    """
    model_dir, source_path, reference_path = Path(model_dir), Path(source_path), Path(reference_path)
    decoding = _Decoding(num_beams, batch_size, max_length, coverage_penalty, length_penalty, early_stopping)
    _check_model_dir(model_dir)
    scoring = _check_settings(decoding, _Scoring(buckets, tokenize, train_source, train_target, drop_runs,
                                                 drop_cache_dir))
    export = _check_model_options(model_dir, device, coverage_penalty=coverage_penalty, tokenizer=tokenizer,
                                  early_stopping=early_stopping, num_beams=num_beams)
    test_name = test_name if test_name is not None else _test_set_name(source_path)
    output_paths = _output_paths(Path(output_dir), test_name, decoding.name, reference_path, overwrite)
    test, train = _read_test_and_train_sets(test_name, source_path, reference_path, scoring)

    hypotheses, model_record, decoding_record = _translate_test_set(
        model_dir, test.sources, decoding, device=device, tokenizer=tokenizer, force=force, progress=progress,
        export=export, desc=f"translating {source_path.name}")
    metrics = _score(test, hypotheses, train, scoring)
    results = _results_record(metrics, test, hypotheses, output_paths, model=model_record, decoding=decoding_record,
                              metric_settings=_metric_settings(metrics, train, scoring))
    _write_results(output_paths, hypotheses, results)
    return results


def _write_results(output_paths: tuple[Path, Path], hypotheses: list[str], results: dict) -> None:
    hypotheses_path, metrics_path = output_paths
    hypotheses_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(hypotheses_path, "".join(hypothesis + "\n" for hypothesis in hypotheses))
    write_text(metrics_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")


def _read_test_and_train_sets(test_name: str, source_path: Path, reference_path: Path,
                              scoring: _Scoring) -> tuple[_TestSet, Dataset | None]:
    """The test set (refused empty) and DROP's aligner corpus, read and checked before the model loads, so that a
    typo fails in a second, not after loading."""
    from .parallel_data import read_parallel_files

    test = read_parallel_files(source_path, reference_path)
    if len(test) == 0:
        raise ValueError(f"The test set is empty: {source_path} has no lines")
    train = (read_parallel_files(scoring.train_source, scoring.train_target)
             if scoring.train_source is not None else None)
    return _TestSet(test_name, source_path, reference_path, list(test["source"]), list(test["target"])), train


def _score(test: _TestSet, hypotheses: list[str], train: Dataset | None, scoring: _Scoring) -> dict:
    from .metrics import all_metrics

    return all_metrics(
        test.sources,
        hypotheses,
        test.references,
        train_sources=list(train["source"]) if train is not None else None,
        train_targets=list(train["target"]) if train is not None else None,
        buckets=scoring.buckets,
        tokenize=scoring.tokenize,
        **({"runs": scoring.drop_runs, "cache_dir": scoring.drop_cache_dir} if train is not None else {}),
    )


def _metric_settings(metrics: dict, train: Dataset | None, scoring: _Scoring) -> dict:
    """The JSON's "metric_settings": how each score was computed, so that a reader can compare like with like."""
    return {
        **_sacrebleu_signatures(),
        "rep_drop_tokenize": scoring.tokenize,
        "drop_aligner_training_pairs": len(train) if train is not None else None,
        "drop_alignment": metrics.get("drop_alignment"),
        "length_buckets": list(scoring.buckets),
    }


def _results_record(metrics: dict, test: _TestSet, hypotheses: list[str], output_paths: tuple[Path, Path], *,
                    model: dict, decoding: dict, metric_settings: dict) -> dict:
    """The metrics JSON: the scores, then what was evaluated and how, the first sentences, and the files."""
    hypotheses_path, metrics_path = output_paths
    return {
        "bleu": metrics["bleu"],
        "chrf": metrics["chrf"],
        "ter": metrics["ter"],
        "rep": metrics["rep"],
        "drop": metrics.get("drop"),
        "bleu_by_length": metrics["bleu_by_length"],
        "model": model,
        "test_set": test.record(),
        "decoding": decoding,
        "metric_settings": metric_settings,
        "examples": [
            {"source": source, "reference": reference, "hypothesis": hypothesis}
            for source, reference, hypothesis in
            list(zip(test.sources, test.references, hypotheses))[:EXAMPLES_IN_RESULTS]
        ],
        "files": {"hypotheses": str(hypotheses_path.resolve()), "metrics": str(metrics_path.resolve())},
    }


def _check_settings(decoding: _Decoding, scoring: _Scoring) -> _Scoring:
    """Refuse (ValueError) the settings of :func:`evaluate_model` that are out of range, naming each; `scoring` with
    its buckets as :func:`hf_headattn.metrics.check_length_buckets` returns them."""
    num_beams, batch_size, max_length = decoding.num_beams, decoding.batch_size, decoding.max_length
    coverage_penalty, length_penalty, early_stopping = (decoding.coverage_penalty, decoding.length_penalty,
                                                        decoding.early_stopping)
    _check_positive_int("num_beams", num_beams)
    if batch_size != AUTO_BATCH_SIZE and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                         or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or {AUTO_BATCH_SIZE!r}, got {batch_size!r}")
    _check_positive_int("drop_runs", scoring.drop_runs)
    if max_length is not None:
        _check_positive_int("max_length", max_length)
    if (isinstance(coverage_penalty, bool) or not isinstance(coverage_penalty, (int, float))
            or not math.isfinite(coverage_penalty) or coverage_penalty < 0):
        raise ValueError(f"coverage_penalty must be a finite number >= 0, got {coverage_penalty!r}")
    if coverage_penalty and num_beams < 2:
        raise ValueError(f"the coverage penalty re-ranks beam hypotheses: use num_beams >= 2, got {num_beams}")
    if length_penalty is not None and (isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float))
                                       or not math.isfinite(length_penalty)):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if length_penalty is not None and num_beams < 2:
        raise ValueError(f"the length penalty ranks beam hypotheses: use num_beams >= 2, got {num_beams}")
    if early_stopping is not None and not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if early_stopping is not None and num_beams < 2:
        raise ValueError(f"early_stopping ends beam search: use num_beams >= 2, got {num_beams}")
    if scoring.tokenize not in TOKENIZE_CHOICES:
        raise ValueError(f"Unknown tokenize={scoring.tokenize!r}; accepted: {', '.join(TOKENIZE_CHOICES)}")
    if (scoring.train_source is None) != (scoring.train_target is None):
        raise ValueError("Pass both train_source and train_target (the DROP aligner's training corpus), or neither")
    return replace(scoring, buckets=check_length_buckets(scoring.buckets))


def _check_model_options(model_dir: Path, device: str, **options) -> bool:
    """Whether `model_dir` is a CTranslate2 export, its device and `options` checked before anything is read: what
    an export cannot honour (worded with the command's flags), the device (one ctranslate2 sees, for an export)."""
    from .translation import OptionRefused, check_options
    from .translation.ctranslate2_backend import ctranslate2_device, find_export

    try:
        check_options(model_dir, **options)
    except OptionRefused as error:
        raise error.spelled(FLAG_SPELLING) from None
    if find_export(model_dir) is None:
        resolve_device(device)
        return False
    ctranslate2_device(device)
    return True


def refuse_other_code(model_dir: Path, force: bool) -> None:
    """Refuse (ValueError) a folder whose saved code differs from the installed runtime, naming the files, or with
    `force` warn: this package's model types load with the installed runtime (`auto_classes`), so the scores would be
    the installed code's while a user of the folder, loading it with `trust_remote_code`, runs the folder's own."""
    from importlib.metadata import version

    from .loading import code_differences

    differing = code_differences(model_dir)
    if not differing:
        return
    message = (f"{model_dir}'s saved code differs from the installed hf_headattn {version('hf_headattn')}'s runtime "
               f"in {', '.join(differing)}: a user of the folder runs its own code, and this evaluation would score "
               "the installed package's instead")
    if not force:
        raise ValueError(f"{message}; evaluate with the hf_headattn version that saved the folder, or pass --force "
                         "to score the installed code")
    logger.warning(f"{message}; scoring the installed code (--force)")


def _translate_test_set(model_dir: Path, sources: list[str], decoding: _Decoding, *, device, tokenizer, force,
                        export, desc, progress) -> tuple[list[str], dict, dict]:
    """(hypotheses, the JSON's "model", the JSON's "decoding": the settings, the batch size used, device,
    max_length, ranking and time) of a saved model or an export, through its translator (the fast path where
    hf-headattn-translate's --decoding auto takes it)."""
    from .translation import OptionRefused, load_translator

    if not export:
        refuse_other_code(model_dir, force)
    # a local folder (checked by evaluate_model): its code may run
    translator = load_translator(model_dir, device=device, tokenizer=tokenizer, force=force)
    options = decoding.translator_options(fast=translator.fast())
    batch_size = translator.batch_size(decoding.batch_size, **options)
    started = time.perf_counter()
    try:
        translations = translator.translate(sources, batch_size=batch_size, desc=desc, progress=progress, **options)
    except OptionRefused as error:
        raise error.spelled(FLAG_SPELLING) from None
    seconds = time.perf_counter() - started
    # One hypothesis per line: a decoded line end ("\r" ends one too) would shift every later line of the file.
    hypotheses = [translation.text.replace("\r", " ").replace("\n", " ") for translation in translations]
    # how beam search ranked and stopped: the overrides, else the folder's, else the search's defaults
    return hypotheses, translator.describe(), {
        "name": decoding.name, "num_beams": decoding.num_beams, "coverage_penalty": decoding.coverage_penalty,
        "batch_size": batch_size, **translator.settings(**options), "translation_seconds": seconds}


def read_metrics_json(path: str | Path, what: str = "Metrics JSON"):
    """A metrics JSON (``evaluate_model``'s, or an example script's results file) as the tools that read one (model
    cards, plots) need it: valid JSON whose every number is finite.

    Raises:
        FileNotFoundError: ``"{what} not found: PATH"``.
        ValueError: text that is not UTF-8 or not JSON (naming the file, line, column and character), or a NaN or
            infinite number (naming its field, e.g. ``bleu_by_length.10-19.bleu``): no score of a card or a plot
            may be a number that was not measured.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    data = path.read_bytes()
    try:
        results = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 (byte 0x{data[error.start]:02x} at byte {error.start + 1}); a metrics "
                         "JSON is UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno} column {error.colno} (character {error.pos + 1}): not JSON "
                         f"({error.msg}); write it with hf-headattn-evaluate") from None
    field = non_finite_field(results)
    if field is not None:
        raise ValueError(f"{path}: {field[0]} is {field[1]}, not a finite number; a score that was not measured is "
                         "null (evaluate the model again with hf-headattn-evaluate)")
    return results


def non_finite_field(value, name: str = "") -> tuple[str, float] | None:
    """(dotted name, value) of the first NaN or infinite number in a JSON-like `value` (lists count from 0), or
    None."""
    if isinstance(value, float) and not math.isfinite(value):
        return name or "the value", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_field(item, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


def translate_and_score(model_dir: str | Path, source_path: str | Path, reference_path: str | Path,
                        num_beams: int = 4, batch_size: int | str = AUTO_BATCH_SIZE) -> dict:
    """Translate a test file with a saved model folder (loaded through its own code) and score it with sacrebleu:
    ``{"bleu", "chrf", "sentences", "hypotheses"}``."""
    from .loading import load_model_and_tokenizer
    from .metrics import score_translations
    from .parallel_data import read_parallel_files
    from .translation import translate_sentences

    test = read_parallel_files(source_path, reference_path)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    hypotheses = translate_sentences(model, tokenizer, list(test["source"]), num_beams, batch_size,
                                     desc=f"translating {Path(source_path).name}")
    return {**score_translations(hypotheses, test["target"]), "sentences": len(hypotheses), "hypotheses": hypotheses}
