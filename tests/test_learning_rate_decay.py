"""OpenNMT-py's per-epoch learning-rate decay and the `--preset malaviya2018` recipe that trains with it."""

import pytest
import torch

from helpers import toy_data
from hf_headattn.training.arguments import build_config, parse_args
from hf_headattn.training.learning_rate_decay import OpenNMTDecay


def _rates(validation_losses, **decay):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    schedule = OpenNMTDecay(optimizer, **decay)
    rates = []
    for loss in validation_losses:
        schedule.step(loss)
        rates.append(optimizer.param_groups[0]["lr"])
    return rates, schedule


def test_decay_starts_at_start_decay_at_and_goes_on_every_epoch():
    """OpenNMT-py 2017, Optim.updateLearningRate: epoch e >= start_decay_at (8) starts the decay, which then halves
    the rate after every epoch: epochs 1-8 train at 1.0, epoch 9 at 0.5, ..., epoch 13 at 1/32."""
    rates, _ = _rates([5.0 - 0.1 * epoch for epoch in range(12)])
    assert rates == [1.0] * 7 + [0.5, 0.25, 0.125, 0.0625, 0.03125]


def test_a_rise_of_the_validation_loss_starts_the_decay_early():
    """Epoch 4's loss rose over epoch 3's: decay from then on, even when the loss falls again."""
    rates, _ = _rates([5.0, 4.0, 3.0, 3.1, 2.9, 2.8], factor=0.5, start_decay_at=8)
    assert rates == [1.0, 1.0, 1.0, 0.5, 0.25, 0.125]


def test_the_decay_resumes_from_its_state():
    """A checkpoint saves the schedule's state_dict (Trainer's scheduler.pt); a resumed run continues the sequence."""
    losses = [5.0, 4.0, 3.0, 3.1, 2.9, 2.8]
    uninterrupted, _ = _rates(losses)
    first, schedule = _rates(losses[:4])
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=first[-1])
    resumed = OpenNMTDecay(optimizer)
    resumed.load_state_dict(schedule.state_dict())
    for loss in losses[4:]:
        resumed.step(loss)
        first.append(optimizer.param_groups[0]["lr"])
    assert first == uninterrupted


@pytest.mark.parametrize("factor, start", [(0.0, 8), (1.0, 8), (0.5, 0)])
def test_bad_decay_settings_are_refused(factor, start):
    with pytest.raises(ValueError):
        _rates([1.0], factor=factor, start_decay_at=start)


def test_the_malaviya2018_preset_is_the_papers_recipe(tmp_path):
    data = toy_data(tmp_path / "data")
    model_args, data_args, run_args, training_args = parse_args([
        "--preset", "malaviya2018", "--attention_transform", "csparsemax", "--fertility", "predicted",
        "--train_source", data["train.src"], "--train_target", data["train.tgt"], "--output_dir", tmp_path / "run"])
    config = build_config(model_args, data_args)
    assert (config.model_type, config.encoder_layers, config.decoder_layers) == ("headattn_rnn", 2, 2)
    assert (config.embedding_size, config.hidden_size, config.hidden_size // 2) == (500, 500, 250)
    assert (config.dropout, config.embedding_dropout, config.label_smoothing, config.init_range) == (0.3, False, 0.0,
                                                                                                     0.1)
    assert (config.attention_score, config.attention_transform, config.fertility) == ("general", "csparsemax",
                                                                                     "predicted")
    assert (config.sink, config.sink_every_transform, config.exhaustion) == ("token", True, 0.2)
    assert (training_args.optim, training_args.learning_rate, training_args.max_grad_norm) == ("sgd", 1.0, 5.0)
    assert training_args.train_sampling_strategy == "group_by_length"  # OpenNMT-py's (torchtext's) pooled batches
    assert run_args.loss_normalization == "sentences"  # OpenNMT-py 2017: the summed loss over the batch's sentences
    assert (training_args.per_device_train_batch_size, training_args.num_train_epochs) == (64, 13)
    assert training_args.eval_strategy == "epoch" and training_args.metric_for_best_model == "loss"
    assert (run_args.lr_decay, run_args.lr_decay_factor, run_args.lr_decay_start_at) == ("opennmt", 0.5, 8)
    # a flag given beside the preset wins
    _, _, _, training_args = parse_args([
        "--preset", "malaviya2018", "--num_train_epochs", "2", "--train_source", data["train.src"],
        "--train_target", data["train.tgt"], "--output_dir", tmp_path / "run"])
    assert training_args.num_train_epochs == 2


def test_the_decay_needs_an_evaluation_each_epoch(tmp_path, capsys):
    data = toy_data(tmp_path / "data")
    with pytest.raises(SystemExit):
        parse_args(["--architecture", "rnn", "--lr_decay", "opennmt", "--eval_strategy", "steps",
                    "--train_source", data["train.src"], "--train_target", data["train.tgt"],
                    "--output_dir", tmp_path / "run"])
    assert "--lr_decay opennmt decays after each epoch's validation: give --eval_strategy epoch" in capsys.readouterr().err
