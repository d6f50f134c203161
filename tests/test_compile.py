"""torch.compile: every Transformer variant compiles and gives eager's outputs; the SDPA variants (softmax, MMA)
and DHICM compile to one graph, without breaks. Slow (inductor compiles C++ kernels): `pytest -m slow`."""

import pytest
import torch
import torch._dynamo

from helpers import random_model, source_batch, tiny_config


pytestmark = pytest.mark.slow

SPECS = {
    "softmax": {},
    "mma": {"encoder_self_attention": "mma"},
    "dhicm": {"encoder_self_attention": "dhicm", "decoder_self_attention": "dhicm", "cross_attention": "dhicm"},
    "sparsemax": {"cross_attention": "sparsemax"},
    "csparsemax": {"cross_attention": "csparsemax"},
    "multihop": {"cross_attention": "multihop"},
}
WITHOUT_GRAPH_BREAKS = ("softmax", "mma", "dhicm")


def inputs(config):
    input_ids, attention_mask = source_batch()
    labels = torch.randint(3, config.vocab_size, (input_ids.shape[0], 6), generator=torch.Generator().manual_seed(2))
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize("name", list(SPECS))
def test_compiled_forward_and_backward_equal_eager(name):
    config = tiny_config(**SPECS[name])
    model = random_model(config).train()
    model.config.dropout = model.config.attention_dropout = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = inputs(config)
    eager = model(**batch)
    eager.loss.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    torch._dynamo.reset()
    compiled = torch.compile(model)(**batch)
    compiled.loss.backward()
    torch.testing.assert_close(compiled.logits, eager.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled.loss, eager.loss, atol=1e-5, rtol=1e-5)
    for parameter_name, parameter in model.named_parameters():
        if parameter_name in eager_grads:
            torch.testing.assert_close(parameter.grad, eager_grads[parameter_name], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", WITHOUT_GRAPH_BREAKS)
def test_one_graph_without_breaks(name):
    config = tiny_config(**SPECS[name])
    model = random_model(config).eval()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(**inputs(config))
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
