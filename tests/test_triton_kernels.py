"""The Triton kernels (hf_headattn/runtime/triton_kernels.py) against the torch path: values and gradients of the
constrained scan (csoftmax, csparsemax), its one-position decoding step and the row-wise sparsemax, on every
convention of runtime/sparse_attention.py; their sm_90 code free of register spills; the choice of backend; and a
saved model that loads and runs where triton is not installed.

On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets before triton is
imported: triton reads it as it decorates its own functions and ours), which takes about a millisecond a program and
position, so the shapes are small. On a machine with CUDA they run compiled, on CUDA tensors."""

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hf_headattn.runtime import sparse_attention
from hf_headattn.runtime.attention_sparse import constrained_attention_scan, constrained_attention_step
from hf_headattn.runtime.sparse_attention import csoftmax, csparsemax, kernel_backend, sparsemax

from helpers import (REPO, WITHOUT_PACKAGE, load_example, random_model, random_rnn_model, rnn_config, source_batch,
                     tiny_config)


HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e '.[kernels]')")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRANSFORMS = {"csoftmax": csoftmax, "csparsemax": csparsemax}


@pytest.fixture(scope="module")
def kernels():
    """The kernels' module; on a CPU interpreted (tests/conftest.py sets TRITON_INTERPRET=1 before triton is
    imported)."""
    module = importlib.import_module("hf_headattn.runtime.triton_kernels")
    interpreted = type(module._constrained_scan_forward).__name__ == "InterpretedFunction"
    if DEVICE == "cpu" and not interpreted:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: its kernels cannot run on the CPU")
    return module


def _grads(outputs, inputs, seed=7):
    """Gradients of a fixed random projection of `outputs` for the `inputs` that require them."""
    generator = torch.Generator().manual_seed(seed)
    loss = sum((output.float() * torch.randn(output.shape, generator=generator).to(output.device)).sum()
               for output in outputs)
    wanted = [tensor for tensor in inputs if tensor is not None and tensor.requires_grad]
    return torch.autograd.grad(loss, wanted)


def _scan_case(sources=5, sink=True, batch=2, heads=2, targets=4, seed=0, dtype=torch.float32):
    """Scores, fertility, allowed keys (one masked source in sentence 1) and a nonzero starting cumulative
    attention, all requiring gradients where they are differentiable."""
    generator = torch.Generator().manual_seed(seed)
    keys = sources + 1 if sink else sources
    scores = (torch.randn(batch, heads, targets, keys, generator=generator) * 1.5).to(DEVICE, dtype)
    fertility = (torch.rand(batch, 1, sources, generator=generator) * 1.2 + 0.3).to(DEVICE, dtype)
    allowed = torch.ones(batch, 1, keys, dtype=torch.bool, device=DEVICE)
    allowed[1, 0, 2] = False
    start = (torch.rand(batch, heads, sources, generator=generator) * 0.4).to(DEVICE, dtype)
    return scores, fertility, allowed, start


def _both_scans(transform, scores, fertility, allowed, start, *, exhaustion, sink, reference_dtype=None):
    """(triton's, torch's) weights, final cumulative attention and gradients to scores, fertility and start; the
    torch path in `reference_dtype` (the inputs' dtype if None)."""
    results = []
    for backend, dtype in (("triton", None), ("torch", reference_dtype)):
        inputs = [None if x is None else x.detach().to(dtype or x.dtype).requires_grad_() for x in
                  (scores, fertility, start)]
        weights, cumulative = constrained_attention_scan(
            transform, inputs[0], inputs[1], exhaustion=exhaustion, sink=sink, allowed=allowed,
            cumulative=inputs[2], backend=backend)
        results.append((weights, cumulative, *_grads((weights, cumulative), inputs)))
    return results


def _assert_close(actual, expected, atol=2e-6, rtol=1e-5):
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol, equal_nan=True)


@needs_triton
@pytest.mark.parametrize("exhaustion", [0.0, 0.2])
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("name", TRANSFORMS)
def test_the_scan_equals_the_torch_loop_with_masked_keys_and_a_starting_cumulative_attention(kernels, name, sink,
                                                                                             exhaustion):
    scores, fertility, allowed, start = _scan_case(sink=sink, seed=len(name) + sink)
    triton_result, torch_result = _both_scans(TRANSFORMS[name], scores, fertility, allowed, start,
                                              exhaustion=exhaustion, sink=sink)
    _assert_close(triton_result, torch_result)
    weights = triton_result[0]
    assert (weights[1, :, :, 2] == 0).all() and (triton_result[2][1, :, :, 2] == 0).all()  # the masked key
    if sink:
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


@needs_triton
@pytest.mark.parametrize("name", TRANSFORMS)
def test_all_masked_rows_are_zeros_and_infeasible_rows_are_their_bounds(kernels, name):
    scores, fertility, allowed, start = _scan_case(sources=6, sink=False, seed=3)
    allowed[0] = False  # sentence 0: every key masked
    fertility = fertility * 0.1  # sentence 1: bounds summing below 1 (no sink)
    triton_result, torch_result = _both_scans(TRANSFORMS[name], scores, fertility, allowed, None, exhaustion=0.2,
                                              sink=False)
    _assert_close(triton_result, torch_result)
    weights, cumulative, grad_scores, grad_fertility = triton_result
    assert (weights[0] == 0).all() and (grad_scores[0] == 0).all() and (grad_fertility[0] == 0).all()
    bound_at_first = fertility[1].expand(2, -1) * allowed[1]
    torch.testing.assert_close(weights[1, :, 0], bound_at_first)  # alpha = u
    assert (grad_scores[1] == 0).all()  # dz = 0 on infeasible rows


@needs_triton
@pytest.mark.parametrize("name", TRANSFORMS)
def test_unbounded_and_zero_fertilities(kernels, name):
    scores, fertility, allowed, start = _scan_case(sources=6, sink=False, seed=4)
    fertility = fertility.clone()
    fertility[:, :, 0] = float("inf")  # never binds
    fertility[:, :, 1] = 0.0  # never attended
    triton_result, torch_result = _both_scans(TRANSFORMS[name], scores, fertility, allowed, None, exhaustion=0.0,
                                              sink=False)
    _assert_close(triton_result, torch_result)
    assert (triton_result[0][..., 1] == 0).all()


@needs_triton
@pytest.mark.parametrize("name", TRANSFORMS)
def test_nan_and_inf_scores_make_their_rows_nan_from_that_position_on_and_nothing_else(kernels, name):
    scores, fertility, allowed, start = _scan_case(sink=True, seed=5)
    scores = scores.clone()
    scores[0, 0, 1, 2] = float("nan")
    scores[1, 1, 2, 0] = float("inf")
    scores[1, 0, 0, 2] = float("nan")  # on a masked key: ignored
    triton_result, torch_result = _both_scans(TRANSFORMS[name], scores, fertility, allowed, start, exhaustion=0.2,
                                              sink=True)
    _assert_close(triton_result, torch_result)
    weights = triton_result[0]
    assert weights[0, 0, 1:].isnan().all() and not weights[0, 0, 0].isnan().any()
    assert weights[1, 1, 2:].isnan().all() and not weights[1, 0].isnan().any() and not weights[0, 1].isnan().any()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", TRANSFORMS)
def test_half_precision_inputs_are_computed_in_float32(kernels, name, dtype):
    scores, fertility, allowed, start = _scan_case(sink=True, seed=6, dtype=dtype)
    triton_result, reference = _both_scans(TRANSFORMS[name], scores, fertility, allowed, start, exhaustion=0.2,
                                           sink=True, reference_dtype=torch.float32)
    assert triton_result[0].dtype == dtype and triton_result[2].dtype == dtype
    # one rounding to the output dtype off the float32 path (beta is carried in float32 by both)
    _assert_close(triton_result, reference, atol=2e-2 if dtype == torch.bfloat16 else 2e-3, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("name", TRANSFORMS)
def test_padding_and_masked_keys_are_never_read_as_keys(kernels, name):
    """Scores as a view into rows 3 keys wider, whose extra columns hold a canary that a load past the row's last key
    would pick up; masked keys hold canaries too (a large score, NaN)."""
    scores, fertility, allowed, start = _scan_case(sources=6, sink=True, seed=8)
    canary = torch.full((*scores.shape[:-1], scores.shape[-1] + 3), 1e4, device=DEVICE)
    canary[..., :scores.shape[-1]] = scores
    scores_view = canary[..., :scores.shape[-1]]
    scores_view[1, :, :, 2] = 1e4  # masked
    allowed[0, 0, 4] = False
    scores_view[0, :, :, 4] = float("nan")  # masked
    assert scores_view.stride(-2) == scores.shape[-1] + 3
    triton_result, torch_result = _both_scans(TRANSFORMS[name], scores_view, fertility, allowed, start,
                                              exhaustion=0.2, sink=True)
    _assert_close(triton_result, torch_result)
    assert not triton_result[0].isnan().any()


@needs_triton
@pytest.mark.parametrize("name", TRANSFORMS)
def test_one_decoding_step_equals_the_torch_step(kernels, name):
    """The LSTM's decoding step (scores [batch, heads, keys]) through the scan's kernel with one target position."""
    scores, fertility, allowed, start = _scan_case(sink=True, targets=1, seed=9)
    results = []
    for backend in ("triton", "torch"):
        inputs = [x.detach()[:, :, 0].clone().requires_grad_() if x is scores else x.detach().clone().requires_grad_()
                  for x in (scores, fertility, start)]
        weights = constrained_attention_step(TRANSFORMS[name], inputs[0], inputs[1], inputs[2], exhaustion=0.2,
                                             sink=True, allowed=allowed, backend=backend)
        results.append((weights, *_grads((weights,), inputs)))
    _assert_close(*results)


@needs_triton
def test_a_constrained_transformer_trains_through_the_kernels_as_through_the_torch_loop(kernels, monkeypatch):
    """ConstrainedAttention.forward takes the scan; HF_HEADATTN_KERNELS=triton sends it to the kernels."""
    config = tiny_config(cross_attention={"type": "csparsemax", "layers": [0]}, fertility="predicted")
    input_ids, attention_mask = source_batch((5, 3))
    labels = torch.randint(2, 64, (2, 4), generator=torch.Generator().manual_seed(3))
    results = []
    for backend in ("triton", "torch"):
        monkeypatch.setenv("HF_HEADATTN_KERNELS", backend)
        model = random_model(config).to(DEVICE)
        loss = model(input_ids=input_ids.to(DEVICE), attention_mask=attention_mask.to(DEVICE),
                     labels=labels.to(DEVICE)).loss
        loss.backward()
        results.append([loss] + [parameter.grad for parameter in model.parameters() if parameter.grad is not None])
    assert len(results[0]) == len(results[1]) > 10
    _assert_close(*results, atol=1e-5, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize("family", ["transformer", "lstm"])
def test_both_families_decode_and_train_through_the_kernels_as_through_torch(kernels, monkeypatch, family):
    """Beam search (the Transformer's cached steps: the scan with one position and a starting cumulative attention;
    the LSTM's steps) and the LSTM's train step, each backend."""
    if family == "transformer":
        build = lambda: random_model(tiny_config(cross_attention="csoftmax", decoder_layers=1))  # noqa: E731
    else:
        build = lambda: random_rnn_model(rnn_config(attention_transform="csparsemax", num_heads=2))  # noqa: E731
    input_ids, attention_mask = source_batch((5, 3))
    results = []
    for backend in ("triton", "torch"):
        monkeypatch.setenv("HF_HEADATTN_KERNELS", backend)
        model = build().to(DEVICE)
        with torch.no_grad():
            generated = model.generate(input_ids=input_ids.to(DEVICE), attention_mask=attention_mask.to(DEVICE),
                                       num_beams=2, max_new_tokens=4, do_sample=False)
        loss = model(input_ids=input_ids.to(DEVICE), attention_mask=attention_mask.to(DEVICE),
                     labels=input_ids.to(DEVICE)).loss
        loss.backward()
        results.append((generated, loss, *[p.grad for p in model.parameters() if p.grad is not None]))
    assert torch.equal(results[0][0], results[1][0])
    _assert_close(results[0][1:], results[1][1:], atol=1e-5, rtol=1e-4)


@needs_triton
def test_the_launch_count_sees_one_scan_kernel_a_constrained_layer_forward_and_backward(kernels):
    """examples/benchmark_kernel_launches.py's counting: each Triton launch once, the interpreter's own tensor calls
    not at all."""
    counting = load_example("benchmark_kernel_launches")
    # (on DEVICE: with CUDA, HF_HEADATTN_KERNELS=triton launches the compiled kernels, which take no CPU tensors)
    model = random_model(tiny_config(cross_attention="csparsemax")).to(DEVICE)
    input_ids, attention_mask = source_batch((5, 3))
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "labels": torch.randint(2, 64, (2, 4), generator=torch.Generator().manual_seed(3))}
    inputs = {name: tensor.to(DEVICE) for name, tensor in inputs.items()}
    through_kernels = counting.count_train_step(model, inputs, "triton")
    through_torch = counting.count_train_step(model, inputs, "torch")
    assert through_kernels["triton_launches"] == 2 * model.config.decoder_layers  # forward and backward a layer
    assert through_torch["triton_launches"] == 0
    assert through_kernels["aten_calls"] < through_torch["aten_calls"]
    again = counting.count_train_step(model, inputs, "triton")
    assert again == through_kernels  # nothing depends on the data or on what ran before


def _sparsemax_case(rows=6, keys=11, seed=10, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    scores = (torch.randn(rows, keys, generator=generator) * 2).to(DEVICE, dtype)
    mask = torch.ones(rows, keys, dtype=torch.bool, device=DEVICE)
    mask[1, 3:] = False
    mask[2] = False  # all masked
    scores[3, 4] = float("nan")
    scores[4, 0] = float("inf")
    scores[1, 5] = float("nan")  # masked: ignored
    return scores, mask


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_row_sparsemax_equals_the_torch_solver(kernels, dtype):
    scores, mask = _sparsemax_case(dtype=dtype)
    results = []
    for backend, reference_dtype in (("triton", dtype), ("torch", torch.float32)):
        z = scores.detach().to(reference_dtype).requires_grad_()
        weights = sparsemax(z, dim=-1, mask=mask, backend=backend)
        results.append((weights, *_grads((weights,), [z])))
    assert results[0][0].dtype == dtype
    atol = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    _assert_close(*results, atol=atol, rtol=2e-2 if dtype != torch.float32 else 1e-5)
    weights = results[0][0]
    assert (weights[2] == 0).all() and weights[3].isnan().all() and weights[4].isnan().all()
    assert not weights[[0, 1, 5]].isnan().any()


@needs_triton
def test_rows_longer_than_a_block_say_so_and_run_through_torch(kernels):
    assert sparse_attention.TRITON_MAX_KEYS == kernels.MAX_KEYS
    keys = kernels.MAX_KEYS + 1
    scores = torch.randn(1, 1, 2, keys, device=DEVICE)
    fertility = torch.ones(1, 1, keys - 1, device=DEVICE)
    with pytest.warns(UserWarning, match=f"rows of {keys} keys do not fit"):
        weights, _ = constrained_attention_scan(csparsemax, scores, fertility, exhaustion=0.2, sink=True,
                                                allowed=None, backend="triton")
    expected, _ = constrained_attention_scan(csparsemax, scores, fertility, exhaustion=0.2, sink=True, allowed=None,
                                             backend="torch")
    torch.testing.assert_close(weights, expected)


def test_the_backend_follows_the_device_the_environment_and_what_the_kernels_can_take(monkeypatch):
    monkeypatch.delenv("HF_HEADATTN_KERNELS", raising=False)
    cpu = torch.zeros(2, 3)
    assert kernel_backend(cpu, keys=3) == "torch"
    assert kernel_backend(cpu, "triton", keys=3) == "triton"
    assert kernel_backend(cpu.double(), "triton", keys=3) == "torch"  # the kernels compute in float32
    monkeypatch.setenv("HF_HEADATTN_KERNELS", "triton")
    assert kernel_backend(cpu, keys=3) == "triton" and kernel_backend(cpu, "torch", keys=3) == "torch"
    monkeypatch.setenv("HF_HEADATTN_KERNELS", "cuda")
    with pytest.raises(ValueError, match="HF_HEADATTN_KERNELS must be 'torch' or 'triton'"):
        kernel_backend(cpu, keys=3)
    with pytest.raises(ValueError, match="backend must be one of auto, torch, triton"):
        kernel_backend(cpu, "fused", keys=3)
    assert constrained_attention_scan.__module__ == "hf_headattn.runtime.attention_sparse"


# Compiles each kernel for Hopper (sm_90) at the largest block and prints, per kernel, the resource usage that
# Triton's own cuobjdump reads from the cubin (registers, stack, local memory: spills go to the stack).
COMPILE_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from hf_headattn.runtime import triton_kernels as kernels

    cuobjdump = sys.argv[1]
    block, warps = kernels._block_and_warps(kernels.MAX_KEYS)
    scan_forward = dict(scores="*fp32", stride_sb="i32", stride_sh="i32", stride_st="i32", fertility="*fp32",
                        stride_fb="i32", stride_fh="i32", allowed="*u8", stride_ab="i32", stride_ah="i32",
                        start="*fp32", weights="*fp32", partition="*u8", final="*fp32", heads="i32", targets="i32",
                        keys="i32", sources="i32", exhaustion="fp32")
    scan_backward = dict(grad_weights="*fp32", grad_final="*fp32", weights="*fp32", partition="*u8",
                         grad_scores="*fp32", grad_fertility="*fp32", grad_start="*fp32", targets="i32", keys="i32",
                         sources="i32", exhaustion="fp32")
    cases = []
    for sparse in (False, True):
        cases.append((kernels._constrained_scan_forward, scan_forward,
                      dict(HAS_ALLOWED=True, HAS_START=True, BONUS=True, SPARSE=sparse, BLOCK=block)))
        cases.append((kernels._constrained_scan_backward, scan_backward,
                      dict(HAS_GRAD_WEIGHTS=True, HAS_GRAD_FINAL=True, BONUS=True, SPARSE=sparse, BLOCK=block)))
    cases.append((kernels._sparsemax_forward, dict(scores="*fp32", weights="*fp32", keys="i32"), dict(BLOCK=block)))
    cases.append((kernels._sparsemax_backward, dict(grad_weights="*fp32", weights="*fp32", grad_scores="*fp32",
                                                    keys="i32"), dict(BLOCK=block)))
    folder = tempfile.mkdtemp()
    for kernel, signature, constants in cases:
        names = list(signature) + list(constants)
        source = ASTSource(fn=kernel, signature={**signature, **{name: "constexpr" for name in constants}},
                           constexprs={(names.index(name),): value for name, value in constants.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(compiled.asm["cubin"])
        usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        line = next(line.strip() for line in usage.splitlines() if line.strip().startswith("REG:"))
        print(kernel.__name__, constants.get("SPARSE", ""), line)
    """
)


@needs_triton
def test_every_kernel_compiles_for_sm90_without_spills_or_local_memory():
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"no cuobjdump in triton's wheel ({cuobjdump}) to read the compiled kernels' resource usage")
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, stated (it warns where unset)
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(cuobjdump)], capture_output=True, text=True,
                            env=environment, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 6, result.stdout
    for line in lines:
        usage = dict(field.split(":") for field in line.split()[-8:] if ":" in field)
        assert usage["STACK"] == "0" and usage["LOCAL"] == "0", f"spills or local memory: {line}"
        assert int(usage["REG"]) <= 255, line


# Blocks triton in a fresh interpreter, as on a machine where it is not installed.
WITHOUT_TRITON = textwrap.dedent(
    """
    import importlib.abc, sys

    class BlockTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("triton is deliberately not importable in this process")

    sys.meta_path.insert(0, BlockTriton())
    """
)

LOAD_AND_RUN = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True)
    ids = torch.tensor([[5, 6, 7, 2]])
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
    loss.backward()
    generated = model.generate(input_ids=ids, max_new_tokens=3, num_beams=2)
    print("OK", round(loss.item(), 4), generated.shape[0], "triton" in sys.modules)
    """
)


def test_a_saved_model_loads_and_runs_where_triton_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HEADATTN_KERNELS", raising=False)
    model = random_model(tiny_config(cross_attention="csparsemax", encoder_self_attention="sparsemax"))
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "triton_kernels.py").exists()  # it travels, for where it can run
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRITON + WITHOUT_PACKAGE + LOAD_AND_RUN,
                             str(tmp_path / "model")], capture_output=True, text=True, env=environment, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    status, loss, rows, triton_imported = result.stdout.split()[-4:]
    assert status == "OK" and float(loss) > 0 and rows == "1" and triton_imported == "False", result.stdout
