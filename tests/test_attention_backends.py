"""Transformers' attention backends (`AttentionInterface`) in the model: `attn_implementation` in `from_pretrained`,
`from_config` and `set_attn_implementation` picks the function every softmax site calls (eager, sdpa, flex attention,
flash attention, any registered function); the backends agree with each other in training and cached decoding;
variants with their own kernels say so; what a backend cannot run is refused naming the site."""

import json
import os
import re
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, masking_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from hf_headattn import HeadAttnForConditionalGeneration
from hf_headattn.runtime import attention_backends
from hf_headattn.runtime.attention_backends import cpu_flex_problem
from hf_headattn.runtime.variant_checks import check_attention_implementation
from hf_headattn.runtime.transformers_compat import cache_of

from helpers import WITHOUT_PACKAGE, random_model, source_batch, tiny_config


# The variants whose attention weights are a softmax, hence computed by the attention backend
SOFTMAX_FAMILY = {
    "softmax": {},
    "mma": {"encoder_self_attention": "mma",
            "decoder_self_attention": {"type": "mma", "head_kinds": ["global", "local", "backward", "local"]}},
    "dhicm": {"encoder_self_attention": {"type": "dhicm", "layers": [0, 1]}, "cross_attention": "dhicm"},
    "multihop": {"cross_attention": {"type": "multihop", "hops": 2}},
}
GENERATION = dict(max_new_tokens=8, do_sample=False, no_repeat_ngram_size=1)
DECODER_INPUT_IDS = torch.tensor([[0, 5, 6, 7, 8], [0, 9, 10, 11, 12], [0, 13, 14, 15, 16]])


def _batch():
    input_ids, attention_mask = source_batch((7, 4, 9))
    return input_ids, attention_mask


def _logits(model, implementation, **kwargs):
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS,
                     **kwargs).logits


def _cached_step_logits(model, implementation):
    """The logits of three cached decoding steps after a two-token prefix: what generate computes."""
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = _batch()
    steps = []
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS[:, :2],
                    use_cache=True)
        encoder_outputs = (out.encoder_last_hidden_state,)
        for position in range(2, 5):
            out = model(attention_mask=attention_mask, encoder_outputs=encoder_outputs,
                        decoder_input_ids=DECODER_INPUT_IDS[:, position:position + 1], use_cache=True,
                        past_key_values=cache_of(out))
            steps.append(out.logits)
    return torch.cat(steps, dim=1)


@contextmanager
def registered(name, function, mask_function=None):
    """`function` registered with Transformers' AttentionInterface under `name` for the block (and its mask function)."""
    AttentionInterface.register(name, function)
    if mask_function is not None:
        masking_utils.AttentionMaskInterface.register(name, mask_function)
    try:
        yield
    finally:
        AttentionInterface._global_mapping.pop(name, None)
        masking_utils.AttentionMaskInterface._global_mapping.pop(name, None)


# ------------------------------------------------------------------------------------------------ choosing
def test_attn_implementation_is_chosen_at_load_at_build_and_later(tmp_path):
    model = random_model(tiny_config(**SOFTMAX_FAMILY["mma"]))
    assert model.config._attn_implementation == "sdpa"
    model.save_pretrained(tmp_path / "model")
    for implementation in ("eager", "flex_attention", "sdpa"):
        loaded = HeadAttnForConditionalGeneration.from_pretrained(tmp_path / "model",
                                                                  attn_implementation=implementation)
        assert loaded.config._attn_implementation == implementation
        built = AutoModelForSeq2SeqLM.from_config(model.config, attn_implementation=implementation)
        assert built.config._attn_implementation == implementation
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        # every module reads the model's own config, so the change reaches them all
        assert all(module.config is model.config for module in model.modules() if hasattr(module, "scaling"))


def test_every_softmax_site_calls_the_chosen_function_and_the_others_keep_their_kernels():
    calls = []

    def counting_sdpa(module, *args, **kwargs):
        calls.append(f"{module.site}.{module.layer_idx}")
        return sdpa_attention_forward(module, *args, **kwargs)

    softmax = random_model(tiny_config())
    sparse_cross = random_model(tiny_config(cross_attention="sparsemax"))
    sparse_cross.load_state_dict(softmax.state_dict())
    with registered("counting_sdpa", counting_sdpa):
        reference = _logits(softmax, "sdpa")
        torch.testing.assert_close(_logits(softmax, "counting_sdpa"), reference)
        assert sorted(calls) == sorted(f"{site}.{layer}" for site in ("encoder_self_attention",
                                                                      "decoder_self_attention", "cross_attention")
                                       for layer in (0, 1))
        calls.clear()
        _logits(sparse_cross, "counting_sdpa")
        assert not any(call.startswith("cross_attention") for call in calls) and len(calls) == 4


def test_unknown_implementation_says_it_in_transformers_words_and_names_the_accepted_ones():
    from transformers import MarianConfig, MarianMTModel

    with pytest.raises(ValueError) as marians:
        MarianMTModel(MarianConfig(vocab_size=8, d_model=8, attn_implementation="no_such_attention"))
    transformers_words = str(marians.value).split(". ")[0] + "."
    assert transformers_words == 'Specified `attn_implementation="no_such_attention"` is not supported.'
    with pytest.raises(ValueError) as ours:
        HeadAttnForConditionalGeneration(tiny_config(attn_implementation="no_such_attention"))
    assert str(ours.value).startswith(f"{transformers_words} Accepted: eager, ")
    assert re.search(r"Accepted: eager, .*flex_attention.*sdpa", str(ours.value))
    model = random_model(tiny_config())
    with pytest.raises(ValueError, match=re.escape(f"{transformers_words} Accepted: eager")):
        model.set_attn_implementation("no_such_attention")
    assert model.config._attn_implementation == "sdpa"


def test_flash_attention_without_its_package_is_refused_not_replaced():
    model = random_model(tiny_config())
    with pytest.raises((ImportError, ValueError), match="(?i)flash"):
        model.set_attn_implementation("flash_attention_2")
    assert model.config._attn_implementation == "sdpa"


def _flash_like(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """What a flash kernel computes from what it gets (a 2-D padding mask and `is_causal`), written with SDPA."""
    assert attention_mask is None or attention_mask.dim() == 2
    allowed = torch.ones(query.shape[0], 1, query.shape[2], key.shape[2], dtype=torch.bool)
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    if is_causal:
        offset = key.shape[2] - query.shape[2]
        allowed = allowed & torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).tril(offset)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    return output.transpose(1, 2), None


def test_a_flash_like_kernel_gets_padding_masks_and_refuses_per_head_masks():
    """Hub kernels register with flash attention's mask function: the model gives them the 2-D padding mask and
    `is_causal` (checked here on the CPU through an SDPA stand-in), and refuses them for mma, naming the sites."""
    model = random_model(tiny_config())
    with registered("padding_mask_kernel", _flash_like, masking_utils.flash_attention_mask):
        torch.testing.assert_close(_logits(model, "padding_mask_kernel"), _logits(model, "eager"), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(_cached_step_logits(model, "padding_mask_kernel"), _cached_step_logits(model, "eager"),
                                   atol=1e-5, rtol=1e-5)
        mma = random_model(tiny_config(**SOFTMAX_FAMILY["mma"]))
        with pytest.raises(ValueError, match=r"padding_mask_kernel.*`encoder_self_attention` of layers 0, 1 \(mma\).*own mask"):
            mma.set_attn_implementation("padding_mask_kernel")
        assert mma.config._attn_implementation == "sdpa"
        with pytest.raises(ValueError, match="decoder_self_attention"):
            check_attention_implementation(mma.config, "flash_attention_2")


def test_own_kernels_are_named_when_another_backend_is_chosen(caplog):
    model = random_model(tiny_config(cross_attention="csparsemax", encoder_self_attention="sparsemax"))
    model.set_attn_implementation("eager")
    assert "own kernels" not in caplog.text
    model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "flex_attention"
    assert "`encoder_self_attention` of layers 0, 1 (sparsemax)" in caplog.text
    assert "`cross_attention` of layers 0, 1 (csparsemax)" in caplog.text


# ------------------------------------------------------------------------------------------------ equality
@pytest.mark.parametrize("variant", sorted(SOFTMAX_FAMILY))
def test_sdpa_equals_eager_in_training_and_cached_decoding(variant):
    model = random_model(tiny_config(**SOFTMAX_FAMILY[variant]), std=0.1)
    torch.testing.assert_close(_logits(model, "sdpa"), _logits(model, "eager"), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_cached_step_logits(model, "sdpa"), _cached_step_logits(model, "eager"), atol=1e-5,
                               rtol=1e-5)
    input_ids, attention_mask = _batch()
    labels = DECODER_INPUT_IDS[:, 1:]
    gradients = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        model.train().zero_grad()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        gradients[implementation] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.eval()
    for name, gradient in gradients["eager"].items():
        torch.testing.assert_close(gradients["sdpa"][name], gradient, atol=1e-5, rtol=1e-4)


def _teacher_forced_log_probs(model, input_ids, attention_mask, sequences):
    """log p(token | prefix) of each token after the first of `sequences`, from one full (uncached) pass."""
    per_source = sequences.shape[0] // input_ids.shape[0]
    sources, source_mask = (tensor.repeat_interleave(per_source, dim=0) for tensor in (input_ids, attention_mask))
    with torch.no_grad():
        logits = model(input_ids=sources, attention_mask=source_mask, decoder_input_ids=sequences[:, :-1]).logits
    return logits.log_softmax(-1).gather(-1, sequences[:, 1:, None])[..., 0]


def _assert_beam_scores_are_the_models(model, implementation, reference="eager"):
    """Beam search with `implementation` (cached steps, beams reordered every step) scores each token of its final
    beams as one full pass of `reference` does. The ids themselves may differ from `reference`'s beam search: on a
    near-tie a kernel's rounding picks another candidate (an AVX2 AMD EPYC did, where AVX-512 Xeons did not)."""
    input_ids, attention_mask = _batch()
    model.set_attn_implementation(implementation)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, num_return_sequences=3,
                         output_scores=True, return_dict_in_generate=True, **GENERATION)
    step_scores = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=False)
    model.set_attn_implementation(reference)
    full_pass = _teacher_forced_log_probs(model, input_ids, attention_mask, out.sequences)
    generated = out.beam_indices[:, :step_scores.shape[1]] >= 0
    assert generated[:, 0].all()
    torch.testing.assert_close(step_scores[generated], full_pass[generated], atol=1e-4, rtol=1e-4)


def _assert_flex_equals_eager(model, beam_search: bool = True):
    torch.testing.assert_close(_logits(model, "flex_attention"), _logits(model, "eager"), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_cached_step_logits(model, "flex_attention"), _cached_step_logits(model, "eager"),
                               atol=1e-5, rtol=1e-5)
    if beam_search:
        _assert_beam_scores_are_the_models(model, "flex_attention")


def _assert_flex_equals_eager_or_is_refused(model, beam_search: bool = True):
    """Where this CPU's compiled flex kernel is wrong (`cpu_flex_problem`), flex attention is refused with that reason
    before any output; elsewhere it gives eager's results (in beam search too, with `beam_search`)."""
    problem = cpu_flex_problem()
    if problem is None:
        _assert_flex_equals_eager(model, beam_search)
        return
    model.set_attn_implementation("flex_attention")
    input_ids, attention_mask = _batch()
    with pytest.raises(ValueError, match="flex_attention is refused on this CPU") as refused:
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=DECODER_INPUT_IDS)
    assert str(refused.value) == problem


def test_flex_attention_equals_eager_with_per_head_masks_on_cpu():
    """Compiled flex attention (torch.compile, on the CPU) with block masks for padding, causality and mma's heads,
    in a full pass and cached steps; or refused, naming why, on a CPU where PyTorch's kernel is wrong."""
    _assert_flex_equals_eager_or_is_refused(random_model(tiny_config(**SOFTMAX_FAMILY["mma"]), std=0.1),
                                            beam_search=False)


@pytest.mark.slow
def test_flex_attention_beam_search_scores_are_the_models_with_per_head_masks_on_cpu():
    """The same in beam search: compiled for fixed shapes, flex attention compiles again at every step's cache length
    (about 4 minutes of the default suite on 2 loaded cores, hence slow)."""
    _assert_flex_equals_eager_or_is_refused(random_model(tiny_config(**SOFTMAX_FAMILY["mma"]), std=0.1))


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(set(SOFTMAX_FAMILY) - {"mma"}))
def test_flex_attention_equals_eager_for_every_softmax_variant(variant):
    _assert_flex_equals_eager_or_is_refused(random_model(tiny_config(**SOFTMAX_FAMILY[variant]), std=0.1))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_cpu_flex_check_compares_the_kernel_with_sdpa(monkeypatch):
    """The check itself: None where compiled flex attention gives SDPA's outputs, a reason naming the kernel's error
    where it does not (a stand-in kernel that spoils the last sentence, as the AVX2 EPYC's did)."""
    from torch.nn.attention.flex_attention import flex_attention

    def spoiling_the_last_sentence():
        def compiled(query, key, value, block_mask):
            output = flex_attention(query, key, value, block_mask=block_mask).clone()
            output[-1] += 0.5
            return output
        return compiled

    monkeypatch.setattr(attention_backends, "compiled_flex_attention", lambda: flex_attention)  # unfused: exact
    cpu_flex_problem.cache_clear()
    try:
        assert cpu_flex_problem() is None
        cpu_flex_problem.cache_clear()
        monkeypatch.setattr(attention_backends, "compiled_flex_attention", spoiling_the_last_sentence)
        assert re.fullmatch(r"flex_attention is refused on this CPU: PyTorch .*'s compiled CPU kernel gives outputs "
                            r"up to 0\.5 away from SDPA's for the last of 3 short sentences .*", cpu_flex_problem())
    finally:
        cpu_flex_problem.cache_clear()


def test_flex_attention_cannot_train_on_the_cpu():
    """PyTorch 2.13's flex attention has no backward on the CPU: training with it raises there (and runs on a GPU);
    `docs/variants.md` says so. When PyTorch adds it, this test fails and the benchmark gains the row."""
    model = random_model(tiny_config(), std=0.1).train()
    model.set_attn_implementation("flex_attention")
    input_ids, attention_mask = _batch()
    with pytest.raises((NotImplementedError, ValueError), match="backward on CPU|refused on this CPU"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=DECODER_INPUT_IDS[:, 1:])


# ------------------------------------------------------------------------------------------------ remote code
REMOTE_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import torch
    from transformers import AutoModelForSeq2SeqLM

    folder, implementation, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, attn_implementation=implementation)
    assert not type(model).__module__.startswith("hf_headattn"), type(model).__module__
    batch = {name: torch.tensor(value) for name, value in inputs.items()}
    with torch.no_grad():
        logits = model(**batch).logits
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(**batch).logits
    print("RESULT" + json.dumps({"implementation": model.config._attn_implementation, "logits": logits.tolist(),
                                 "eager": eager.tolist()}))
    """
)


def test_remote_code_takes_attn_implementation(tmp_path):
    model = random_model(tiny_config(**SOFTMAX_FAMILY["mma"]), std=0.1)
    model.save_pretrained(tmp_path / "model")
    input_ids, attention_mask = _batch()
    inputs = {"input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist(),
              "decoder_input_ids": DECODER_INPUT_IDS.tolist()}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run([sys.executable, "-c", REMOTE_SCRIPT, str(tmp_path / "model"), "sdpa", json.dumps(inputs)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    expected = _logits(model, "eager")
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(result["eager"]), expected, atol=1e-5, rtol=1e-5)
    assert result["implementation"] == "eager"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_masks_match_pytorchs_over_many_blocks():
    """The BlockMask built from the masks' structure at block granularity (`block_mask`) selects the blocks PyTorch's
    create_block_mask selects, and flex attention with it computes what SDPA computes with the dense mask, over
    sequences of several 128-position blocks, with padding, causality and mma's heads."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from hf_headattn import AttentionMask
    from hf_headattn.runtime.attention_backends import additive_mask, block_mask
    from hf_headattn.runtime.attention_mma import HeadKindMask

    lengths, num_queries, num_keys = (300, 170), 260, 300
    padding = (torch.arange(num_keys)[None, :] < torch.tensor(lengths)[:, None]).long()
    causal_allowed = torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)
    for causal in (False, True):
        allowed = padding.bool()[:, None, None, :] & (causal_allowed if causal else True)
        mask = AttentionMask(allowed, padding=padding, causal=causal)
        heads = HeadKindMask(["global", "local", "backward", "forward" if not causal else "local"], 2, num_queries,
                             num_keys, "cpu")
        ours = block_mask(mask, heads, 2, 4, num_queries, num_keys, "cpu")
        dense = heads.dense()[None] & allowed
        theirs = create_block_mask(lambda b, h, q, kv: dense[b, h, q, kv], 2, 4, num_queries, num_keys, device="cpu")
        assert torch.equal(ours.to_dense(), theirs.to_dense())
        query, key, value = (torch.randn(2, 4, length, 8, generator=torch.Generator().manual_seed(length))
                             for length in (num_queries, num_keys, num_keys))
        expected = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=additive_mask(mask, heads, torch.float32))
        real = padding.bool()[:, None, -num_queries:, None]  # padding queries may see nothing: flex gives 0 there
        output = flex_attention(query, key, value, block_mask=ours)  # eager flex: the unfused reference
        torch.testing.assert_close(output * real, expected * real, atol=1e-5, rtol=1e-5)
