"""Faster CPU inference: int8 dynamic quantization of a loaded model (:func:`quantize`), and whether this CPU has
native half-precision arithmetic (:func:`cpu_has_any_flag` with :data:`CPU_DTYPE_FLAGS`; without it float16 and
bfloat16 are emulated, slower than float32) or AMX int8 tiles (:data:`AMX_INT8_FLAGS`, used by :func:`quantize`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["AMX_INT8_FLAGS", "CPU_DTYPE_FLAGS", "QUANTIZATIONS", "cpu_has_any_flag", "fold_final_logits_bias",
           "pack_output_layer_for_amx", "quantize"]

QUANTIZATIONS = ("none", "int8")
# The CPU features (Linux /proc/cpuinfo flags) that give PyTorch native arithmetic in a half-precision dtype; without
# one of them it is emulated, several times slower than float32 (float16 matrix products ~5x on an AVX-512 EPYC).
CPU_DTYPE_FLAGS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}
# The CPU feature with which oneDNN's int8 matrix products beat fbgemm's (PyTorch's default, the `x86` engine) on a
# model's output layer: see `pack_output_layer_for_amx`.
AMX_INT8_FLAGS = ("amx_int8",)


def quantize(model, method: str = "int8"):
    """`model` with its `nn.Linear` layers replaced by their int8 dynamically quantized versions (weights stored in
    int8, activations quantized per batch at run time; torch's `quantize_dynamic`), for CPU inference. The attention
    kernels, embeddings, layer norms and LSTM cells keep their float weights, and so do the linear layers a variant
    multiplies by directly (its `weight_read_linears`, e.g. DHICM's W), so every variant runs quantized. On a CPU
    with AMX int8 tiles the output layer runs on oneDNN (`pack_output_layer_for_amx`).

    Raises:
        ValueError: a method other than ``"int8"``, or a model that is not on the CPU.
    """
    import warnings

    import torch

    if method not in QUANTIZATIONS[1:]:
        raise ValueError(f"Unknown quantization {method!r}; accepted: {', '.join(QUANTIZATIONS[1:])}")
    if model.device.type != "cpu":
        raise ValueError(f"int8 dynamic quantization runs on the CPU; the model is on {model.device}")
    kept_float = {f"{name}.{linear}" for name, module in model.named_modules()
                  for linear in getattr(module, "weight_read_linears", ())}
    linears = {name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name not in kept_float}
    with warnings.catch_warnings():  # torch announces the move of this API to torchao; it works as documented
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(model, linears, dtype=torch.qint8)
    fold_final_logits_bias(quantized)
    pack_output_layer_for_amx(quantized)
    return quantized


def fold_final_logits_bias(model) -> None:
    """Move a Transformer's `final_logits_bias` into its int8 output layer's bias, where the quantized GEMM adds it,
    instead of a separate pass over the [rows, vocab] logits at every decoding step (4% of int8 beam search on
    Multi30k). Models whose saved code predates this (no `final_logits_bias_optional`) and the LSTM family keep
    theirs."""
    import torch

    head = getattr(model, "lm_head", None)
    bias = getattr(model, "final_logits_bias", None)
    if (not isinstance(head, torch.ao.nn.quantized.dynamic.Linear) or bias is None
            or not getattr(model, "final_logits_bias_optional", False)):
        return
    folded = bias.reshape(-1).to(torch.float32)
    if head.bias() is not None:
        folded = folded + head.bias()
    head.set_weight_bias(head.weight(), folded)
    model.final_logits_bias = None


def pack_output_layer_for_amx(model) -> bool:
    """Pack an int8 model's output layer (the projection to the vocabulary, `get_output_embeddings()`) for oneDNN's
    kernels instead of fbgemm's, where the CPU has AMX int8 tiles (`AMX_INT8_FLAGS`). Returns whether it did.

    PyTorch packs every dynamically quantized layer for one engine (`torch.backends.quantized.engine`, fbgemm's
    kernels by default), and a packed layer keeps its engine's kernels whatever the setting is later. With AMX,
    oneDNN's product is 1.6-1.8x faster at the output layer's shapes (128 rows by a 256 x 8,000 weight: 0.47-0.51 ms
    against 0.75-0.90; 640 rows 1.46 against 3.99 ms) but slower at the model's small layers (256 x 256: 0.10
    against 0.06 ms), and without AMX it gains little (0.72 against 0.80 ms); so only this layer moves
    (2-core Xeon with AMX: int8 beam 5 over Multi30k's 1,000 test lines 6.72 -> 6.25 s, the same lines)."""
    import torch

    head = model.get_output_embeddings()
    if (not isinstance(head, torch.ao.nn.quantized.dynamic.Linear)
            or "onednn" not in torch.backends.quantized.supported_engines
            or not cpu_has_any_flag(AMX_INT8_FLAGS, if_unknown=False)):
        return False
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    try:
        head.set_weight_bias(head.weight(), head.bias())  # packed again, by the engine in effect
    finally:
        torch.backends.quantized.engine = engine
    return True


def cpu_has_any_flag(flags: Sequence[str], *, if_unknown: bool = True) -> bool:
    """Whether this machine's CPU reports one of `flags`; `if_unknown` where /proc/cpuinfo cannot be read (True by
    default: no warning on a guess)."""
    try:
        reported = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return if_unknown
    return any(flag in reported for flag in flags)
