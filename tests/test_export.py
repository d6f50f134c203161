"""torch.export of both model families: the exported program gives the eager logits (to 1e-5), with static shapes and,
for the Transformer, dynamic batch and lengths (run on other sizes than it was traced with); Transformers'
`export_for_generation` (prefill + decode with the cache); what cannot be exported fails with an error that says
why. The fast tests cover one model of each kind; `-m slow` runs every variant."""

import copy

import pytest
import torch
from torch.export import Dim
from transformers.exporters.configs import DynamoConfig
from transformers.exporters.exporter_dynamo import DynamoExporter
from transformers.exporters.utils import decompose_for_generation, prepare_for_export

from hf_headattn.runtime.sparse_attention import csoftmax, csparsemax, entmax15, entmax_bisect, sparsemax
from hf_headattn.runtime.sparse_solvers import _SORT_BELOW

from helpers import (PAD, RNN_CONFIGS, TRANSFORMER_VARIANTS, random_model, random_rnn_model, rnn_config, source_batch,
                     tiny_config)


ATOL = 1e-5
# Variants that loop over target positions (their state at step t depends on steps < t): the target length of an
# exported program is static, batch and source length may still be dynamic.
LOOPS_OVER_TARGET = {"running_sum", "csoftmax", "csparsemax", "csparsemax-no-sink"}


def decoder_inputs(batch: int, length: int, seed: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 64, (batch, length), generator=generator)
    ids[:, 0] = PAD  # the decoder start token
    return ids


def model_inputs(lengths=(7, 4, 9), target_length=4, seed=1):
    input_ids, attention_mask = source_batch(lengths, seed=seed)
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                decoder_input_ids=decoder_inputs(len(lengths), target_length, seed + 1), use_cache=False)


def export(model, inputs, dynamic_shapes=None):
    with torch.no_grad():
        return torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes)


def assert_exported_logits_equal_eager(program, model, inputs):
    with torch.no_grad():
        expected = model(**inputs).logits
        actual = program.module()(**inputs).logits
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=ATOL)


def dynamic_shapes(target_dynamic: bool = True):
    batch, source, target = Dim("batch", min=1, max=64), Dim("source", min=2, max=60), Dim("target", min=2, max=60)
    return {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source},
            "decoder_input_ids": {0: batch, 1: target} if target_dynamic else {0: batch}, "use_cache": None}


def check_transformer_variant(variant, dynamic):
    model = random_model(tiny_config(**TRANSFORMER_VARIANTS[variant]))
    inputs = model_inputs()
    if not dynamic:
        assert_exported_logits_equal_eager(export(model, inputs), model, inputs)
        return
    target_dynamic = variant not in LOOPS_OVER_TARGET
    program = export(model, inputs, dynamic_shapes(target_dynamic))
    for other in (model_inputs((5, 11), 6 if target_dynamic else 4, seed=5), model_inputs((3,), 3 if target_dynamic else 4)):
        assert_exported_logits_equal_eager(program, model, other)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_softmax_model_exports(dynamic):
    check_transformer_variant("softmax", dynamic)


def test_softmax_model_exports_with_dynamo_strict_mode():
    """strict=True traces with Dynamo (as Transformers' executorch wrappers export): dynamic lengths work there too."""
    model = random_model(tiny_config())
    with torch.no_grad():
        program = torch.export.export(model, (), model_inputs(), dynamic_shapes=dynamic_shapes(), strict=True)
    assert_exported_logits_equal_eager(program, model, model_inputs((5, 11), 6, seed=5))


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("variant", [name for name in TRANSFORMER_VARIANTS if name != "softmax"])
def test_every_variant_exports(variant, dynamic):
    check_transformer_variant(variant, dynamic)


@pytest.mark.parametrize("variant, fertility", [
    pytest.param(variant, fertility, marks=[] if (variant, fertility) == ("csparsemax", "constant") else pytest.mark.slow)
    for variant in ("csoftmax", "csparsemax") for fertility in ("constant", "guided", "predicted")
])
def test_constrained_attention_exports_with_every_fertility(variant, fertility):
    model = random_model(tiny_config(cross_attention=variant, fertility=fertility, constant_fertility=1.0))
    if fertility == "guided":
        with torch.no_grad():
            model.model.encoder.source_fertility.guided_fertility.copy_(torch.randint(1, 3, (64,)).float())
    inputs = model_inputs()
    assert_exported_logits_equal_eager(export(model, inputs), model, inputs)
    # dynamic batch (and source length, except for PREDICTED, whose bi-LSTM tagger loops over the source)
    shapes = dynamic_shapes(target_dynamic=False)
    if fertility == "predicted":
        batch = shapes["input_ids"][0]
        shapes["input_ids"] = shapes["attention_mask"] = {0: batch}
    program = export(model, inputs, shapes)
    other = model_inputs((9, 9) if fertility == "predicted" else (5, 11), 4, seed=7)
    assert_exported_logits_equal_eager(program, model, other)


def test_a_loop_over_target_positions_refuses_a_dynamic_target_length():
    model = random_model(tiny_config(cross_attention="running_sum"))
    with pytest.raises(RuntimeError, match="running_sum attention's loop over target positions with a dynamic length"):
        export(model, model_inputs(), dynamic_shapes())


# ------------------------------------------------------------------------------------------------ kernels
KERNELS = {
    "sparsemax": lambda z, u, mask: sparsemax(z, mask=mask),
    "csoftmax": csoftmax,
    "csparsemax": csparsemax,
    "entmax15": lambda z, u, mask: entmax15(z, mask=mask),
    # alpha per row from the bounds (some of them outside (1, 2]: NaN rows)
    "entmax_bisect": lambda z, u, mask: entmax_bisect(z, 1.2 + u[..., :1] * 1.9, mask=mask),
}


@pytest.mark.parametrize("transform", list(KERNELS))
def test_exported_kernels_equal_eager(transform):
    """Exported, the kernels sort every input (the eager active-set passes branch on the data): same values, on an
    input large enough for the passes, with masked keys, -inf scores, NaN rows and infeasible rows."""

    class Kernel(torch.nn.Module):
        def forward(self, z, u, mask):
            return KERNELS[transform](z, u, mask=mask)

    generator = torch.Generator().manual_seed(0)

    def kernel_inputs(rows, keys):
        z = torch.randn(2, rows, keys, generator=generator) * 3
        u = torch.rand(2, rows, keys, generator=generator) * 0.5
        u[:, 0] = 0.01  # infeasible rows: the bounds sum to less than 1
        z[0, 1, 3] = float("-inf")
        z[1, 2, 5] = float("nan")
        mask = torch.rand(2, 1, keys, generator=generator) > 0.2
        return z, u, mask

    inputs = kernel_inputs(64, 80)
    assert inputs[0].numel() >= _SORT_BELOW  # eager runs the active-set passes here
    rows, keys = Dim("rows", min=2, max=512), Dim("keys", min=3, max=512)
    program = torch.export.export(Kernel(), inputs, dynamic_shapes=({1: rows, 2: keys}, {1: rows, 2: keys}, {2: keys}))
    for z, u, mask in (inputs, kernel_inputs(128, 96)):
        expected = Kernel()(z, u, mask)
        torch.testing.assert_close(program.module()(z, u, mask), expected, rtol=0, atol=1e-6, equal_nan=True)


# ------------------------------------------------------------------------------------------------ LSTM
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[] if name in ("2x2-dependent", "csparsemax-predicted-no-sink") else pytest.mark.slow)
    for name in RNN_CONFIGS
])
def test_rnn_model_exports_with_static_shapes(name):
    model = random_rnn_model(rnn_config(**RNN_CONFIGS[name]))
    inputs = model_inputs()
    assert_exported_logits_equal_eager(export(model, inputs), model, inputs)


def test_rnn_export_with_a_dynamic_length_names_the_loop():
    model = random_rnn_model(rnn_config())
    with pytest.raises(RuntimeError, match="LSTM's loop over source positions .* with a dynamic length"):
        export(model, model_inputs(), dynamic_shapes())
    shapes = dynamic_shapes()
    batch = shapes["input_ids"][0]
    shapes["input_ids"] = shapes["attention_mask"] = {0: batch}
    with pytest.raises(RuntimeError, match="LSTM decoder's loop over target positions with a dynamic length"):
        export(model, model_inputs(), shapes)


# ------------------------------------------------------------------------------------------------ generation
def check_export_for_generation(variant, dynamic):
    """Transformers' exporter splits generation into a prefill and a decode step (the cache, variant states
    included, as program inputs); each program gives eager's logits, also the decode step fed another batch's cache
    (so the state is an input, not a constant of the graph). `generate` runs the encoder before the prefill, so the
    programs hold the decoder."""
    model = variant if isinstance(variant, torch.nn.Module) else random_model(tiny_config(**TRANSFORMER_VARIANTS[variant]))
    input_ids, attention_mask = source_batch()
    exported = DynamoExporter().export_for_generation(
        model, {"input_ids": input_ids, "attention_mask": attention_mask}, DynamoConfig(dynamic=dynamic))
    assert set(exported.components) == {"prefill", "decode"}
    other_ids, other_mask = source_batch(seed=9)
    for source in ((input_ids, attention_mask), (other_ids, other_mask)):
        for stage, (submodel, stage_inputs) in decompose_for_generation(
                model, {"input_ids": source[0], "attention_mask": source[1]}).items():
            with torch.no_grad():
                expected = submodel(**copy.deepcopy(stage_inputs)).logits
                _, flat_inputs, _ = prepare_for_export(submodel, copy.deepcopy(stage_inputs))
                actual = exported.components[stage].program.module()(**flat_inputs).logits
            torch.testing.assert_close(actual, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("dynamic", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "dynamic"])
def test_softmax_model_exports_for_generation(dynamic):
    check_export_for_generation("softmax", dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("variant", [name for name in TRANSFORMER_VARIANTS if name != "softmax"])
def test_every_variant_exports_for_generation(variant, dynamic):
    check_export_for_generation(variant, dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["2x2-dependent", "csparsemax-guided"])
def test_rnn_model_exports_for_generation(name):
    check_export_for_generation(random_rnn_model(rnn_config(**RNN_CONFIGS[name])), dynamic=False)


def test_executorch_static_cache_wrapper_is_refused_with_the_reason():
    """`Seq2SeqLMExportableModule` (which exports MarianMTModel) decodes with a StaticCache, whose length is a tensor;
    the decoder refuses it by name rather than failing inside torch.export on a data-dependent branch."""
    from transformers.integrations.executorch import Seq2SeqLMExportableModule

    model = random_model(tiny_config())
    input_ids, _ = source_batch((5,))
    wrapper = Seq2SeqLMExportableModule(model, batch_size=1, max_hidden_seq_length=32, max_cache_length=16)
    with pytest.raises(Exception, match="static cache .* holds unfilled slots"):
        wrapper.export(encoder_input_ids=input_ids)
