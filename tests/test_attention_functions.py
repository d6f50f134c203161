"""The stateless variants in any Transformers model: `register_attention_functions()` registers `headattn_sparsemax`,
`headattn_mma` and `headattn_entmax15` with Transformers' AttentionInterface; Marian, BART, T5 (Transformers >= 5.15) and a
Llama-shaped decoder-only model built or loaded with them compute them (checked against this package's own variants
and against eager attention), train a step and `generate` with exact zeros in their attention weights; what a
function cannot run is refused naming the model and the site."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from packaging import version
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers import __version__ as transformers_version
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_headattn
from hf_headattn import HeadAttnForConditionalGeneration
from hf_headattn.runtime.attention_functions import NOT_REGISTERED

from helpers import WITHOUT_PACKAGE, random_model, tiny_config


NAMES = ("headattn_sparsemax", "headattn_mma", "headattn_entmax15")
SEQ2SEQ = dict(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None)
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 1], [11, 12, 13, 1, 0, 0, 0], [14, 15, 16, 17, 18, 1, 0]])
PROMPT = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [0, 0, 0, 20, 21, 22, 23]])  # left-padded
GENERATION = dict(max_new_tokens=6, do_sample=False, output_attentions=True, return_dict_in_generate=True)
T5_USES_THE_INTERFACE = version.parse(transformers_version) >= version.parse("5.15")  # its own attention code before


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert hf_headattn.register_attention_functions() == NAMES
    assert hf_headattn.register_attention_functions() == NAMES  # idempotent
    assert set(NAMES) <= set(ALL_ATTENTION_FUNCTIONS.keys())


def marian(implementation, seed=0):
    torch.manual_seed(seed)
    return MarianMTModel(MarianConfig(**SEQ2SEQ, attn_implementation=implementation)).eval()


def bart(implementation, seed=0):
    torch.manual_seed(seed)
    return BartForConditionalGeneration(BartConfig(**SEQ2SEQ, bos_token_id=2,
                                                   attn_implementation=implementation)).eval()


def t5(implementation, seed=0):
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                               pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                               attn_implementation=implementation)).eval()


def llama(implementation, seed=0, **config):
    """Llama-shaped, with grouped key/value heads (4 query heads share 2 key/value heads)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                        attn_implementation=implementation, **config)).eval()


SEQ2SEQ_MODELS = {"marian": marian, "bart": bart, "t5": t5}
CAUSAL_MMA = {"headattn_mma": {"head_kinds": ["global", "local", "backward", "local"], "window": 1}}


def _train_one_step(model, batch):
    model.train()
    parameters = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(p, parameters[name]) for name, p in model.named_parameters())
    return model.eval()


def _check_distributions(weights_per_step, query_mask=None):
    """Every weight row of real queries sums to one; returns how many weights are exactly zero."""
    zeros = 0
    for layers in weights_per_step:
        for weights in layers:
            sums = weights.sum(-1)
            real = torch.ones_like(sums, dtype=torch.bool) if query_mask is None else query_mask(weights)
            torch.testing.assert_close(sums[real], torch.ones_like(sums[real]))
            zeros += int((weights == 0).sum())
    return zeros


# ------------------------------------------------------------------------------------------------ sparsemax
@pytest.mark.parametrize("family", sorted(SEQ2SEQ_MODELS))
def test_sparsemax_trains_and_generates_with_exact_zeros_in_encoder_decoders(family):
    if family == "t5" and not T5_USES_THE_INTERFACE:
        pytest.skip("T5 calls the attention functions from Transformers 5.15 (its own attention code before)")
    model = SEQ2SEQ_MODELS[family]("headattn_sparsemax")
    assert model.config._attn_implementation == "headattn_sparsemax"
    attention_mask = (SOURCE != 0).long()
    _train_one_step(model, dict(input_ids=SOURCE, attention_mask=attention_mask, labels=SOURCE.masked_fill(
        attention_mask == 0, -100)))
    generated = model.generate(input_ids=SOURCE, attention_mask=attention_mask, num_beams=2, **GENERATION)
    assert generated.sequences.shape[1] > 1
    zeros = _check_distributions([generated.encoder_attentions])
    zeros += _check_distributions(generated.cross_attentions) + _check_distributions(generated.decoder_attentions)
    assert zeros > 0, "sparsemax gave no exact zero"


@pytest.mark.parametrize("variant", ["sparsemax", "entmax15"])
def test_marian_with_a_registered_function_equals_its_variant(variant):
    """The registered function computes what this package's variant of that name computes, at every site."""
    model = marian(f"headattn_{variant}", seed=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" not in name:  # Marian's fixed position table
                parameter.normal_(0.0, 0.3)
    ours = HeadAttnForConditionalGeneration.from_marian(model, encoder_self_attention=variant,
                                                        decoder_self_attention=variant, cross_attention=variant)
    attention_mask = (SOURCE != 0).long()
    decoder_input_ids = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 10], [0, 11, 12, 13]])
    with torch.no_grad():
        theirs = model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        mine = ours(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(theirs.logits, mine.logits, atol=1e-5, rtol=1e-5)
    theirs = model.generate(input_ids=SOURCE, attention_mask=attention_mask, num_beams=3, max_new_tokens=8)
    mine = ours.generate(input_ids=SOURCE, attention_mask=attention_mask, num_beams=3, max_new_tokens=8)
    assert torch.equal(theirs, mine)


def test_marian_loads_with_headattn_sparsemax(tmp_path):
    marian("eager").save_pretrained(tmp_path / "marian")
    loaded = MarianMTModel.from_pretrained(tmp_path / "marian", attn_implementation="headattn_sparsemax")
    assert loaded.config._attn_implementation == "headattn_sparsemax"
    loaded.set_attn_implementation("headattn_mma")  # set_attn_implementation takes them too
    assert loaded.config._attn_implementation == "headattn_mma"


def test_decoder_only_model_trains_and_generates_with_sparsemax():
    model = llama("headattn_sparsemax")
    attention_mask = (PROMPT != 0).long()
    _train_one_step(model, dict(input_ids=PROMPT, attention_mask=attention_mask,
                                labels=PROMPT.masked_fill(attention_mask == 0, -100)))
    generated = model.generate(input_ids=PROMPT, attention_mask=attention_mask, **GENERATION)
    # the prompt step: rows of real (not padding) queries are distributions; padding queries see nothing
    prompt_weights = generated.attentions[0]
    zeros = _check_distributions([prompt_weights], lambda w: attention_mask.bool()[:, None, :].expand(w.shape[:-1]))
    zeros += _check_distributions(generated.attentions[1:])
    assert zeros > 0
    for weights in prompt_weights:  # causal: no weight on later positions
        assert torch.triu(weights, diagonal=1).abs().max() == 0


# ------------------------------------------------------------------------------------------------ mma
def test_decoder_only_model_trains_and_generates_with_mma():
    model = llama("headattn_mma", **CAUSAL_MMA)
    attention_mask = (PROMPT != 0).long()
    _train_one_step(model, dict(input_ids=PROMPT, attention_mask=attention_mask,
                                labels=PROMPT.masked_fill(attention_mask == 0, -100)))
    generated = model.generate(input_ids=PROMPT, attention_mask=attention_mask, **GENERATION)
    length = PROMPT.shape[1]
    positions = torch.arange(length)
    far = (positions[:, None] - positions[None, :]).abs() > 1
    real_queries = attention_mask.bool()[:, None, :, None]  # padding queries see no key: softmax spreads them evenly
    _check_distributions(generated.attentions[1:])
    for weights in generated.attentions[0]:  # the prompt: [batch, heads, queries, keys]
        weights = weights * real_queries
        assert torch.triu(weights, diagonal=1).abs().max() == 0
        for head in (1, 3):  # local heads: exactly zero beyond the window
            assert weights[:, head][:, far].abs().max() == 0
        assert (weights[:, 0][:, far & (positions[:, None] > positions[None, :])] > 0).any()  # global heads see far
    for step in generated.attentions[1:]:  # cached steps: one query at the last position
        for weights in step:
            keys = weights.shape[-1]
            assert weights[:, 1, 0, : keys - 2].abs().max() == 0 and weights[:, 3, 0, : keys - 2].abs().max() == 0


def test_mma_with_only_global_heads_is_softmax_attention():
    config = {"headattn_mma": {"head_kinds": ["global"] * 4}}
    model, eager = llama("headattn_mma", **config), llama("eager")
    eager.load_state_dict(model.state_dict())
    attention_mask = (PROMPT != 0).long()
    with torch.no_grad():
        logits = model(input_ids=PROMPT, attention_mask=attention_mask).logits
        expected = eager(input_ids=PROMPT, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=1e-5)


def test_mma_is_refused_in_a_cross_attention_naming_the_model_and_the_site():
    model = marian("headattn_mma")
    model.config.headattn_mma = {"head_kinds": ["global", "local", "backward", "local"]}
    attention_mask = (SOURCE != 0).long()
    with pytest.raises(ValueError, match=r"headattn_mma cannot run in the marian model's MarianAttention \(layer 0\), "
                                         r"a cross-attention"):
        model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=SOURCE[:, :3])


def test_mma_options_are_checked_naming_the_model_and_the_field():
    with pytest.raises(ValueError, match=r"the llama model's LlamaAttention \(layer 0\), a causal self-attention.*"
                                         r"'forward' heads.*config.headattn_mma"):
        llama("headattn_mma")(input_ids=PROMPT)  # the default split has forward heads
    with pytest.raises(ValueError, match=r"headattn_mma.*`window`"):
        llama("headattn_mma", headattn_mma={"head_kinds": ["global"] * 4, "window": -1})(input_ids=PROMPT)
    with pytest.raises(ValueError, match=r"config.headattn_mma .* must be a dict with `window` and `head_kinds`"):
        llama("headattn_mma", headattn_mma={"heads": 2})(input_ids=PROMPT)
    with pytest.raises(ValueError, match=r"one kind per head \(4"):
        llama("headattn_mma", headattn_mma={"head_kinds": ["global"] * 3})(input_ids=PROMPT)


# ------------------------------------------------------------------------------------------------ in this package
def test_headattn_models_run_the_registered_functions_at_their_softmax_sites():
    """In a HeadAttn model, `attn_implementation="headattn_sparsemax"` replaces the softmax of every softmax site: the
    same as placing the sparsemax variant at every site."""
    softmax = random_model(tiny_config(attn_implementation="headattn_sparsemax"))
    assert softmax.config._attn_implementation == "headattn_sparsemax"
    sparse = random_model(tiny_config(encoder_self_attention="sparsemax", decoder_self_attention="sparsemax",
                                      cross_attention="sparsemax"))
    sparse.load_state_dict(softmax.state_dict())
    attention_mask = (SOURCE != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(
            softmax(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=SOURCE[:, :4]).logits,
            sparse(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=SOURCE[:, :4]).logits)


@pytest.mark.parametrize("variant", sorted(NOT_REGISTERED))
def test_variants_that_cannot_be_functions_say_why(variant):
    with pytest.raises(ValueError, match=rf"headattn_{variant}.*{variant} is no attention function: "
                                         rf"{NOT_REGISTERED[variant][:30]}"):
        HeadAttnForConditionalGeneration(tiny_config(attn_implementation=f"headattn_{variant}"))


# ------------------------------------------------------------------------------------------------ remote code
REMOTE_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import torch
    from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    folder, marian_folder, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    register = get_class_from_dynamic_module("attention_functions.register_attention_functions", folder)
    assert not register.__module__.startswith("hf_headattn"), register.__module__
    names = register()
    batch = {name: torch.tensor(value) for name, value in inputs.items()}
    marian = MarianMTModel.from_pretrained(marian_folder, attn_implementation="headattn_sparsemax").eval()
    ours = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True,
                                                 attn_implementation="headattn_sparsemax").eval()
    with torch.no_grad():
        result = {"names": names, "marian": marian(**batch).logits.tolist(), "ours": ours(**batch).logits.tolist(),
                  "implementation": ours.config._attn_implementation}
    print("RESULT" + json.dumps(result))
    """
)


def test_a_saved_models_code_registers_the_functions_where_the_package_is_missing(tmp_path):
    """The functions travel in a saved model's code: a user without hf_headattn registers them from the folder and runs
    them in MarianMTModel and in the saved model itself."""
    model = marian("eager", seed=3)
    model.save_pretrained(tmp_path / "marian")
    ours = HeadAttnForConditionalGeneration.from_marian(model)
    ours.save_pretrained(tmp_path / "ours")
    attention_mask = (SOURCE != 0).long()
    decoder_input_ids = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 10], [0, 11, 12, 13]])
    inputs = {"input_ids": SOURCE.tolist(), "attention_mask": attention_mask.tolist(),
              "decoder_input_ids": decoder_input_ids.tolist()}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run([sys.executable, "-c", REMOTE_SCRIPT, str(tmp_path / "ours"), str(tmp_path / "marian"),
                           json.dumps(inputs)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    assert result["names"] == list(NAMES) and result["implementation"] == "headattn_sparsemax"
    sparse = HeadAttnForConditionalGeneration.from_marian(model, encoder_self_attention="sparsemax",
                                                          decoder_self_attention="sparsemax", cross_attention="sparsemax")
    with torch.no_grad():
        expected = sparse(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(torch.tensor(result["marian"]), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(result["ours"]), expected, atol=1e-5, rtol=1e-5)
