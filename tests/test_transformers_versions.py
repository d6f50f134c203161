"""The Hub lifecycle on every supported Transformers release, as a Hub user who never installed hf_headattn meets
it: in a clean environment (torch and one Transformers release, see transformers_envs.py), each saved system loads
from a local folder and from a Hub repo id (served by an offline Hub cache), gives the greedy and beam-5 ids, logits
and pipeline output this package gives, fine-tunes for 5 Trainer steps with a checkpoint, saves itself again, and
pushes itself to the Hub (HTTP mocked: the upload lands in a folder), and the saved folder, the checkpoint and the
upload reload in a fresh process with identical outputs.

Slow: the first run builds one environment per release (about a minute each; reused afterwards).
"""

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from hf_headattn import HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration, TranslationPipeline, train_tokenizer
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import TRANSFORMER_VARIANTS, TRANSFORMERS_RELEASES, WITHOUT_PACKAGE, random_model, tiny_config
from transformers_envs import transformers_env


pytestmark = pytest.mark.slow

# 4.57.x (the last 4.x); the 5.x floor of the remote code; 5.9, 5.19 and 5.23, the last releases before three changes
# the runtime adapts to (5.10 copies nested relative imports, 5.20 adds Pipeline._prepare_generate_kwargs, 5.24 renames
# `past_key_values` to `cache`); the newest 5.x
HUB_USER = "headattn-test"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# the options' cases, and every registered variant at every site it declares (`TRANSFORMER_VARIANTS`)
TRANSFORMER_SYSTEMS = {
    "dhicm-pruned": {"encoder_self_attention": "dhicm", "cross_attention": "dhicm"},
    "csoftmax-constant": {"cross_attention": "csoftmax", "fertility": "constant"},
    "csparsemax-guided": {"cross_attention": "csparsemax", "fertility": "guided"},
    "csparsemax-predicted": {"cross_attention": "csparsemax", "fertility": "predicted", "fertility_predictor_size": 16},
    "multihop": {"cross_attention": {"type": "multihop", "hops": 2}},
    **{f"{name}-every-site": TRANSFORMER_VARIANTS[name] for name in ATTENTION_VARIANTS},
}
RNN_SYSTEMS = {
    "lstm-baseline": {},
    "lstm-2x2-dependent": {"num_heads": 2, "num_hops": 2, "hop_mode": "dependent"},
    "lstm-csparsemax-predicted": {"attention_transform": "csparsemax", "fertility": "predicted",
                                  "fertility_predictor_size": 16},
}
SENTENCES = ["der kleine hund sieht die katze .", "ich weiß dass das kind schläft .", "die frau lacht ."]
GENERATION = {"max_new_tokens": 8, "no_repeat_ngram_size": 1}

# What a Hub user runs, in the clean environment: outputs of each system, loaded from a folder and from a repo id,
# then 5 Trainer steps with a checkpoint and save_pretrained; with --reload, the outputs of the saved folders only.
USER_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import os

    import torch
    from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments, pipeline)

    job = json.loads(sys.argv[1])

    def outputs(source):
        model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
        batch = tokenizer(job["sentences"], return_tensors="pt", padding=True, return_token_type_ids=False)
        result = {f"generate_{beams}": model.generate(**batch, num_beams=beams, do_sample=False,
                                                      **job["generation"]).tolist() for beams in (1, 5)}
        with torch.no_grad():
            result["logits"] = model(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits.tolist()
        translator = pipeline("translation", model=source, trust_remote_code=True)
        result["pipeline_one"] = translator(job["sentences"][0], num_beams=5, **job["generation"])
        result["pipeline_list"] = translator(job["sentences"], **job["generation"])
        return result, model, tokenizer

    def fine_tune(model, tokenizer, work):
        pairs = job["train_pairs"]
        features = [dict(tokenizer(source, return_token_type_ids=False), labels=tokenizer(text_target=target)["input_ids"])
                    for source, target in pairs]
        arguments = Seq2SeqTrainingArguments(
            output_dir=work, max_steps=5, save_steps=5, per_device_train_batch_size=4, learning_rate=1e-3,
            logging_steps=5, report_to=[], use_cpu=True, seed=0)
        model.train()
        trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=features,
                                 data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                                 processing_class=tokenizer)
        trainer.train()
        final = os.path.join(work, "final")
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
        return final, os.path.join(work, "checkpoint-5")

    def cached_positions_under_checkpointing(source):
        # a training-mode forward with the cache on and activation checkpointing: GradientCheckpointingLayer drops the
        # cache it finds under its release's name, so the layers must not write it (else the backward replay fails)
        model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True)
        if not model.supports_gradient_checkpointing:
            return None
        model.train()
        model.gradient_checkpointing_enable()
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
        batch = tokenizer(job["sentences"], return_tensors="pt", padding=True, return_token_type_ids=False)
        out = model(**batch, decoder_input_ids=batch["input_ids"][:, :3], use_cache=True)
        out.logits.sum().backward()
        cache = out.cache if "cache" in out.__dataclass_fields__ else out.past_key_values  # 5.24 renamed it
        return cache.get_seq_length()

    def push(model, tokenizer, repo_id, remote):
        # push_to_hub with the HTTP layer replaced: what would be uploaded lands in the folder `remote`
        import shutil
        import huggingface_hub
        import transformers.utils.hub

        def create_repo(repo_id, **kwargs):
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def create_commit(repo_id, operations, **kwargs):
            for operation in operations:
                target = os.path.join(remote, operation.path_in_repo)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(operation.path_or_fileobj, target)
            return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/1", oid="1" * 40,
                                              commit_message="", commit_description="")

        huggingface_hub.HfApi.create_repo = lambda self, repo_id, **kwargs: create_repo(repo_id, **kwargs)
        huggingface_hub.HfApi.create_commit = lambda self, repo_id, operations, **kwargs: create_commit(
            repo_id, operations, **kwargs)
        transformers.utils.hub.create_repo = create_repo  # 4.x calls the module-level functions
        transformers.utils.hub.create_commit = create_commit
        model.push_to_hub(repo_id, token="hf_fake")
        tokenizer.push_to_hub(repo_id, token="hf_fake")
        return remote

    results = {}
    for name, sources in job["systems"].items():
        if job["reload"]:
            results[name] = {label: outputs(folder)[0] for label, folder in sources.items()}
            continue
        from_folder, model, tokenizer = outputs(sources["folder"])
        from_hub = outputs(sources["hub"])[0]
        final, checkpoint = fine_tune(model, tokenizer, os.path.join(job["work"], name))
        model.eval()
        trained = outputs(final)[0]
        pushed = push(model, tokenizer, f"someone/{name}-finetuned", os.path.join(job["work"], name, "pushed"))
        results[name] = {"folder": from_folder, "hub": from_hub, "trained": trained,
                         "checkpointed_cache": cached_positions_under_checkpointing(sources["folder"]),
                         "saved": {"final": final, "checkpoint": checkpoint, "pushed": pushed}}
    print()
    print("RESULT" + json.dumps(results))
    """
)


def _build_system(name: str, tokenizer):
    if name in RNN_SYSTEMS:
        torch.manual_seed(0)
        config = HeadAttnRNNConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, dropout=0.0,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                   decoder_start_token_id=tokenizer.pad_token_id, init_range=0.3,
                                   **RNN_SYSTEMS[name])
        return HeadAttnRNNForConditionalGeneration(config).eval()
    model = random_model(tiny_config(vocab_size=len(tokenizer), **TRANSFORMER_SYSTEMS[name]))
    source_fertility = model.model.encoder.source_fertility
    if source_fertility is not None and hasattr(source_fertility, "guided_fertility"):
        with torch.no_grad():  # a table that differs from the all-ones default
            source_fertility.guided_fertility.copy_(
                torch.randint(1, 4, (len(tokenizer),), generator=torch.Generator().manual_seed(0)))
    if name == "dhicm-pruned":
        model.prune_heads({"encoder.layers.1.self_attn": [0, 2], "decoder.layers.1.encoder_attn": [1]})
    return model


def _package_outputs(model, tokenizer) -> dict:
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    result = {f"generate_{beams}": model.generate(**batch, num_beams=beams, do_sample=False, **GENERATION).tolist()
              for beams in (1, 5)}
    with torch.no_grad():
        result["logits"] = model(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits.tolist()
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    result["pipeline_one"] = translator(SENTENCES[0], num_beams=5, **GENERATION)
    result["pipeline_list"] = translator(SENTENCES, **GENERATION)
    return result


@pytest.fixture(scope="module")
def saved_systems(tmp_path_factory):
    """Each system saved by the package into a folder and into an offline Hub cache, with this package's outputs."""
    root = tmp_path_factory.mktemp("systems")
    pairs = make_toy_corpus(300, seed=0)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=120, model="bpe")
    systems = {}
    for name in [*TRANSFORMER_SYSTEMS, *RNN_SYSTEMS]:
        model = _build_system(name, tokenizer)
        folder = root / "folders" / name
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        # the layout huggingface_hub reads offline: refs/main names a commit whose snapshot holds the files
        repo = root / "hub" / f"models--{HUB_USER}--{name}"
        shutil.copytree(folder, repo / "snapshots" / COMMIT)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
        systems[name] = {"folder": str(folder), "hub": f"{HUB_USER}/{name}", "expected": _package_outputs(model, tokenizer)}
    return {"root": root, "systems": systems, "train_pairs": pairs[:40]}


def _run_user_script(python: Path, job: dict, hub_cache: Path, workdir: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache), HF_MODULES_CACHE=str(workdir / "modules"),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1")
    done = subprocess.run([python, "-c", USER_SCRIPT, json.dumps(job)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-5000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _assert_same(actual: dict, expected: dict, what: str) -> None:
    for key in ("generate_1", "generate_5", "pipeline_one", "pipeline_list"):
        assert actual[key] == expected[key], f"{what}: {key} differs"
    assert torch.allclose(torch.tensor(actual["logits"]), torch.tensor(expected["logits"]), atol=1e-5, rtol=0), \
        f"{what}: logits differ"


@pytest.mark.parametrize("release", TRANSFORMERS_RELEASES)
def test_hub_lifecycle_in_a_clean_environment(release, saved_systems, tmp_path):
    python = transformers_env(release)
    hub_cache = saved_systems["root"] / "hub"
    job = {"systems": {name: {"folder": system["folder"], "hub": system["hub"]}
                       for name, system in saved_systems["systems"].items()},
           "sentences": SENTENCES, "generation": GENERATION, "work": str(tmp_path / "runs"),
           "train_pairs": saved_systems["train_pairs"], "reload": False}
    first = _run_user_script(python, job, hub_cache, tmp_path)

    reload_job = dict(job, reload=True, systems={name: result["saved"] for name, result in first.items()})
    (tmp_path / "fresh").mkdir()
    fresh = _run_user_script(python, reload_job, hub_cache, tmp_path / "fresh")

    for name, system in saved_systems["systems"].items():
        where = f"transformers {release}, {name}"
        _assert_same(first[name]["folder"], system["expected"], f"{where}, loaded from a folder")
        _assert_same(first[name]["hub"], system["expected"], f"{where}, loaded from a Hub repo id")
        assert first[name]["trained"]["generate_1"] != system["expected"]["generate_1"] or \
            first[name]["trained"]["logits"] != system["expected"]["logits"], f"{where}: 5 steps changed nothing"
        _assert_same(fresh[name]["final"], first[name]["trained"], f"{where}, saved after fine-tuning, fresh process")
        _assert_same(fresh[name]["checkpoint"], first[name]["trained"], f"{where}, Trainer checkpoint, fresh process")
        _assert_same(fresh[name]["pushed"], first[name]["trained"], f"{where}, pushed to the (mocked) Hub, fresh process")
        checkpointable = name in TRANSFORMER_SYSTEMS  # the LSTMs do not support gradient checkpointing
        assert first[name]["checkpointed_cache"] == (0 if checkpointable else None), \
            f"{where}: a checkpointed training forward left {first[name]['checkpointed_cache']} cached positions"
        saved = Path(first[name]["saved"]["final"])
        assert not any(path.name.startswith("hf_headattn") for path in saved.iterdir())
