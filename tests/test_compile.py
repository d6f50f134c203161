"""torch.compile: every Transformer variant compiles and gives eager's outputs; the SDPA variants (softmax, MMA)
and DHICM compile to one graph, without breaks; `csparsemax(compiled=True)` gives the exact solution and
gradients. Slow (inductor compiles C++ kernels): `pytest -m slow`."""

import pytest
import torch
import torch._dynamo

from hf_headattn.runtime import sparse_solvers
from hf_headattn.runtime.sparse_attention import csparsemax
from helpers import load_example, random_model, source_batch, tiny_config


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


# ----------------------------------------------------------------------------------------------------------
# csparsemax(compiled=True): the fixed passes and the backward compiled by torch.compile.


def constrained_case(rows, n, dtype, seed):
    """Scores with ties and masked keys, bounds with zeros, a few infeasible and all-masked rows."""
    generator = torch.Generator().manual_seed(seed)
    z = (torch.randn(rows, n, generator=generator, dtype=torch.float64) * 2).round(decimals=1).to(dtype)
    u = (torch.randint(0, 3, (rows, n), generator=generator) * torch.rand(rows, n, generator=generator)).to(dtype)
    mask = torch.rand(rows, n, generator=generator) > 0.2
    u[::7] *= 0.01  # infeasible: sum u < 1
    mask[::11] = False  # no allowed key
    return z, u, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_csparsemax_equals_eager(dtype, monkeypatch):
    monkeypatch.setattr(sparse_solvers, "_SORT_BELOW", 0)  # the passes even for this small input
    z, u, mask = constrained_case(300, 40, dtype, seed=0)
    # Rows that come out NaN, as through torch.softmax: a NaN score, a +inf score, a NaN bound (on allowed keys).
    z[5, 3], z[17, 0], u[23, 2] = float("nan"), float("inf"), float("nan")
    mask[5, 3] = mask[17, 0] = mask[23, 2] = True
    grad = torch.randn(z.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    for compiled in (False, True):
        zz, uu = z.clone().requires_grad_(), u.clone().requires_grad_()
        alpha = csparsemax(zz, uu, mask=mask, compiled=compiled)
        results.append((alpha.detach(), *torch.autograd.grad(alpha, [zz, uu], grad)))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6, equal_nan=True)
    alpha, grad_z, _ = results[1]
    nan_rows = [5, 17, 23]  # NaN everywhere, but keys under mask=False get no gradient (as through masked_fill)
    assert alpha[nan_rows].isnan().all() and grad_z[nan_rows][mask[nan_rows]].isnan().all()
    assert not alpha[[0, 1, 2, 3, 4, 6]].isnan().any()


def test_compiled_csparsemax_gradcheck(monkeypatch):
    monkeypatch.setattr(sparse_solvers, "_SORT_BELOW", 0)
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(6, 9, dtype=torch.float64, generator=generator).requires_grad_()
    u = (0.05 + 0.3 * torch.rand(6, 9, dtype=torch.float64, generator=generator)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: csparsemax(a, b, compiled=True), (z, u))


def test_compiled_passes_settle_the_benchmark_rows(monkeypatch):
    # At the benchmark's shape, `_COMPILED_PASSES` passes settle every row: none is handed to the eager solver.
    z, u, _ = load_example("benchmark_sparse_kernels").make_inputs(1024, 512, seed=0)
    eager = csparsemax(z, u)
    handed_over = []
    original = sparse_solvers._csparsemax_safeguarded_solve
    monkeypatch.setattr(sparse_solvers, "_csparsemax_safeguarded_solve",
                        lambda z, us: handed_over.append(z.shape[0]) or original(z, us))
    torch.testing.assert_close(csparsemax(z, u, compiled=True), eager, rtol=0, atol=1e-6)
    assert handed_over == []


def test_compiled_csparsemax_hands_flat_rows_to_the_eager_passes(monkeypatch):
    # Flat scores need more than `_COMPILED_PASSES` passes in many rows; those go on with the eager solver.
    handed_over = []
    original = sparse_solvers._csparsemax_safeguarded_solve
    monkeypatch.setattr(sparse_solvers, "_csparsemax_safeguarded_solve",
                        lambda z, us: handed_over.append(z.shape[0]) or original(z, us))
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(1024, 512, generator=generator) * 0.3
    u = 3 * torch.rand(1024, 512, generator=generator)
    alpha = csparsemax(z, u, compiled=True)
    assert len(handed_over) == 1 and 16 < handed_over[0] < 1024
    torch.testing.assert_close(alpha, original(z, sparse_solvers.clamped_bounds(u, None))[0], rtol=0, atol=1e-6)
