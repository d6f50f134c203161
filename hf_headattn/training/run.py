"""The training run: a model trained with `HeadAttnSeq2SeqTrainer` on the data and with the arguments the command
line gives, saved as a folder that loads anywhere through trust_remote_code (model, tokenizer, code, pipeline).

`train(argv)` is the command from Python (its arguments are the command line's words); `run_training` runs on
arguments already parsed and checked (`arguments.parse_args`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import Seq2SeqTrainingArguments

from ..output_files import replace_folder, sibling, write_record, written_by
from ..runtime.configuration_headattn_rnn import HeadAttnRNNConfig
from ..saved_files import write_failure
from ..tokenization import load_tokenizer, tokenizer_fingerprint
from .arguments import DataArguments, ModelArguments, RunArguments, build_config, data_seed, parse_args
from .checkpoints import check_checkpoint_config, checkpoint_folders, find_checkpoint, last_complete_checkpoint
from .data import load_data, pair_columns, scan_data_files, tokenize_splits, train_corpus_tokenizer
from .data_prefetch import DataPrefetch
from .recipe import data_recipe
from .guided_links import GuidedAlignmentCollator, add_links_column, subword_links, training_word_links
from .run_folder import (TOKENIZER_SCRATCH, TRAIN_COMMAND, RunLock, RunRefused, carry_over, check_run_folder,
                         clean_leftovers)
from .run_manifest import build_manifest, check_resume

if TYPE_CHECKING:
    from .trainer import HeadAttnSeq2SeqTrainer

logger = logging.getLogger(__name__)


def train(argv=None) -> dict:
    """Run the training command (see `hf-headattn-train --help`) on the command line's words `argv` (default:
    sys.argv[1:]), or on one JSON/YAML file of arguments, and return its metrics, which also go to
    train_results.json."""
    return run_training(*parse_args(argv))


def run_training(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
                 training_args: Seq2SeqTrainingArguments, prefetch: DataPrefetch | None = None) -> dict:
    """Train on arguments as `arguments.parse_args` returns them (checked) and return the metrics.

    A run is a transaction on its --output_dir: it holds the folder's lock from start to end (`run_folder.RunLock`)
    and settles what it resumes under it; a resume must be the same run (`run_manifest`), checked before any data
    is read; an overwritten run's checkpoints are deleted only once the new run has read its data and trained its
    tokenizer; the finished model replaces the folder whole (`save_finished_model`). What must stop a run is raised
    as `run_folder.RunRefused`. `prefetch`: the data preparation the command started before its imports
    (`data_prefetch`), whose tokenizer and token ids the run takes if they were made from these arguments."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logger.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    output_dir = Path(training_args.output_dir)
    main_process = training_args.process_index == 0
    with RunLock(output_dir) if main_process else contextlib.nullcontext():
        with training_args.main_process_first(desc="run folder"):
            if main_process:
                clean_leftovers(output_dir)
                check_run_folder(output_dir)
            try:  # settled under the lock: the folder may have changed since the flags were checked
                training_args.resume_from_checkpoint = find_checkpoint(run_args, training_args)
            except ValueError as error:
                raise RunRefused(str(error)) from None
        return _train(model_args, data_args, run_args, training_args, prefetch or DataPrefetch())


def _train(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
           training_args: Seq2SeqTrainingArguments, prefetch: DataPrefetch) -> dict:
    # after parsing: --help and a bad flag answer without these
    from transformers import set_seed

    from .. import auto_classes  # noqa: F401  (Auto classes know both families, as after `from hf_headattn import ...`)

    importlib.import_module(".trainer", __package__)  # `_build_trainer`'s, imported while the prefetch works

    output_dir, checkpoint = Path(training_args.output_dir), training_args.resume_from_checkpoint
    main_process = training_args.process_index == 0
    if checkpoint is not None:
        logger.info(f"resuming from {checkpoint} (--overwrite_output_dir starts over)")
        if run_args.reset_optimizer:
            logger.warning(f"--reset_optimizer: resuming {checkpoint} with a fresh optimizer and learning-rate "
                           "schedule (warmup again)")
    set_seed(training_args.seed)
    try:
        scans, file_sha256 = scan_data_files(data_args)
    except (ValueError, FileNotFoundError) as error:
        raise RunRefused(str(error)) from None

    def manifest(tokenizer) -> dict:
        return build_manifest(model_args, data_args, run_args, training_args,
                              tokenizer_sha256=tokenizer_fingerprint(tokenizer), file_sha256=file_sha256)

    tokenizer, config = _existing_tokenizer_and_config(model_args, data_args, checkpoint, manifest)
    train_text, valid_text, data_counts, word_links, links_record = _read_training_text(model_args, data_args,
                                                                                        training_args, scans)
    prepared = None
    if tokenizer is None:  # else the data prepared during start-up (if any) has the wrong tokenizer
        prepared = prefetch.take(data_recipe({**vars(model_args), **vars(data_args)}, file_sha256))
    prefetch.close()
    if prepared is not None:
        tokenizer, train_dataset, valid_dataset = prepared.tokenizer, prepared.train_dataset, prepared.valid_dataset
    else:
        if tokenizer is None:
            tokenizer = _train_tokenizer(model_args, data_args, training_args, train_text)
        with training_args.main_process_first(desc="tokenization"):  # the others read its cache
            train_dataset, valid_dataset = tokenize_splits(train_text, valid_text, tokenizer, data_args.max_length,
                                                           data_args.preprocessing_num_workers)
    if config is None:  # the trained tokenizer's size and special ids
        config = build_config(model_args, data_args, tokenizer)
    if run_args.overwrite_output_dir and main_process:  # only now that this run has its data and tokenizer
        for folder in checkpoint_folders(output_dir):
            shutil.rmtree(folder)
    if word_links is not None:
        train_dataset = _with_subword_links(train_dataset, tokenizer, train_text, word_links, data_args.max_length)
        del word_links
    model = _prepared_model(config, tokenizer, train_text, model_args, data_args, training_args,
                            fertility_trained=checkpoint is None)
    # The text is read. A --dataset's is memory-mapped Arrow whose pages, every one touched by the tokenizer's
    # training, would count in this process's memory for the whole run: let them go (files' pairs hold no text).
    del train_text, valid_text
    # where guided alignment's links came from: recorded, not compared on resuming (a Pharaoh file is compared by its
    # flag; eflomal's links of the same pairs come back from the cache)
    run_manifest = {**manifest(tokenizer), **({"guided_alignment": links_record} if links_record else {})}
    trainer = _build_trainer(model, tokenizer, train_dataset, valid_dataset, run_manifest, data_args, run_args,
                             training_args, guided=links_record is not None)
    if main_process and written_by(output_dir) is None:  # the folder is this run's from now on
        output_dir.mkdir(parents=True, exist_ok=True)
        write_record(output_dir, TRAIN_COMMAND)
    with long_lived_objects_frozen():
        metrics = dict(trainer.train(resume_from_checkpoint=checkpoint).metrics)
        if training_args.eval_strategy != "no":
            metrics.update(_final_evaluation(trainer))
        metrics.update(global_step=trainer.state.global_step, world_size=training_args.world_size,
                       train_pairs=None if data_args.streaming else len(train_dataset), **data_counts,
                       parameters=sum(parameter.numel() for parameter in model.parameters()))
        save_finished_model(trainer, output_dir, metrics, run_args.keep_checkpoints)
    return metrics


def _existing_tokenizer_and_config(model_args: ModelArguments, data_args: DataArguments, checkpoint: str | None,
                                   manifest):
    """A tokenizer that exists already (given, or the checkpoint's) and the config it settles, before any data is
    read, a resumed checkpoint checked to be this run's (`manifest`: the run's manifest with a tokenizer); else
    (None, None)."""
    if model_args.tokenizer is None and checkpoint is None:
        return None, None
    tokenizer = _load_tokenizer(model_args.tokenizer or checkpoint)
    config = build_config(model_args, data_args, tokenizer)
    if checkpoint is not None:  # a resume is the same run, or refused
        try:
            check_resume(checkpoint, manifest(tokenizer))
            check_checkpoint_config(config, checkpoint)
        except ValueError as error:
            raise RunRefused(str(error)) from None
    return tokenizer, config


def _read_training_text(model_args: ModelArguments, data_args: DataArguments,
                        training_args: Seq2SeqTrainingArguments, scans):
    """(train text, validation text, data counts, guided alignment's word links, their record): the links a
    Pharaoh file checked against the corpus (or eflomal's made) before training, (None, None) without
    --guided_alignment."""
    try:
        train_text, valid_text, data_counts = load_data(data_args, scans, data_seed(training_args))
        word_links, links_record = (training_word_links(model_args.guided_alignment, *pair_columns(train_text),
                                                        lambda: _training_file_pairs(data_args),
                                                        seed=training_args.seed)
                                    if model_args.guided_alignment is not None else (None, None))
    except ValueError as error:  # a TSV or JSON lines line that holds no pair, a bad link, named
        raise RunRefused(str(error)) from None
    return train_text, valid_text, data_counts, word_links, links_record


def _with_subword_links(train_dataset, tokenizer, train_text, word_links, max_length: int):
    """The tokenised training pairs with their guided-alignment links, from words to subwords."""
    try:
        return add_links_column(train_dataset, subword_links(tokenizer, *map(list, pair_columns(train_text)),
                                                             word_links, max_length))
    except ValueError as error:  # a slow tokenizer
        raise RunRefused(str(error)) from None


def _prepared_model(config, tokenizer, train_text, model_args: ModelArguments, data_args: DataArguments,
                    training_args: Seq2SeqTrainingArguments, fertility_trained: bool):
    """The model of `config`, its fertility prepared from the training text unless a checkpoint holds it
    (`fertility_trained` False), set up for generation and DDP."""
    model = build_model(config)
    if fertility_trained:
        prepare_fertility(model, tokenizer, train_text,
                          predictor_epochs=model_args.fertility_predictor_epochs, seed=training_args.seed)
    model.generation_config.max_length = data_args.max_length
    if training_args.ddp_find_unused_parameters is None:
        # Every parameter gets a gradient except the PREDICTED fertility tagger's (trained above, by its own loop),
        # so DDP's search for unused parameters is only needed with it; elsewhere it costs an extra traversal of
        # the graph and a warning the user can do nothing about.
        training_args.ddp_find_unused_parameters = any(
            "fertility_predictor" in name for name, _ in model.named_parameters())
    return model


def _build_trainer(model, tokenizer, train_dataset, valid_dataset, run_manifest: dict, data_args: DataArguments,
                   run_args: RunArguments, training_args: Seq2SeqTrainingArguments, guided: bool):
    """The Trainer of the run, its batches collated with guided alignment's links where `guided`."""
    from transformers import DataCollatorForSeq2Seq, EarlyStoppingCallback

    from .trainer import HeadAttnSeq2SeqTrainer, translation_metrics

    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    if guided:
        data_collator = GuidedAlignmentCollator(data_collator)
    return HeadAttnSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,
        data_collator=data_collator,
        processing_class=tokenizer,
        compute_metrics=translation_metrics(tokenizer) if training_args.predict_with_generate else None,
        callbacks=([EarlyStoppingCallback(run_args.early_stopping_patience)]
                   if run_args.early_stopping_patience is not None else None),
        max_tokens=data_args.max_tokens,
        bucket_pool_pairs=data_args.bucket_pool_pairs,
        run_manifest=run_manifest,
        reset_optimizer=run_args.reset_optimizer,
        lr_decay=(dict(factor=run_args.lr_decay_factor, start_decay_at=run_args.lr_decay_start_at)
                  if run_args.lr_decay == "opennmt" else None),
        loss_normalization=run_args.loss_normalization,
    )


@contextlib.contextmanager
def long_lived_objects_frozen():
    """The objects alive now (torch's and Transformers' modules, the model, the data: they live to the end of the
    run) kept out of Python's cyclic garbage collector inside the block (`gc.freeze`), after a collection of the
    young generations (cheap: it walks only them). Trainer has accelerate call `gc.collect()` as training starts
    (and again for each batch size --auto_find_batch_size tries), and Python runs full collections of its own as
    objects accumulate; each walks every object the collector tracks: ~440,000 once torch, Transformers and
    datasets are imported, 0.2 s on a 2-core Xeon. Frozen, they are skipped: in a tiny run on 29k pairs
    (examples/benchmark_data_prep.py's) the one full collection, as training starts, took 0.205 s without the
    freeze and nothing with it (`gc.collect` wrapped and timed, one run each). Unfrozen after the block, so that a
    caller's heap (`train` from Python) is collected as before, cycles made garbage during the run included."""
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _train_tokenizer(model_args: ModelArguments, data_args: DataArguments, training_args: Seq2SeqTrainingArguments,
                     train_text):
    """The tokenizer trained on `train_text` by the main process; the other processes load it from the scratch
    folder it saves to."""
    scratch = Path(training_args.output_dir) / TOKENIZER_SCRATCH
    with training_args.main_process_first(desc="tokenizer"):
        if training_args.process_index == 0:
            return train_corpus_tokenizer(train_text, model_args.vocab_size, model_args.tokenizer_model,
                                          data_args.max_length,
                                          save_directory=scratch if training_args.world_size > 1 else None)
        return load_tokenizer(scratch)


def save_finished_model(trainer: HeadAttnSeq2SeqTrainer, output_dir: Path, metrics: dict,
                        keep_checkpoints: bool) -> None:
    """Save the model, config, generation config, tokenizer, code, run manifest and train_results.json into a
    staging sibling of `output_dir`, carry over what else the folder holds (its checkpoints only with
    `keep_checkpoints`), and swap the staging folder in (`output_files.replace_folder`): killed at any moment, the
    folder holds the previous complete model or this one. A full disk stops the run (`RunRefused`, naming it) with
    the staging folder removed; the same command resumes from the run's last checkpoint."""
    staging = sibling(output_dir, "partial")
    try:
        trainer.save_model(str(staging))  # by every process: a sharded model gathers its weights
    except Exception as error:  # OSError, safetensors' SafetensorError, PyTorch's RuntimeError
        if (failure := write_failure(error, output_dir)) is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
        last = last_complete_checkpoint(output_dir)
        raise RunRefused(f"the finished model could not be written: {failure}. Free space on that disk, then run the "
                         "same command again: it resumes "
                         f"{f'from {last}' if last else 'from the start (the run saved no checkpoint)'}") from error
    if trainer.is_world_process_zero():
        (staging / "train_results.json").write_text(json.dumps(_jsonable(metrics), indent=2) + "\n")
        write_record(staging, TRAIN_COMMAND)  # (the weights got their permissions in the trainer's _save)
        if carried := carry_over(output_dir, staging, keep_checkpoints):
            logger.info(f"kept from {output_dir} beside the new model: {', '.join(carried)}")
        replace_folder(output_dir, staging)
    trainer.accelerator.wait_for_everyone()


def _load_tokenizer(name_or_path: str):
    try:
        return load_tokenizer(name_or_path)
    except (OSError, ValueError) as error:  # ValueError: saved_files.DamagedFile, a tokenizer.json Transformers refuses
        raise SystemExit(f"hf-headattn-train: error: cannot load the tokenizer {name_or_path}: {error}") from None


def _final_evaluation(trainer: HeadAttnSeq2SeqTrainer) -> dict:
    """The evaluation of the model being saved: the one training already ran at its last step (or, with
    --load_best_model_at_end, at the best step), else a new one."""
    state = trainer.state
    best = trainer.args.load_best_model_at_end and state.best_global_step
    step = state.best_global_step if best else state.global_step
    for entry in reversed(state.log_history):
        if entry.get("step") == step and "eval_loss" in entry:
            return {key: value for key, value in entry.items() if key.startswith("eval_")}
    return trainer.evaluate()


def _training_file_pairs(data_args: DataArguments):
    """Every pair of the training files, in their order, as (source, target): the lines a Pharaoh file follows."""
    from ..parallel_data import iter_pairs
    from .data import data_files

    return ((row["source"], row["target"]) for row in iter_pairs(data_files(data_args)["train"]))


def build_model(config):
    """A freshly initialised model of the config's family."""
    from ..runtime.modeling_headattn import HeadAttnForConditionalGeneration
    from ..runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration

    if isinstance(config, HeadAttnRNNConfig):
        return HeadAttnRNNForConditionalGeneration(config)
    return HeadAttnForConditionalGeneration(config)


def prepare_fertility(model, tokenizer, train_text, predictor_epochs: int = 5, seed: int = 0) -> None:
    """Fill in what the GUIDED and PREDICTED fertility strategies (Malaviya et al., 2018, Sec. 4) learn from the
    training pairs `train_text` (`load_data`'s): eflomal alignments of its subword tokens give each source token's
    fertility; GUIDED keeps the largest per token id in the encoder's `source_fertility.guided_fertility` table,
    PREDICTED trains the encoder's bi-LSTM `source_fertility.fertility_predictor` on them (+1 slack). Works for both
    model families; nothing to do (and no text read) for CONSTANT or models without constrained attention."""
    from ..alignment import corpus_token_fertilities, guided_fertility_table, train_fertility_predictor

    config, bounds = model.config, model.get_encoder().source_fertility
    if bounds is None or config.fertility == "constant":
        return
    sources, targets = pair_columns(train_text)
    source_ids, fertilities = corpus_token_fertilities(
        tokenizer, list(sources), list(targets), seed=seed,
        progress=f"fertility: aligning {len(sources):,} training pairs (eflomal)")
    if config.fertility == "guided":
        with torch.no_grad():
            bounds.guided_fertility.copy_(guided_fertility_table(source_ids, fertilities, config.vocab_size))
    else:
        train_fertility_predictor(bounds.fertility_predictor, source_ids, fertilities, epochs=predictor_epochs,
                                  seed=seed)


def summary_line(metrics: dict, output_dir: Path) -> str:
    """`trained 470 steps | 3,000 pairs | 3.9 min | train_loss 1.969 | eval_loss 0.926 | written: DIR`: what the
    command says at the end (every metric is in the folder's train_results.json)."""
    parts = [f"trained {metrics['global_step']:,} steps"]
    if metrics.get("train_pairs") is not None:
        parts.append(f"{metrics['train_pairs']:,} pairs")
    if metrics.get("train_runtime_total") is not None:
        parts.append(f"{metrics['train_runtime_total'] / 60:.1f} min")
    parts += [f"{name} {metrics[name]:.4g}" for name in ("train_loss", "eval_loss", "eval_bleu")
              if isinstance(metrics.get(name), float) and math.isfinite(metrics[name])]
    return " | ".join([*parts, f"written: {output_dir}"])


def _jsonable(metrics: dict) -> dict:
    return {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in metrics.items()}
