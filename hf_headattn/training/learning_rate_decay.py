"""OpenNMT-py's (2017) learning-rate decay, the schedule Malaviya et al. trained with (OpenNMT-py's defaults: SGD at
1.0, halved from the epoch after `start_decay_at` = 8 on, or from the first epoch whose validation perplexity rose).

Tooling, not model runtime: never copied into a checkpoint.
"""

import torch


class OpenNMTDecay(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """After each epoch's validation (`step(validation_loss)`), OpenNMT-py's `Optim.updateLearningRate`: decay starts
    once the epoch number reaches `start_decay_at` or the validation loss rose over the previous epoch's (the loss
    and the perplexity exp(loss) rise together), and once started the learning rate is multiplied by `factor` after
    every epoch. Epoch e's validation decides the rate of epoch e + 1: with start_decay_at = 8, epoch 9 trains at half
    the rate.

    A `ReduceLROnPlateau` so that Transformers' Trainer steps it with the evaluation's metric (its
    `metric_for_best_model`) at each evaluation rather than at each optimizer step; its state (`state_dict`: the
    epochs seen, the last loss, whether decay started) is saved with every checkpoint and restored on resume."""

    def __init__(self, optimizer: torch.optim.Optimizer, factor: float = 0.5, start_decay_at: int = 8):
        if not 0 < factor < 1:
            raise ValueError(f"the learning-rate decay factor must be in (0, 1), got {factor}")
        if start_decay_at < 1:
            raise ValueError(f"start_decay_at counts epochs from 1, got {start_decay_at}")
        super().__init__(optimizer, mode="min", factor=factor)
        self.start_decay_at = start_decay_at
        self.epochs_seen = 0
        self.last_loss: float | None = None
        self.decaying = False

    def step(self, metrics, epoch=None):  # noqa: D102 (the signature Trainer calls)
        loss = float(metrics)
        self.epochs_seen += 1
        rose = self.last_loss is not None and loss > self.last_loss
        if self.epochs_seen >= self.start_decay_at or rose:
            self.decaying = True
        if self.decaying:
            for group in self.optimizer.param_groups:
                group["lr"] *= self.factor
        self.last_loss = loss
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
