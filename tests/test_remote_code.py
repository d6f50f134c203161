"""A saved folder loads and translates where hf_headattn is not installed, through AutoModelForSeq2SeqLM and
pipeline("translation"), with outputs identical to the model that saved it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hf_headattn import TranslationPipeline, train_tokenizer
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import TRANSFORMER_VARIANTS, WITHOUT_PACKAGE, random_model, tiny_config


SENTENCES = ["der kleine hund sieht die katze .", "ich weiß dass das kind schläft .", "die frau lacht ."]
GENERATION = dict(max_new_tokens=8, do_sample=False, no_repeat_ngram_size=1)

# Runs in a fresh interpreter, with hf_headattn made unimportable, in a folder of its own.
FRESH_PROCESS_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder, sentences, generation = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert not type(model).__module__.startswith("hf_headattn"), type(model).__module__
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    result = {"module": type(model).__module__}
    for beams in (1, 5):
        result[f"generate_{beams}"] = model.generate(**batch, num_beams=beams, **generation).tolist()
    with torch.no_grad():
        result["logits"] = model(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits.sum().item()
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    result["pipeline_one"] = translator(sentences[0], num_beams=5, **generation)
    result["pipeline_list"] = translator(sentences, **generation)
    print()  # a prompt may have left the line open
    print("RESULT" + json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def tokenizer():
    pairs = make_toy_corpus(500, seed=0)
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=200, model="bpe")


# the options' cases, and every registered variant at every site it declares (`TRANSFORMER_VARIANTS`)
VARIANTS = {
    "csoftmax-guided": {"cross_attention": "csoftmax", "fertility": "guided"},
    "csparsemax-predicted": {"cross_attention": "csparsemax", "fertility": "predicted", "fertility_predictor_size": 16},
    "multihop": {"cross_attention": {"type": "multihop", "hops": 2}},
    "dhicm-all-sites": {
        "encoder_self_attention": {"type": "dhicm", "layers": [0, 1]},
        "decoder_self_attention": {"type": "dhicm", "score": "mlp"},
        "cross_attention": {"type": "dhicm", "d_m": 12, "layers": [0, 1]},
    },
    **{f"{name}-every-site": TRANSFORMER_VARIANTS[name] for name in ATTENTION_VARIANTS},
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def saved_model(request, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"model-{request.param}")
    model = random_model(tiny_config(vocab_size=len(tokenizer), **VARIANTS[request.param]))
    if hasattr(model.model.encoder.source_fertility, "guided_fertility"):  # a table that differs from the all-ones default
        with torch.no_grad():
            model.model.encoder.source_fertility.guided_fertility.copy_(torch.randint(1, 4, (len(tokenizer),), generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, folder


def _run_fresh(folder, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    # one thread, as this process runs (conftest.one_thread): the same summation order, so the logits match to
    # rounding rather than to the spread of a differently split matrix product
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_SCRIPT, str(folder), json.dumps(SENTENCES), json.dumps(GENERATION)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_saved_folder_holds_code_and_auto_map(saved_model):
    _, folder = saved_model
    config = json.loads((folder / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_headattn.TranslationPipeline"
    for name in ("modeling_headattn.py", "configuration_headattn.py", "pipeline_headattn.py", "attention_registry.py"):
        assert (folder / name).exists(), name
    for code_file in folder.glob("*.py"):
        source = code_file.read_text()
        assert "from . import" not in source and "import hf_headattn" not in source and "from hf_headattn" not in source


def test_fresh_process_without_package_gives_identical_outputs(saved_model, tokenizer, tmp_path):
    model, folder = saved_model
    fresh = _run_fresh(folder, tmp_path)
    assert fresh["module"].startswith("transformers_modules")

    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    for beams in (1, 5):
        assert fresh[f"generate_{beams}"] == model.generate(**batch, num_beams=beams, **GENERATION).tolist()
    with torch.no_grad():
        logits = model(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits.sum().item()
    assert fresh["logits"] == pytest.approx(logits, abs=1e-4)

    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert fresh["pipeline_one"] == translator(SENTENCES[0], num_beams=5, **GENERATION)
    assert fresh["pipeline_list"] == translator(SENTENCES, **GENERATION)
    assert len(fresh["pipeline_list"]) == len(SENTENCES)
    assert all(set(item) == {"translation_text"} for item in fresh["pipeline_list"])
