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
from collections.abc import Sequence
from pathlib import Path

from .cli import FLAG_SPELLING
from .loading import DEVICES, resolve_device
from .metrics import DEFAULT_LENGTH_BUCKETS, DROP_ALIGNMENT_RUNS, check_length_buckets
from .output_files import write_text
from .translation.batches import AUTO_BATCH_SIZE

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


def evaluate_model(
    model_dir: str | Path,
    source_path: str | Path,
    reference_path: str | Path,
    *,
    num_beams: int = 4,
    batch_size: int | str = AUTO_BATCH_SIZE,
    device: str = "auto",
    train_source: str | Path | None = None,
    train_target: str | Path | None = None,
    output_dir: str | Path,
    max_length: int | None = None,
    buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    tokenize: str = "13a",
    test_name: str | None = None,
    drop_runs: int = DROP_ALIGNMENT_RUNS,
    drop_cache_dir: str | Path | None = None,
    coverage_penalty: float = 0.0,
    length_penalty: float | None = None,
    early_stopping: bool | str | None = None,
    tokenizer: str | Path | None = None,
    force: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Translate a test set with a saved model folder and score it; write the hypotheses and the metrics JSON.

    Args:
        model_dir: A folder written by ``save_pretrained`` / the training command (weights, config with
            ``auto_map``, code files, tokenizer), loaded through its own code with ``trust_remote_code=True``; or a
            CTranslate2 export (``hf-headattn-export``), recognised by its files and translated with CTranslate2
            (``device`` as for a model; ``coverage_penalty`` and ``tokenizer`` refused).
        source_path, reference_path: Line-aligned test files (one sentence a line).
        num_beams, batch_size: Beam size, and sentences a batch: a positive int, or ``"auto"`` (the default) for
            :func:`hf_headattn.translation.translate`'s (640 decoder rows on the fast path, at least 128 sentences;
            32 through `generate` on a CPU, 128 on a GPU; 128 for an export). The JSON records the number used.
        device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        train_source, train_target: The aligner's training corpus (both or neither). DROP is computed only with
            it: eflomal trained on these pairs (once per corpus, then read from the cache), `drop_runs` alignments
            of the test pairs pooled, their spread in the JSON (``metric_settings.drop_alignment``); see
            :func:`hf_headattn.metrics.drop_alignment_runs`. The same test set, hypotheses and corpus give the same
            DROP on every call (the alignments are cached too).
        drop_runs, drop_cache_dir: eflomal runs pooled into DROP, and the cache folder (default
            :func:`hf_headattn.metrics.default_cache_dir`).
        output_dir: Where ``<test>.<decoding>.hyp<reference suffix>`` and ``<test>.<decoding>.metrics.json`` are
            written (created); ``<decoding>`` is :func:`decoding_name` (``greedy``, ``beam4``, ``beam4-maxlen64``),
            so greedy and beam runs of one test set can share a folder.
        max_length: Overrides the folder's ``generation_config.max_length`` (tokens, counting the start token).
        coverage_penalty: beta of Wu et al.'s coverage penalty, which re-ranks the beam (LSTM models only, with
            ``num_beams >= 2``; Malaviya et al.'s COVPENALTY baseline); 0 decodes without it.
        length_penalty: Overrides the folder's ``generation_config.length_penalty``: beam hypotheses are ranked by
            log-probability / length ** length_penalty (Transformers' default 1.0; 0 ranks by the log-probability
            alone, as OpenNMT-py's translate did by default with ``-alpha 0``; with ``num_beams >= 2``). None keeps
            the folder's.
        early_stopping: Overrides the folder's ``generation_config.early_stopping``: True ends a sentence's beam
            search once it has `num_beams` finished hypotheses (fairseq's and CTranslate2's rule), False
            (Transformers' default) once no running beam is likely to overtake them, ``"never"`` once none can (with
            ``num_beams >= 2``; an export takes True only). None keeps the folder's.
        buckets: Source-length bucket boundaries of BLEU by length (:func:`hf_headattn.metrics.bleu_by_length`).
        tokenize: Word tokenisation of REP and DROP: ``"13a"`` (the default; sacrebleu's tokenizer splits
            punctuation off words, as the raw test text needs) or ``"whitespace"``.
        test_name: Name of the test set in file names and the JSON (a plain file name); default: the source file
            name without its language suffix (``test_2016_flickr.de`` -> ``test_2016_flickr``).
        tokenizer: Another tokenizer folder than the model folder's own; refused unless it is the tokenizer the model
            was trained with (see :func:`hf_headattn.loading.check_tokenizer`), or warned about with `force`.
        force: Only warn about such a tokenizer, and about a folder whose saved code is not the installed runtime
            (refused otherwise, naming the files: the scores would be of other code than the folder's users run).
        overwrite: Replace an earlier result of this test set name and decoding in `output_dir` (refused
            otherwise: it may be another test set of the same file name).
        progress: Show the translation's progress on standard error (`progress.Progress`: a bar on a terminal,
            plain lines with rate and ETA elsewhere).

    Returns:
        The dict written to the JSON: ``bleu``, ``chrf``, ``ter``, ``rep``, ``drop`` (None without a training
        corpus), ``bleu_by_length``, and ``model``, ``test_set``, ``decoding``, ``metric_settings``, ``examples``,
        ``files``.

    Raises:
        FileNotFoundError: a missing model folder, config.json or text file.
        FileExistsError: an earlier result under the same file names, without `overwrite`.
        ValueError: mismatched line counts, an empty test set, only one of train_source/train_target, a bad
            device or setting, a tokenizer the model was not trained with.

    Every argument is checked, and every file read, before the model translates.
    """
    model_dir, source_path, reference_path = Path(model_dir), Path(source_path), Path(reference_path)
    _check_model_dir(model_dir)
    _check_settings(num_beams=num_beams, batch_size=batch_size, drop_runs=drop_runs, max_length=max_length,
                    coverage_penalty=coverage_penalty, length_penalty=length_penalty, early_stopping=early_stopping,
                    tokenize=tokenize, train_source=train_source, train_target=train_target)
    buckets = check_length_buckets(buckets)
    export = _check_model_options(model_dir, device, coverage_penalty=coverage_penalty, tokenizer=tokenizer,
                                  early_stopping=early_stopping, num_beams=num_beams)
    test_name = test_name if test_name is not None else _test_set_name(source_path)
    decoding = decoding_name(num_beams, max_length, coverage_penalty, length_penalty, early_stopping)
    hypotheses_path, metrics_path = _output_paths(Path(output_dir), test_name, decoding, reference_path, overwrite)
    from .metrics import all_metrics
    from .parallel_data import read_parallel_files

    # Read (and check) every file before the model loads, so that a typo fails in a second, not after loading.
    test = read_parallel_files(source_path, reference_path)
    if len(test) == 0:
        raise ValueError(f"The test set is empty: {source_path} has no lines")
    train = read_parallel_files(train_source, train_target) if train_source is not None else None

    sources, references = list(test["source"]), list(test["target"])
    hypotheses, model_record, decoding_record = _translate_test_set(
        model_dir, sources, num_beams=num_beams, batch_size=batch_size, device=device, max_length=max_length,
        coverage_penalty=coverage_penalty, length_penalty=length_penalty, early_stopping=early_stopping,
        tokenizer=tokenizer, force=force, progress=progress, export=export,
        desc=f"translating {source_path.name}")
    # One hypothesis per line: a decoded line end ("\r" ends one too) would shift every later line of the file.
    hypotheses = [hypothesis.replace("\r", " ").replace("\n", " ") for hypothesis in hypotheses]

    metrics = all_metrics(
        sources,
        hypotheses,
        references,
        train_sources=list(train["source"]) if train is not None else None,
        train_targets=list(train["target"]) if train is not None else None,
        buckets=buckets,
        tokenize=tokenize,
        **({"runs": drop_runs, "cache_dir": drop_cache_dir} if train is not None else {}),
    )
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    results = {
        "bleu": metrics["bleu"],
        "chrf": metrics["chrf"],
        "ter": metrics["ter"],
        "rep": metrics["rep"],
        "drop": metrics.get("drop"),
        "bleu_by_length": metrics["bleu_by_length"],
        "model": model_record,
        "test_set": {
            "name": test_name,
            "source": str(source_path.resolve()),
            "reference": str(reference_path.resolve()),
            "sentences": len(sources),
        },
        "decoding": {
            "name": decoding,
            "num_beams": num_beams,
            "coverage_penalty": coverage_penalty,
            "batch_size": batch_size,
            **decoding_record,
        },
        "metric_settings": {
            **_sacrebleu_signatures(),
            "rep_drop_tokenize": tokenize,
            "drop_aligner_training_pairs": len(train) if train is not None else None,
            "drop_alignment": metrics.get("drop_alignment"),
            "length_buckets": list(buckets),
        },
        "examples": [
            {"source": source, "reference": reference, "hypothesis": hypothesis}
            for source, reference, hypothesis in list(zip(sources, references, hypotheses))[:EXAMPLES_IN_RESULTS]
        ],
        "files": {"hypotheses": str(hypotheses_path.resolve()), "metrics": str(metrics_path.resolve())},
    }
    write_text(hypotheses_path, "".join(hypothesis + "\n" for hypothesis in hypotheses))
    write_text(metrics_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return results


def _check_settings(*, num_beams, batch_size, drop_runs, max_length, coverage_penalty, length_penalty,
                    early_stopping, tokenize, train_source, train_target) -> None:
    """Refuse (ValueError) the settings of :func:`evaluate_model` that are out of range, naming each."""
    _check_positive_int("num_beams", num_beams)
    if batch_size != AUTO_BATCH_SIZE and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                         or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or {AUTO_BATCH_SIZE!r}, got {batch_size!r}")
    _check_positive_int("drop_runs", drop_runs)
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
    if tokenize not in TOKENIZE_CHOICES:
        raise ValueError(f"Unknown tokenize={tokenize!r}; accepted: {', '.join(TOKENIZE_CHOICES)}")
    if (train_source is None) != (train_target is None):
        raise ValueError("Pass both train_source and train_target (the DROP aligner's training corpus), or neither")


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


def _translate_test_set(model_dir: Path, sources: list[str], *, num_beams, batch_size, device, max_length,
                        coverage_penalty, length_penalty, early_stopping, tokenizer, force, export, desc,
                        progress) -> tuple[list[str], dict, dict]:
    """(hypotheses, the JSON's "model", the JSON's "decoding" batch size, device, max_length, ranking and time) of a
    saved model or an export, through its translator (the fast path where hf-headattn-translate's --decoding auto
    takes it)."""
    from .translation import OptionRefused, load_translator

    if not export:
        refuse_other_code(model_dir, force)
    # a local folder (checked by evaluate_model): its code may run
    translator = load_translator(model_dir, device=device, tokenizer=tokenizer, force=force)
    options = {"num_beams": num_beams, "max_length": max_length, "coverage_penalty": coverage_penalty or None,
               "length_penalty": length_penalty, "early_stopping": early_stopping, "fast": translator.fast()}
    batch_size = translator.batch_size(batch_size, **options)
    started = time.perf_counter()
    try:
        translations = translator.translate(sources, batch_size=batch_size, desc=desc, progress=progress, **options)
    except OptionRefused as error:
        raise error.spelled(FLAG_SPELLING) from None
    seconds = time.perf_counter() - started
    # how beam search ranked and stopped: the overrides, else the folder's, else the search's defaults
    return [translation.text for translation in translations], translator.describe(), {
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
