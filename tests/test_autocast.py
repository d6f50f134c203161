"""Autocast (bf16, and fp16 where torch has it on the device): every Transformer variant (fertility "predicted" and
"guided" included) and every LSTM configuration runs on batch 1 and on equal-length batches, which used to crash the
LSTMs ("could not create a primitive descriptor for the LSTM forward propagation primitive"), and gives the float32
logits to a stated tolerance. The LSTMs run in float32 inside autocast (`rnn_packing._without_autocast`)."""

import pytest
import torch

from helpers import (RNN_CONFIGS, TRANSFORMER_VARIANTS, random_model, random_rnn_model, rnn_config, source_batch,
                     tiny_config)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Largest |autocast logits - float32 logits| allowed, for these models (weights ~ N(0, 0.1), |logits| up to ~4): bf16
# keeps 8 significant bits, fp16 11. Measured on CPU: at most 0.019 (bf16) and 0.002 (fp16).
TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}
DTYPES = [torch.bfloat16] + ([torch.float16] if torch.amp.autocast_mode.is_autocast_available(DEVICE) else [])
# batch 1, and batches whose sentences all have the same length: the LSTM crashes of issue 17
BATCHES = {"batch-1": (6,), "equal-lengths": (6, 6, 6), "mixed-lengths": (7, 4, 9)}

TRANSFORMERS = {
    **TRANSFORMER_VARIANTS,
    "csparsemax-predicted": dict(cross_attention="csparsemax", fertility="predicted"),
    "csoftmax-guided": dict(cross_attention="csoftmax", fertility="guided"),
}


def build(family: str, name: str):
    if family == "transformer":
        return random_model(tiny_config(**TRANSFORMERS[name]), std=0.1).to(DEVICE)
    return random_rnn_model(rnn_config(**RNN_CONFIGS[name]), std=0.1).to(DEVICE)


def inputs(lengths):
    input_ids, attention_mask = source_batch(lengths)
    decoder_input_ids = torch.randint(2, 64, (len(lengths), 5), generator=torch.Generator().manual_seed(3))
    decoder_input_ids[:, 0] = 0
    return dict(input_ids=input_ids.to(DEVICE), attention_mask=attention_mask.to(DEVICE),
                decoder_input_ids=decoder_input_ids.to(DEVICE))


MODELS = [("transformer", name) for name in TRANSFORMERS] + [("rnn", name) for name in RNN_CONFIGS]


@pytest.mark.parametrize("family,name", MODELS, ids=[f"{family}-{name}" for family, name in MODELS])
def test_autocast_logits_match_float32(family, name):
    model = build(family, name)
    for lengths in BATCHES.values():
        batch = inputs(lengths)
        with torch.no_grad():
            expected = model(**batch).logits
            for dtype in DTYPES:
                with torch.autocast(DEVICE, dtype=dtype):
                    actual = model(**batch).logits
                torch.testing.assert_close(actual.float(), expected, rtol=0, atol=TOLERANCE[dtype],
                                           msg=lambda m: f"{lengths}, {dtype}: {m}")


@pytest.mark.parametrize("family,name", [("transformer", "csparsemax-predicted"), ("rnn", "baseline-1x1-general"),
                                         ("rnn", "csparsemax-predicted-no-sink")])
def test_autocast_training_step_and_generate(family, name):
    """A training step (loss and gradients) and beam search on one sentence under bf16 autocast."""
    model = build(family, name).train()
    batch = inputs(BATCHES["equal-lengths"])
    labels = batch.pop("decoder_input_ids")
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = model(**batch, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    one = inputs(BATCHES["batch-1"])
    with torch.no_grad():
        expected = model.generate(one["input_ids"], attention_mask=one["attention_mask"], num_beams=2, max_new_tokens=6)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            generated = model.generate(one["input_ids"], attention_mask=one["attention_mask"], num_beams=2,
                                       max_new_tokens=6)
    assert generated.shape[0] == expected.shape[0] == 1
    assert generated[0, 0] == model.config.decoder_start_token_id and generated.shape[1] <= 7


def test_a_bare_lstm_in_float16_is_what_fails():
    """The reason for `_without_autocast`: if torch's CPU LSTM ever handles these calls, this says so. (bfloat16
    fails the same way on CPUs without AVX512-BF16; with it, oneDNN runs bfloat16.)"""
    if DEVICE != "cpu":
        pytest.skip("oneDNN's CPU LSTM")
    lstm = torch.nn.LSTM(4, 4, batch_first=True)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(RuntimeError, match="primitive descriptor"):
        lstm(torch.randn(1, 3, 4))
