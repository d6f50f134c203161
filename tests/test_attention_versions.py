"""Issue 31, item 3: the attention backends and the registered attention functions on every supported Transformers
release, inside the remote code of a saved model. In a clean environment per release (torch and that Transformers,
no hf_headattn; see transformers_envs.py), a saved HeadAttn folder with mma self-attention loads through its own code
with attn_implementation eager, sdpa and flex_attention and switches with set_attn_implementation, giving this
package's logits; the folder's attention_functions registers headattn_sparsemax and headattn_mma, with which a saved
MarianMTModel gives the logits of this package's sparsemax variant at every site, and BART and a Llama-shaped model
train a step and generate with exact zeros in their attention weights (T5 from 5.15, where T5 calls the interface).

Slow: the first run builds one environment per release (about a minute each; reused afterwards).
"""

import json
import os
import subprocess
import textwrap

import pytest
import torch
from transformers import MarianConfig, MarianMTModel

from hf_headattn import HeadAttnForConditionalGeneration

from helpers import TRANSFORMERS_RELEASES, WITHOUT_PACKAGE, random_model, source_batch, tiny_config
from transformers_envs import transformers_env


from hf_headattn.runtime.attention_backends import cpu_flex_problem
from hf_headattn.runtime.attention_functions import ATTENTION_FUNCTIONS

pytestmark = pytest.mark.slow

MMA = {"encoder_self_attention": "mma",
       "decoder_self_attention": {"type": "mma", "head_kinds": ["global", "local", "backward", "local"]}}
SEQ2SEQ = dict(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None)
DECODER_INPUT_IDS = [[0, 5, 6, 7], [0, 8, 9, 10], [0, 11, 12, 13]]

SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import torch
    import transformers
    from packaging import version
    from transformers import (AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration, LlamaConfig,
                              LlamaForCausalLM, MarianMTModel, T5Config, T5ForConditionalGeneration)
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    job = json.loads(sys.argv[1])
    batch = {name: torch.tensor(value) for name, value in job["inputs"].items()}
    result = {"backends": {}}
    for implementation in ("eager", "sdpa", "flex_attention"):
        model = AutoModelForSeq2SeqLM.from_pretrained(job["mma"], trust_remote_code=True,
                                                      attn_implementation=implementation).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            try:
                logits = model(**batch).logits
            except ValueError as error:  # flex attention refused where its CPU kernel is wrong (attention_backends)
                result["backends"][implementation] = {"refused": str(error)}
                continue
        model.set_attn_implementation("eager")
        with torch.no_grad():
            switched = model(**batch).logits
        result["backends"][implementation] = {"logits": logits.tolist(), "switched": switched.tolist(),
                                              "now": model.config._attn_implementation}

    register = get_class_from_dynamic_module("attention_functions.register_attention_functions", job["mma"])
    result["names"] = register()
    marian = MarianMTModel.from_pretrained(job["marian"], attn_implementation="headattn_sparsemax").eval()
    with torch.no_grad():
        result["marian"] = marian(**batch).logits.tolist()

    def train_and_generate(model, ids, labels, **generate):
        model.train()
        loss = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels).loss
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        model.eval()
        out = model.generate(input_ids=ids, attention_mask=(ids != 0).long(), max_new_tokens=5, do_sample=False,
                             output_attentions=True, return_dict_in_generate=True, **generate)
        weights = out.attentions if hasattr(out, "attentions") and out.attentions else out.cross_attentions
        zeros = sum(int((w == 0).sum()) for step in weights for w in step)
        return {"loss": loss.item(), "zeros": zeros, "length": out.sequences.shape[1]}

    source = torch.tensor([[5, 6, 7, 8, 9, 10, 1], [11, 12, 13, 1, 0, 0, 0]])
    torch.manual_seed(0)
    bart = BartForConditionalGeneration(BartConfig(**job["seq2seq"], bos_token_id=2,
                                                   attn_implementation="headattn_sparsemax"))
    result["bart"] = train_and_generate(bart, source, source.masked_fill(source == 0, -100), num_beams=2)
    if version.parse(transformers.__version__) >= version.parse("5.15"):
        t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                                 attn_implementation="headattn_sparsemax"))
        result["t5"] = train_and_generate(t5, source, source.masked_fill(source == 0, -100))
    prompt = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16]])
    for name in ("headattn_sparsemax", "headattn_mma"):
        llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                             eos_token_id=1, bos_token_id=2, attn_implementation=name,
                                             headattn_mma={"head_kinds": ["global", "local", "backward", "local"]}))
        result[f"llama {name}"] = train_and_generate(llama, prompt, prompt.masked_fill(prompt == 0, -100))
    print()
    print("RESULT" + json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    mma = random_model(tiny_config(**MMA), std=0.1)
    mma.save_pretrained(root / "mma")
    torch.manual_seed(3)
    marian = MarianMTModel(MarianConfig(**SEQ2SEQ)).eval()
    marian.save_pretrained(root / "marian")
    input_ids, attention_mask = source_batch()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "decoder_input_ids": torch.tensor(DECODER_INPUT_IDS)}
    mma.set_attn_implementation("eager")
    sparse = HeadAttnForConditionalGeneration.from_marian(marian, encoder_self_attention="sparsemax",
                                                          decoder_self_attention="sparsemax", cross_attention="sparsemax")
    with torch.no_grad():
        expected = {"mma": mma(**inputs).logits, "marian": sparse(**inputs).logits}
    return root, {name: value.tolist() for name, value in inputs.items()}, expected


@pytest.mark.parametrize("release", TRANSFORMERS_RELEASES)
def test_backends_and_functions_on_every_release(release, saved, tmp_path):
    root, inputs, expected = saved
    python = transformers_env(release)
    job = {"mma": str(root / "mma"), "marian": str(root / "marian"), "inputs": inputs, "seq2seq": SEQ2SEQ}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run([str(python), "-c", SCRIPT, json.dumps(job)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    for implementation, outputs in result["backends"].items():
        if "refused" in outputs:
            # the other process's check found what this one's finds (its numbers are the wrong kernel's, never the same)
            assert implementation == "flex_attention" and cpu_flex_problem() is not None, outputs
            assert outputs["refused"].startswith("flex_attention is refused on this CPU: PyTorch "), outputs
            continue
        torch.testing.assert_close(torch.tensor(outputs["logits"]), expected["mma"], atol=1e-5, rtol=1e-5,
                                   msg=lambda message: f"{release}, {implementation}: {message}")
        torch.testing.assert_close(torch.tensor(outputs["switched"]), expected["mma"], atol=1e-5, rtol=1e-5)
        assert outputs["now"] == "eager"
    assert result["names"] == list(ATTENTION_FUNCTIONS)
    torch.testing.assert_close(torch.tensor(result["marian"]), expected["marian"], atol=1e-5, rtol=1e-5)
    for name in ("bart", "t5", "llama headattn_sparsemax", "llama headattn_mma"):
        if name in result:
            assert result[name]["zeros"] > 0 and result[name]["length"] > 2, (release, name, result[name])
