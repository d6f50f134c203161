"""`HeadAttnSeq2SeqTrainer`, the `Seq2SeqTrainer` the training command runs, and what it trains with: the progress
bar that logs numbers as numbers and the BLEU/chrF `compute_metrics`. Kept apart from the run's arguments, whose
parser (`hf-headattn-train --help`) needs none of Trainer.

Tooling, not model runtime: never copied into a checkpoint.
"""

import logging
import os
import shutil
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import ProgressCallback, Seq2SeqTrainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, has_length, seed_worker

from ..metrics import score_translations
from ..output_files import with_default_permissions
from ..progress import Progress
from ..saved_files import write_failure
from .argument_groups import LOSS_NORMALIZATIONS
from .arguments import data_seed
from .batching import TokenBudgetBatchSampler, TokenBudgetEpochCallback, pair_lengths
from .checkpoints import last_complete_checkpoint
from .learning_rate_decay import OpenNMTDecay
from .run_folder import RunRefused
from .run_manifest import write_manifest

logger = logging.getLogger(__name__)

LOSS_GROWTH_WARNING = 2.0  # a logged training loss this many times the run's first is warned about


class TrainingDiverged(RunRefused):
    """A non-finite loss, gradient norm or weight: training stops before the optimizer step that would use it, and
    nothing non-finite is saved."""


class CheckpointNotWritten(RunRefused):
    """A checkpoint that could not be written (a full disk): the run stops, the incomplete checkpoint is removed, and
    the same command resumes from the checkpoint before it once there is room."""


def translation_metrics(tokenizer):
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: corpus BLEU and chrF (sacrebleu)."""
    def compute(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels < 0, tokenizer.pad_token_id, labels)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        return score_translations(hypotheses, references)

    return compute


class NumericProgressCallback(ProgressCallback):
    """Trainer's progress bars, as the package's (`progress.Progress`: a bar on a terminal, plain lines with rate and
    ETA in a log), writing each log as `loss 2.31 | grad_norm 0.8 | ...` rather than a dict of numbers formatted as
    quoted strings."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = Progress(total=state.max_steps, desc="training", unit="step")
        self.current_step = 0

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                self.prediction_bar = Progress(total=len(eval_dataloader), desc="validation", unit="batch",
                                               leave=self.training_bar is None)
            self.prediction_bar.update(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "train_runtime" in logs:  # the end-of-training summary: the command's result line says it
            return
        if state.is_world_process_zero and self.training_bar is not None and not self.training_bar.disable:
            shown = [f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in logs.items() if key != "total_flos"]
            self.training_bar.write(" | ".join(shown))


class TrainingClockCallback(TrainerCallback, ExportableState):
    """Wall-clock seconds of training summed over every part of a resumed run (Trainer's `train_runtime` is the
    last part's alone). Each checkpoint saves the sum so far in trainer_state.json's `stateful_callbacks`, and a
    run resumed from it counts on from there; the time between a run's last checkpoint and its interruption is
    lost work, not counted."""

    def __init__(self):
        self.seconds_before = 0.0  # the earlier parts' training time
        self.started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__, {}).get("attributes", {})
        if state.global_step > 0 and "seconds_before" not in saved:
            logger.warning(f"the checkpoint of step {state.global_step} has no training time recorded (saved by an "
                           "older version); train_runtime_total counts from this resume only")
        self.seconds_before = saved.get("seconds_before", 0.0) if state.global_step > 0 else 0.0
        self.started = time.perf_counter()

    def state(self) -> dict:  # saved in each checkpoint: the time so far, this part's included
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return {"args": {}, "attributes": {"seconds_before": self.seconds_before + running}}


class HeadAttnSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` that logs the parts of the loss the attention variants add, `aux_loss` and `head_kl`
    (DHICM's KL(importances || uniform)), guided alignment's `alignment_loss` (the cost before its weight, see
    runtime/guided_alignment.py) and `real_token_ratio` (real over padded source + target tokens), each
    averaged over the micro-batches since the last log; with `max_tokens`, it trains on token-budget batches
    (`batching.TokenBudgetBatchSampler`) instead of batches of `per_device_train_batch_size` sentences, sorted by
    length over the whole training set or, with `bucket_pool_pairs`, within random pools of that many pairs. `train()`
    adds `train_runtime_total` to its metrics: the training time of every part of a resumed run
    (`TrainingClockCallback`).

    Divergence is a failure: a non-finite loss or gradient norm raises `TrainingDiverged` naming the step, before
    the optimizer step (under fp16's gradient scaler, non-finite gradients are its business: it skips the step), and
    a model with a non-finite weight is never saved; a logged loss that grows past `LOSS_GROWTH_WARNING` times the
    run's first is warned about. `run_manifest` is written into every checkpoint and the saved model
    (`run_manifest.py`); with `reset_optimizer`, a resumed run starts a fresh optimizer and schedule. With
    `lr_decay` (the keyword arguments of `OpenNMTDecay`), the learning rate follows OpenNMT-py's per-epoch decay
    instead of `lr_scheduler_type`. `loss_normalization` says what the summed token loss of an optimizer step is
    divided by before the backward pass: "tokens" (its target tokens, Transformers' default) or "sentences" (its
    sentences, OpenNMT-py 2017's `loss.div(batch.batch_size)`); the logged training loss is per token either way.

    The model computes its own label-smoothed loss (`config.label_smoothing`) so that the auxiliary loss is part
    of it; Trainer's `label_smoothing_factor` would recompute the loss from the logits alone and drop that term,
    so it is refused here."""

    LOGGED_PARTS = ("aux_loss", "head_kl", "alignment_loss")

    def __init__(self, *args, max_tokens: int | None = None, bucket_pool_pairs: int | None = None,
                 run_manifest: dict | None = None, reset_optimizer: bool = False, lr_decay: dict | None = None,
                 loss_normalization: str = "tokens", **kwargs):
        super().__init__(*args, **kwargs)
        if loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(f"loss_normalization={loss_normalization!r}: give one of {', '.join(LOSS_NORMALIZATIONS)}")
        if loss_normalization == "sentences" and not self.model_accepts_loss_kwargs:
            raise ValueError(f"loss_normalization='sentences' rescales a loss normalised over the step's target tokens "
                             f"(`num_items_in_batch`), which {type(self.model).__name__}'s forward does not take")
        if self.args.label_smoothing_factor:
            raise ValueError(
                f"label_smoothing_factor={self.args.label_smoothing_factor} makes Trainer recompute the loss from the "
                "logits and drop the attention variants' auxiliary loss; set the model's `config.label_smoothing` "
                "instead and leave label_smoothing_factor at 0"
            )
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(NumericProgressCallback)
        self.add_callback(TrainingClockCallback)
        if bucket_pool_pairs is not None and max_tokens is None:
            raise ValueError("bucket_pool_pairs pools the token-budget batches of max_tokens; give max_tokens too")
        self.max_tokens = max_tokens
        self.bucket_pool_pairs = bucket_pool_pairs
        self.run_manifest = run_manifest
        self.reset_optimizer = reset_optimizer
        self.lr_decay = lr_decay
        self.loss_normalization = loss_normalization
        self._tokens_per_sentence: torch.Tensor | None = None  # of the optimizer step being taken ("sentences")
        self._first_loss: tuple[int, float] | None = None  # (step, loss) of the run's first training log
        self._loss_warned_below = 0.0  # after a warning, the loss must grow as much again to be warned about
        self._loss_parts: dict[str, list] = {}
        self._real_tokens: list[torch.Tensor] = []  # per micro-batch since the last log, on the device
        self._padded_tokens = 0

    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens is None:
            return super().get_train_dataloader()
        source_lengths, target_lengths = pair_lengths(self.train_dataset)
        sampler = TokenBudgetBatchSampler(source_lengths, target_lengths, self.max_tokens, seed=data_seed(self.args),
                                          num_replicas=self.args.world_size, pool_pairs=self.bucket_pool_pairs)
        self.callback_handler.pop_callback(TokenBudgetEpochCallback)  # one per train() call
        self.add_callback(TokenBudgetEpochCallback(sampler, self.args.gradient_accumulation_steps))
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        dataloader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            worker_init_fn=partial(seed_worker, num_workers=self.args.dataloader_num_workers,
                                   rank=self.args.process_index),
        )
        # Accelerate moves batches to the device and, under several processes, deals the batches out to the ranks
        return self.accelerator.prepare(dataloader)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            if isinstance(outputs, dict):
                for name in self.LOGGED_PARTS:
                    if outputs.get(name) is not None:
                        self._loss_parts.setdefault(name, []).append(outputs[name].detach())
            self._real_tokens.append(inputs["attention_mask"].sum() + (inputs["labels"] != -100).sum())
            self._padded_tokens += inputs["input_ids"].numel() + inputs["labels"].numel()
            if self.loss_normalization == "sentences":
                # the model divided the step's summed loss by its tokens; OpenNMT-py 2017 divides by its sentences:
                # gradients (what max_grad_norm clips and SGD steps by) grow by the mean target length
                loss = loss * self._tokens_per_sentence
        return (loss, outputs) if return_outputs else loss

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.loss_normalization == "sentences" and batch_samples:
            labels = [batch["labels"] for batch in batch_samples]
            counts = torch.stack([sum(label.ne(-100).sum() for label in labels).to(device),
                                  torch.tensor(sum(len(label) for label in labels), device=device)])
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
                counts = self.accelerator.gather(counts[None]).sum(0)  # the loss is normalised over every process
            self._tokens_per_sentence = counts[0] / counts[1]
        return batch_samples, num_items_in_batch

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.loss_normalization == "sentences":
            loss = loss / self._tokens_per_sentence  # logged per token, as OpenNMT-py logged xent
        if not torch.isfinite(loss).item():
            self._diverged(f"the loss is {loss.item()}")
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm)
        if getattr(self.accelerator, "scaler", None) is None and not torch.isfinite(torch.as_tensor(grad_norm)).item():
            self._diverged(f"the gradient norm is {float(grad_norm)}")
        return grad_norm

    def _diverged(self, what: str):
        last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
        raise TrainingDiverged(
            f"training diverged at step {self.state.global_step + 1}: {what}. Nothing of this step was applied or "
            f"saved; {f'the last checkpoint, {last}, holds the run before it' if last else 'no checkpoint was saved'}."
            " Lower --learning_rate, raise --warmup_steps or set --max_grad_norm, and start over (or resume)")

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        parameters = dict(self.model.named_parameters())
        finite = torch.stack([parameter.isfinite().all() for parameter in parameters.values()])
        if not finite.all().item():
            name = list(parameters)[int((~finite).nonzero()[0])]
            raise TrainingDiverged(f"the weight {name} is not finite at step {self.state.global_step}: {output_dir} is "
                                   "not written (the checkpoints before it are the run's last good state)")
        super()._save(output_dir, state_dict)
        if self.run_manifest is not None and self.args.should_save:
            write_manifest(output_dir, self.run_manifest)
        if self.args.should_save:  # safetensors writes weights as 0600: unreadable to whoever serves the folder
            with_default_permissions(output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        try:
            super()._save_checkpoint(model, trial)
        except RunRefused:  # TrainingDiverged: nothing was written
            raise
        except Exception as error:  # OSError, safetensors' SafetensorError, PyTorch's RuntimeError
            checkpoint = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            failure = write_failure(error, checkpoint.parent)
            if failure is None:
                raise
            if self.args.should_save:  # half a checkpoint: room for nothing, and no state to resume from
                shutil.rmtree(checkpoint, ignore_errors=True)
            last = last_complete_checkpoint(checkpoint.parent)
            raise CheckpointNotWritten(
                f"{checkpoint} could not be written and is removed: {failure}. Free space on that disk (or keep fewer "
                f"checkpoints with --save_total_limit), then run the same command again: it resumes "
                f"{f'from {last}' if last else 'from the start (no checkpoint was written before)'}") from error

    def _issue_warnings_after_load(self, load_result) -> None:
        # --load_best_model_at_end reads a checkpoint's state dict, which holds tied weights once (model.shared): the
        # embeddings and the output layer tied to it share its tensor, loaded with it, so they are not missing
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or ())
        super()._issue_warnings_after_load(
            load_result._replace(missing_keys=[key for key in load_result.missing_keys if key not in tied]))

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial)
        if self.state.global_step >= max_steps:
            # a checkpoint of the run's last step: nothing is left to train (Trainer would train one step past it
            # before it looked, and the resumed run would end as another model than the uninterrupted one)
            return num_train_epochs, 0
        return epochs_trained, steps_trained

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_decay is not None and self.lr_scheduler is None:
            self.lr_scheduler = OpenNMTDecay(optimizer if optimizer is not None else self.optimizer, **self.lr_decay)
        return super().create_scheduler(num_training_steps, optimizer)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if not self.reset_optimizer:  # --reset_optimizer: the run goes on with the fresh ones Trainer made
            super()._load_optimizer_and_scheduler(checkpoint)

    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        clock = next(callback for callback in self.callback_handler.callbacks
                     if isinstance(callback, TrainingClockCallback))  # Trainer may have replaced it when resuming
        output.metrics["train_runtime_total"] = round(clock.seconds_before + output.metrics["train_runtime"], 4)
        return output

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log, not an evaluation one
            self._watch_loss_growth(logs["loss"])
            for name, values in self._loss_parts.items():
                logs[name] = torch.stack(values).float().mean().item()
            if self._padded_tokens:
                logs["real_token_ratio"] = round(torch.stack(self._real_tokens).sum().item() / self._padded_tokens, 4)
            self._loss_parts, self._real_tokens, self._padded_tokens = {}, [], 0
        super().log(logs, start_time)

    def _watch_loss_growth(self, loss: float) -> None:
        if self._first_loss is None:  # a resumed run's first is in its checkpoint's log history
            first = next((entry for entry in self.state.log_history if "loss" in entry), None)
            self._first_loss = (first["step"], first["loss"]) if first else (self.state.global_step, loss)
        step, first_loss = self._first_loss
        if first_loss > 0 and loss > max(LOSS_GROWTH_WARNING * first_loss, self._loss_warned_below):
            self._loss_warned_below = LOSS_GROWTH_WARNING * loss
            logger.warning(f"the training loss {loss:.4g} at step {self.state.global_step} is over "
                           f"{LOSS_GROWTH_WARNING:g} times its first logged value ({first_loss:.4g} at step {step}): "
                           "training may be diverging; consider a lower --learning_rate, more --warmup_steps or "
                           "--max_grad_norm")
