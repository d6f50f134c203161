#!/usr/bin/env python
"""The quality benchmark behind RESULTS.md: every system trained by the package's own command
(`hf-headattn-train --preset multi30k-anchor`: the recipe of the project's MarianMTModel anchor, 2,090 optimizer
steps of ~2,000-target-token batches) on Multi30k De-En, one run per system and seed, each scored on
test_2016_flickr greedy and with beam 5 (BLEU, chrF, TER, REP, DROP, BLEU by source length).

    # one run (resumable: run the same command again after an interruption), then the report
    python examples/benchmark_quality.py --systems "transformer softmax" --seeds 1
    # several runs one after another; every finished run rewrites RESULTS.md and the cards
    python examples/benchmark_quality.py --systems "transformer mma" "transformer softmax" --seeds 1 2 3
    python examples/benchmark_quality.py --report-only
    # runs in parallel (e.g. several on one GPU): each records only, then one report
    python examples/benchmark_quality.py --systems "lstm 2x1" --seeds 1 --no-report &
    python examples/benchmark_quality.py --systems "lstm 2x2 independent" --seeds 1 --no-report; wait
    python examples/benchmark_quality.py --report-only
    python examples/benchmark_quality.py --list        # the systems and their training flags

Models go to --output-dir (runs/quality/<system>/seed-<n>, not committed); what the report needs goes to
--records-dir (benchmarks/quality/<system>/seed-<n>: the evaluation JSONs, the hypotheses, train_results.json and
result.json with wall times, machine and commands), so the table and the significance tests can be rebuilt
without the models and grow run by run across sessions. A finished run (its result.json exists) is skipped.

The report (--results-file) has one table per question: the anchor check, every system at seed 1, and the papers'
claims with mean +- standard deviation over seeds and sacrebleu's paired bootstrap (1,000 resamples) of each seed
against the baseline of the same seed: of BLEU, and for the coverage claims of REP and DROP too (recomputed from the
recorded hypotheses; DROP from its cached alignments, else aligned again); --records-dir/notes.md, if present
(diagnostics kept by hand), goes in too.
Every row names its machine (the GPU, else the CPU's cores) beside its train time. The cards in --cards-dir are
written from seed 1's model folder.
"""

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
from hf_headattn.attention_sparsity import SITE_OUTPUTS, attention_zero_shares  # noqa: E402
from hf_headattn.evaluation import evaluate_model  # noqa: E402
from hf_headattn.publish import write_model_card  # noqa: E402
from hf_headattn.metrics import (corpus_scores, drop_details, paired_bootstrap_p, ratio_score,  # noqa: E402
                                 rep_sentence_counts)
from hf_headattn.plotting import plot_bleu_by_length  # noqa: E402
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS, every_site_placement  # noqa: E402
from hf_headattn.runtime.configuration_headattn import HeadAttnConfig  # noqa: E402
from hf_headattn.parallel_data import read_parallel_files  # noqa: E402
from hf_headattn.training import TRAINING_PRESETS, multi30k_paths, train  # noqa: E402
from hf_headattn.translation import default_alignment_layer  # noqa: E402


PRESET = "multi30k-anchor"
ANCHOR_BLEU = 36.4  # MarianMTModel of the same shape and recipe, greedy test_2016_flickr BLEU at 2,090 steps
TEST_BEAMS = (1, 5)
COVERAGE_PENALTY_GRID = (0.2, 0.4, 0.6, 0.8, 1.0)  # Malaviya et al. Sec. 5: beta tuned on {0.2k}, k = 1..5


@dataclasses.dataclass(frozen=True)
class System:
    architecture: str  # "transformer" or "rnn"
    flags: tuple[str, ...] = ()  # training flags beyond the preset
    decoded_like: str | None = None  # a decoding-only system: the model of this system, decoded otherwise
    tune_coverage_penalty: bool = False  # beta chosen on the validation set (beam 5), then used on the test set
    preset: str = PRESET  # the recipe it trains with


MMA = '{"type": "mma", "window": 1}'
DHICM = ("--encoder_self_attention", "dhicm", "--decoder_self_attention", "dhicm", "--cross_attention", "dhicm")
DHICM_WITHOUT_KL = '{"type": "dhicm", "layers": [-1], "kl_weight": 0.0}'
# Goindani & Shrivastava's DHICM with Table 2's optimal De-En dropout (0.5) and lambda = 0.1 (Sec. 4.3)
DHICM_OPTIMAL = tuple(part for site in ("encoder_self_attention", "decoder_self_attention", "cross_attention")
                      for part in (f"--{site}", '{"type": "dhicm", "layers": [-1], "kl_weight": 0.1, "dropout": 0.5}'))
SAMPLED_10K = ("--max_train_pairs", "10000", "--sample_train_pairs", "true")  # another sample each seed
SAMPLED_20K = ("--max_train_pairs", "20000", "--sample_train_pairs", "true")
GUIDED_ALIGNMENT = ("--guided_alignment", "eflomal")  # Garg et al.'s defaults: weight 0.05, penultimate layer, head 0
SYSTEMS = {
    # Transformers: each variant at the site its paper puts it (softmax elsewhere)
    "transformer softmax": System("transformer"),
    "transformer mma": System("transformer", ("--encoder_self_attention", MMA)),  # Cui et al.: encoder, w = 1
    # the model exactly as MarianConfig's defaults build it (the anchor's class), where ours follow OPUS-MT's
    "transformer softmax, MarianConfig activation and embeddings": System("transformer", (
        "--activation_function", "gelu", "--scale_embedding", "false")),
    "transformer softmax, pooled length buckets": System("transformer", (
        "--bucket_pool_pairs", "6850", "--max_tokens", "4900")),
    "transformer softmax, no positions": System("transformer", ("--position_embedding", "none")),
    "transformer mma, no positions": System("transformer", ("--encoder_self_attention", MMA,
                                                            "--position_embedding", "none")),
    # Goindani & Shrivastava: the last layer's three attentions, lambda = 0.1; without the KL term (lambda = 0),
    # to see whether Eq. 5's -lambda KL(G || uniform), largest when one head takes everything, makes them collapse
    "transformer dhicm": System("transformer", DHICM),
    "transformer softmax, 10k pairs": System("transformer", ("--max_train_pairs", "10000")),
    "transformer dhicm, 10k pairs": System("transformer", (*DHICM, "--max_train_pairs", "10000")),
    "transformer dhicm without KL, 10k pairs": System("transformer", (
        "--encoder_self_attention", DHICM_WITHOUT_KL, "--decoder_self_attention", DHICM_WITHOUT_KL,
        "--cross_attention", DHICM_WITHOUT_KL, "--max_train_pairs", "10000")),
    # Malaviya et al.: the source attention
    "transformer sparsemax": System("transformer", ("--cross_attention", "sparsemax")),
    "transformer csoftmax guided": System("transformer", ("--cross_attention", "csoftmax", "--fertility", "guided")),
    "transformer csoftmax predicted": System("transformer", ("--cross_attention", "csoftmax",
                                                             "--fertility", "predicted")),
    "transformer csparsemax guided": System("transformer", ("--cross_attention", "csparsemax",
                                                            "--fertility", "guided")),
    "transformer csparsemax predicted": System("transformer", ("--cross_attention", "csparsemax",
                                                               "--fertility", "predicted")),
    "transformer multihop": System("transformer", ("--cross_attention", "multihop")),  # Iida et al.'s second hop
    # Garg et al.: one head of the penultimate decoder layer guided by eflomal's links of the training pairs
    "transformer softmax, guided alignment": System("transformer", GUIDED_ALIGNMENT),
    "transformer csparsemax predicted, guided alignment": System("transformer", (
        "--cross_attention", "csparsemax", "--fertility", "predicted", *GUIDED_ALIGNMENT)),
    # ... and read with full target context (Garg et al.'s best alignments): a second decoder pass, not causal
    "transformer softmax, guided alignment, full context": System("transformer", (
        *GUIDED_ALIGNMENT, "--guided_alignment_full_context")),
    "transformer running_sum": System("transformer", ("--cross_attention", "running_sum")),  # the seam's test variant
    # Peters et al., Correia et al.: every site; and sparsemax there, the other end of entmax's alpha
    "transformer sparsemax, every site": System("transformer", ("--encoder_self_attention", "sparsemax",
                                                               "--decoder_self_attention", "sparsemax",
                                                               "--cross_attention", "sparsemax")),
    "transformer entmax15": System("transformer", ("--encoder_self_attention", "entmax15", "--decoder_self_attention",
                                                   "entmax15", "--cross_attention", "entmax15")),
    "transformer entmax_alpha": System("transformer", ("--encoder_self_attention", "entmax_alpha",
                                                       "--decoder_self_attention", "entmax_alpha",
                                                       "--cross_attention", "entmax_alpha")),
    # LSTMs (Iida et al., Malaviya et al.): heads x hops
    "lstm baseline 1x1": System("rnn"),
    "lstm 2x1": System("rnn", ("--heads", "2")),
    "lstm 2x2 dependent": System("rnn", ("--heads", "2", "--hops", "2", "--hop_mode", "dependent")),
    "lstm 2x2 independent": System("rnn", ("--heads", "2", "--hops", "2", "--hop_mode", "independent")),
    # the constrained LSTMs recorded before the <SINK> token existed had the learned sink vector: pinned, so that their
    # commands build the models they recorded
    "lstm csparsemax predicted": System("rnn", ("--attention_transform", "csparsemax", "--fertility", "predicted",
                                                "--sink", "vector")),
    # what separates the LSTM's csparsemax from its baseline: sparsity alone, and the bounds without sparsity
    "lstm sparsemax": System("rnn", ("--attention_transform", "sparsemax")),
    "lstm csoftmax predicted": System("rnn", ("--attention_transform", "csoftmax", "--fertility", "predicted",
                                              "--sink", "vector")),
    # the same with scores divided by sqrt(d): does sparsity in one head learn when its scores start small?
    "lstm baseline 1x1, scaled scores": System("rnn", ("--attention_score", "scaled_general")),
    "lstm sparsemax, scaled scores": System("rnn", ("--attention_transform", "sparsemax",
                                                    "--attention_score", "scaled_general")),
    "lstm csparsemax predicted, scaled scores": System("rnn", ("--attention_transform", "csparsemax",
                                                               "--fertility", "predicted",
                                                               "--attention_score", "scaled_general",
                                                               "--sink", "vector")),
    "lstm coverage vector": System("rnn", ("--coverage_vector", "true")),
    "lstm coverage penalty": System("rnn", decoded_like="lstm baseline 1x1", tune_coverage_penalty=True),
    # Malaviya et al.'s own recipe (OpenNMT-py 2017's LSTM, SGD, the <SINK> token): `--preset malaviya2018`
    "lstm malaviya2018 softmax": System("rnn", preset="malaviya2018"),
    "lstm malaviya2018 sparsemax": System("rnn", ("--attention_transform", "sparsemax"), preset="malaviya2018"),
    "lstm malaviya2018 csoftmax predicted": System("rnn", ("--attention_transform", "csoftmax",
                                                           "--fertility", "predicted"), preset="malaviya2018"),
    "lstm malaviya2018 csparsemax predicted": System("rnn", ("--attention_transform", "csparsemax",
                                                             "--fertility", "predicted"), preset="malaviya2018"),
    "lstm malaviya2018 csparsemax guided": System("rnn", ("--attention_transform", "csparsemax",
                                                          "--fertility", "guided"), preset="malaviya2018"),
    "lstm malaviya2018 csparsemax predicted, guided alignment": System("rnn", (
        "--attention_transform", "csparsemax", "--fertility", "predicted", *GUIDED_ALIGNMENT), preset="malaviya2018"),
    # Goindani & Shrivastava's low-resource claim (Table 4) at their recipe (`--preset goindani2021`: transformer-base
    # at Table 2's optimal De-En values, trained until 10 epochs bring no lower validation loss, the best epoch kept),
    # on 10,000 and 20,000 training pairs drawn at random (another sample each seed, as their three samples): T-optimal
    # (softmax) against DHICM at the last layer's three attentions with Table 2's DHICM dropout
    "transformer goindani2021 softmax, 10k sampled pairs": System("transformer", SAMPLED_10K, preset="goindani2021"),
    "transformer goindani2021 dhicm, 10k sampled pairs": System("transformer", (*DHICM_OPTIMAL, *SAMPLED_10K),
                                                                preset="goindani2021"),
    "transformer goindani2021 softmax, 20k sampled pairs": System("transformer", SAMPLED_20K, preset="goindani2021"),
    "transformer goindani2021 dhicm, 20k sampled pairs": System("transformer", (*DHICM_OPTIMAL, *SAMPLED_20K),
                                                                preset="goindani2021"),
}
# a registered variant without a system above: at every site it declares, with the default heads
SYSTEMS.update({
    f"transformer {name}": System("transformer", tuple(
        part for site, spec in every_site_placement(name, HeadAttnConfig().encoder_attention_heads).items()
        for part in (f"--{site}", spec if isinstance(spec, str) else json.dumps(spec))))
    for name in ATTENTION_VARIANTS if f"transformer {name}" not in SYSTEMS
})

# The papers' claims: (question, system, baseline, what is compared)
CLAIMS = [
    ("MMA vs softmax (Cui et al.)", "transformer mma", "transformer softmax", "bleu"),
    ("MMA vs softmax without position embeddings (Cui et al.)", "transformer mma, no positions",
     "transformer softmax, no positions", "bleu"),
    ("DHICM vs softmax on 10,000 pairs (Goindani & Shrivastava, low-resource)", "transformer dhicm, 10k pairs",
     "transformer softmax, 10k pairs", "bleu"),
    ("DHICM with its KL term vs without it on 10,000 pairs (the KL term's ablation)",
     "transformer dhicm, 10k pairs", "transformer dhicm without KL, 10k pairs", "bleu"),
    ("DHICM vs T-optimal on 10,000 sampled pairs at Goindani & Shrivastava's recipe (`--preset goindani2021`, "
     "transformer-base; their Table 4)", "transformer goindani2021 dhicm, 10k sampled pairs",
     "transformer goindani2021 softmax, 10k sampled pairs", "bleu"),
    ("DHICM vs T-optimal on 20,000 sampled pairs at Goindani & Shrivastava's recipe",
     "transformer goindani2021 dhicm, 20k sampled pairs", "transformer goindani2021 softmax, 20k sampled pairs",
     "bleu"),
    ("2x2 dependent multi-hop vs the LSTM baseline (Iida et al.)", "lstm 2x2 dependent", "lstm baseline 1x1", "bleu"),
    ("csparsemax (predicted fertility) vs softmax, LSTM (Malaviya et al.)", "lstm csparsemax predicted",
     "lstm baseline 1x1", "coverage"),
    ("csparsemax (predicted fertility) vs softmax, LSTM at Malaviya et al.'s recipe (`--preset malaviya2018`)",
     "lstm malaviya2018 csparsemax predicted", "lstm malaviya2018 softmax", "coverage"),
    ("csoftmax (predicted fertility) vs softmax, LSTM at Malaviya et al.'s recipe",
     "lstm malaviya2018 csoftmax predicted", "lstm malaviya2018 softmax", "coverage"),
    ("sparsemax vs softmax, LSTM at Malaviya et al.'s recipe", "lstm malaviya2018 sparsemax",
     "lstm malaviya2018 softmax", "coverage"),
    ("csparsemax (predicted fertility) vs softmax, Transformer", "transformer csparsemax predicted",
     "transformer softmax", "coverage"),
    ("Guided alignment vs none, softmax Transformer (Garg et al.)", "transformer softmax, guided alignment",
     "transformer softmax", "alignment"),
    ("Guided alignment vs none, csparsemax (predicted fertility) Transformer",
     "transformer csparsemax predicted, guided alignment", "transformer csparsemax predicted", "alignment"),
    ("Guided alignment with full target context vs none, softmax Transformer (Garg et al.)",
     "transformer softmax, guided alignment, full context", "transformer softmax", "alignment"),
    ("entmax-1.5 vs softmax at every site (Peters et al.)", "transformer entmax15", "transformer softmax", "coverage"),
    ("alpha-entmax, alpha learned per head, vs softmax at every site (Correia et al.)", "transformer entmax_alpha",
     "transformer softmax", "coverage"),
    ("sparsemax vs softmax at every site", "transformer sparsemax, every site", "transformer softmax", "coverage"),
    ("entmax-1.5 vs sparsemax at every site", "transformer entmax15", "transformer sparsemax, every site",
     "coverage"),
    ("alpha-entmax vs sparsemax at every site", "transformer entmax_alpha", "transformer sparsemax, every site",
     "coverage"),
    ("alpha-entmax vs entmax-1.5 at every site (Correia et al.: learned alpha against alpha fixed at 1.5)",
     "transformer entmax_alpha", "transformer entmax15", "coverage"),
]
# the anchor question's comparison of the two batchings, tabled like a claim under "Softmax against the anchor"
BATCHING_QUESTION = ("Pooled length buckets vs the global length sort (softmax)",
                     "transformer softmax, pooled length buckets", "transformer softmax", "bleu")
# softmax by the preset's recipe, and softmax with pooled length buckets (about as many real target tokens a batch)
SOFTMAX_RECIPES = {"transformer softmax": "with the preset's global length sort",
                   "transformer softmax, pooled length buckets": "with pooled length buckets (`{}`)".format(
                       " ".join(SYSTEMS["transformer softmax, pooled length buckets"].flags))}
ANCHOR_SYSTEMS = (*SOFTMAX_RECIPES, "transformer softmax, MarianConfig activation and embeddings")
FIGURE_SYSTEMS = ("transformer softmax", "transformer mma", "transformer dhicm", "transformer csparsemax predicted",
                  "lstm baseline 1x1", "lstm 2x2 dependent", "lstm csparsemax predicted")

DATA_KEYS = [f"{split}_{side}" for split in ("train", "valid", "test") for side in ("source", "target")]


def slug(system: str) -> str:
    return system.replace(",", "").replace(" ", "-")


def data_files(args) -> dict:
    """The six files: those given on the command line, or Multi30k's from --data-dir."""
    if all(getattr(args, key) for key in DATA_KEYS):
        return {key: str(getattr(args, key)) for key in DATA_KEYS}
    paths = multi30k_paths(args.data_dir)
    names = ["train.de", "train.en", "val.de", "val.en", "test_2016_flickr.de", "test_2016_flickr.en"]
    return {key: str(paths[name]) for key, name in zip(DATA_KEYS, names)}


def training_argv(system: str, seed: int, data: dict, model_dir: Path, args) -> list[str]:
    spec = SYSTEMS[system]
    extra = shlex.split(args.transformer_flags if spec.architecture == "transformer" else args.lstm_flags)
    return ["--preset", spec.preset, "--architecture", spec.architecture,
            "--train_source", data["train_source"], "--train_target", data["train_target"],
            "--valid_source", data["valid_source"], "--valid_target", data["valid_target"],
            *spec.flags, *extra, "--seed", str(seed), "--output_dir", str(model_dir)]


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (None elsewhere): machines with the same core count differ."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), None)


def machine() -> dict:
    return {"processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "load_average_1_5_15": [round(load, 2) for load in os.getloadavg()],
            "torch": torch.__version__, "transformers": transformers.__version__}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run(system: str, seed: int, args, data: dict) -> dict:
    """Train (or resume) and evaluate one system at one seed, unless its result is recorded already."""
    record_dir = Path(args.records_dir) / slug(system) / f"seed-{seed}"
    result_path = record_dir / "result.json"
    if result_path.exists():
        print(f"{system}, seed {seed}: recorded already in {result_path}")
        return json.loads(result_path.read_text())
    spec = SYSTEMS[system]
    trained = spec.decoded_like or system
    model_dir = Path(args.output_dir) / slug(trained) / f"seed-{seed}"
    record_dir.mkdir(parents=True, exist_ok=True)
    result = {"system": system, "seed": seed, "architecture": spec.architecture, "started": now(),
              "machine_at_start": machine()}

    train_argv = training_argv(trained, seed, data, model_dir, args)
    if not (model_dir / "train_results.json").exists():
        result["resumed"] = any(model_dir.glob("checkpoint-*"))
        print(f"{system}, seed {seed}: training {model_dir}" + (" (resuming)" if result["resumed"] else ""))
        train(train_argv)
    train_results = json.loads((model_dir / "train_results.json").read_text())
    shutil.copyfile(model_dir / "train_results.json", record_dir / "train_results.json")

    coverage_penalty = 0.0
    if spec.tune_coverage_penalty:
        result["coverage_penalty_on_validation"] = tuning = {}
        for beta in COVERAGE_PENALTY_GRID:
            scores = evaluate_model(model_dir, data["valid_source"], data["valid_target"], num_beams=5,
                                    batch_size=args.batch_size, output_dir=record_dir / "validation",
                                    test_name="val", coverage_penalty=beta, overwrite=True)  # unrecorded: redone
            tuning[f"{beta:g}"] = scores["bleu"]
        coverage_penalty = float(max(tuning, key=tuning.get))
    evaluations = {}
    for num_beams in TEST_BEAMS:
        if coverage_penalty and num_beams == 1:
            continue  # the penalty re-ranks a beam
        started = time.perf_counter()
        evaluation = evaluate_model(model_dir, data["test_source"], data["test_target"], num_beams=num_beams,
                                    batch_size=args.batch_size, train_source=data["train_source"],
                                    train_target=data["train_target"], output_dir=record_dir,
                                    test_name="test_2016_flickr", coverage_penalty=coverage_penalty,
                                    overwrite=True)  # a run not recorded yet is evaluated again
        evaluations["greedy" if num_beams == 1 else f"beam{num_beams}"] = {
            **{key: evaluation[key] for key in ("bleu", "chrf", "ter", "rep", "drop")},
            "seconds": round(time.perf_counter() - started, 1),
            "hypotheses": Path(evaluation["files"]["hypotheses"]).name,
            "metrics": Path(evaluation["files"]["metrics"]).name,
        }
        print(f"{system}, seed {seed}, {'greedy' if num_beams == 1 else f'beam {num_beams}'}: "
              f"BLEU {evaluation['bleu']:.2f}, REP {evaluation['rep']:.2f}, DROP {evaluation['drop']:.2f}")
    if any("dhicm" in flag for flag in spec.flags):
        result["head_importances"] = importance_statistics(model_dir, data, args.batch_size)
    if spec.architecture == "transformer":
        result["attention_zero_shares"] = zero_share_statistics(model_dir, data, args.batch_size)
    if seed == 1:
        write_card(system, model_dir, record_dir, evaluations, args)

    result.update(
        finished=now(), machine_at_end=machine(), decoding=evaluations, coverage_penalty=coverage_penalty,
        steps=train_results.get("global_step"), epochs=train_results.get("epoch"),
        train_pairs=train_results.get("train_pairs"), parameters=train_results.get("parameters"),
        train_runtime_s=train_results.get("train_runtime_total", train_results.get("train_runtime")),
        eval_loss=train_results.get("eval_loss"),
        settings=settings(args, spec),
        command=shlex.join(["python", "examples/benchmark_quality.py", "--systems", system, "--seeds", str(seed),
                            *settings_argv(args)]),
        training_command=shlex.join(["hf-headattn-train", *train_argv]),
    )
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def model_and_test_pairs(model_dir: Path, data: dict) -> tuple:
    """(model, tokenizer, test sources, test references): what the teacher-forced statistics of a run read."""
    from hf_headattn.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir)
    sources = Path(data["test_source"]).read_text(encoding="utf-8").splitlines()
    targets = Path(data["test_target"]).read_text(encoding="utf-8").splitlines()
    return model, tokenizer, sources, targets


def importance_statistics(model_dir: Path, data: dict, batch_size: int) -> dict:
    """How each DHICM module spreads its importances over the heads on the test set (teacher-forced)."""
    from hf_headattn.head_pruning import head_importance_statistics

    statistics = head_importance_statistics(*model_and_test_pairs(model_dir, data), batch_size)
    return {name: {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in module.items()}
            for name, module in statistics.items()}


def zero_share_statistics(model_dir: Path, data: dict, batch_size: int) -> dict:
    """The share of exact zeros in each attention site's weights on the test set (teacher-forced)."""
    return attention_zero_shares(*model_and_test_pairs(model_dir, data), batch_size)


def settings(args, spec: System) -> dict:
    """What changes the numbers besides the system and seed: the data (paths and contents) and the flags added to
    the preset."""
    data = data_files(args)
    return {"data": data, "data_sha256": data_hashes(data), "preset_name": spec.preset,
            "preset": TRAINING_PRESETS[spec.preset],
            "extra_flags": args.transformer_flags if spec.architecture == "transformer" else args.lstm_flags}


@functools.cache
def file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def data_hashes(data: dict) -> dict:
    return {key: file_sha256(path) for key, path in data.items()}


def settings_argv(args) -> list[str]:
    argv = []
    if all(getattr(args, key) for key in DATA_KEYS):
        for key in DATA_KEYS:
            argv += [f"--{key.replace('_', '-')}", getattr(args, key)]
    elif args.data_dir != DEFAULT_DATA_DIR:
        argv += ["--data-dir", args.data_dir]
    for name in ("transformer_flags", "lstm_flags"):
        if getattr(args, name):
            argv += [f"--{name.replace('_', '-')}", getattr(args, name)]
    return argv


def write_card(system: str, model_dir: Path, record_dir: Path, evaluations: dict, args) -> None:
    """The model folder's card, from its beam-5 evaluation, copied to --cards-dir. Its loading snippets name the
    model folder as the command made it (e.g. runs/quality/transformer-mma/seed-1): the models are not on the Hub,
    and `hf-headattn-hub push` asks for the card to be rewritten with the repository id."""
    decoding = "beam5" if "beam5" in evaluations else next(iter(evaluations))
    card = write_model_card(model_dir, record_dir / evaluations[decoding]["metrics"], dataset_name=args.dataset_name,
                            dataset_id=args.dataset_id, model_name=f"hf_headattn {system} (Multi30k De-En)",
                            repo_id=model_dir.as_posix())
    Path(args.cards_dir).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(card, Path(args.cards_dir) / f"{slug(system)}.md")


# ------------------------------------------------------------------------------------------------ the report
def collect(records_dir: Path) -> dict:
    """(system, seed) -> result, for every recorded run, in SYSTEMS order."""
    results = {}
    for system in SYSTEMS:
        for path in sorted((records_dir / slug(system)).glob("seed-*/result.json"),
                           key=lambda path: int(path.parent.name.split("-")[1])):
            result = json.loads(path.read_text())
            result["record_dir"] = path.parent
            results[system, result["seed"]] = result
    return results


def check_same_settings(results: dict, data: dict) -> None:
    """Every run on the files of `data` (`data_files`: what the report reads), compared by name, since runs are
    recorded on machines that keep the data in other folders, and by content where the run recorded it; and the runs
    of each preset and family with the same preset values and extra flags. Each result's settings then name the
    files of `data`."""
    names, contents = {key: Path(path).name for key, path in data.items()}, data_hashes(data)
    recipes = {}
    for result in results.values():
        settings = result["settings"]
        recipes.setdefault((settings.get("preset_name", PRESET), result["architecture"]), set()).add(
            json.dumps([settings["preset"], settings["extra_flags"]], sort_keys=True))
    other_data = [(system, seed) for (system, seed), result in results.items()
                  if {key: Path(path).name for key, path in result["settings"]["data"].items()} != names
                  or result["settings"].get("data_sha256", contents) != contents]
    if other_data:
        raise ValueError(f"the recorded runs were trained with different settings: these on other data than "
                         f"{', '.join(data.values())}; use a fresh --records-dir (or the --data-dir they name):\n"
                         + "\n".join(f"{system} seed {seed}: {json.dumps(results[system, seed]['settings']['data'])}"
                                     for system, seed in other_data))
    if any(len(recipe) > 1 for recipe in recipes.values()):
        raise ValueError("the recorded runs were trained with different settings; use a fresh --records-dir:\n"
                         + "\n".join(f"{system} seed {seed}: {json.dumps(result['settings'])}"
                                     for (system, seed), result in results.items()))
    for result in results.values():
        result["settings"]["data"] = data


def machine_label(result: dict) -> str:
    """Where a run trained, short: the GPU's model, else the CPU's core count."""
    start = result["machine_at_start"]
    if start["cuda"]:
        return start["cuda"].removeprefix("NVIDIA ").split()[0]
    return f"CPU, {start['cpu_count']} cores"


def train_minutes(result: dict) -> str:
    return f"{result['train_runtime_s'] / 60:.0f}"


def train_time(result: dict) -> str:
    """Train minutes and the machine, e.g. ``36 (CPU, 2 cores)``."""
    return f"{train_minutes(result)} ({machine_label(result)})"


def train_times(pairs: list[tuple[dict, dict]], index: int) -> str:
    """The train times of one side (0: system, 1: baseline) of a claim's seed pairs, the machine named once when
    every seed trained on the same kind."""
    runs = [pair[index] for pair in pairs]
    labels = {machine_label(run) for run in runs}
    if len(labels) == 1:
        return f"{', '.join(train_minutes(run) for run in runs)} ({labels.pop()})"
    return ", ".join(train_time(run) for run in runs)


def fmt(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def mean_std(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def hypotheses(result: dict, decoding: str) -> list[str]:
    path = result["record_dir"] / result["decoding"][decoding]["hypotheses"]
    return path.read_text(encoding="utf-8").splitlines()


def bleu_bootstrap_p(system: dict, baseline: dict, references: list[str], decoding: str) -> float:
    """sacrebleu's paired bootstrap resampling (1,000 samples, sacrebleu's fixed seed): the p-value of the
    system's BLEU differing from the baseline's by chance."""
    return paired_bleu_p(hypotheses(system, decoding), hypotheses(baseline, decoding), references)


def paired_bleu_p(system: list[str], baseline: list[str], references: list[str]) -> float:
    """:func:`bleu_bootstrap_p` on hypothesis lists; 1 for identical lists (sacrebleu's rule would give
    1 / 1,001: a zero difference is not attributed to chance, which reads wrongly where there is none)."""
    if list(system) == list(baseline):
        return 1.0
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU()}, [references], test_type="bs",
                      n_samples=1000)
    _, scores = test()
    return scores["BLEU"][1].p_value


@functools.cache
def read_lines(*paths: str) -> tuple[list[str], ...]:
    files = read_parallel_files(*paths)
    return list(files["source"]), list(files["target"])


def coverage_statistics(result: dict, decoding: str) -> dict:
    """Per test sentence, REP's and DROP's counts (`rep_sentence_counts`, `drop_details`' `sentence_counts`) of a
    run's recorded hypotheses, which must still give the recorded BLEU and REP. DROP's counts are kept beside the
    record (`<test>.<decoding>.drop_counts.json`, with the hash of the hypotheses they count) the first time they are
    made, so that every later report tests the same counts: eflomal cannot be seeded, and DROP reads the evaluation's
    alignments from a cache that another machine or a cleared cache lacks, where eflomal aligns again and DROP
    (returned as `drop`) can differ a little from the recorded one."""
    metrics = json.loads((result["record_dir"] / result["decoding"][decoding]["metrics"]).read_text())
    settings, data = metrics["metric_settings"], result["settings"]["data"]
    sources, references = read_lines(data["test_source"], data["test_target"])
    train_sources, train_targets = read_lines(data["train_source"], data["train_target"])
    outputs = hypotheses(result, decoding)
    tokenize = settings["rep_drop_tokenize"]
    rep = rep_sentence_counts(outputs, references, tokenize=tokenize)
    recomputed = {"bleu": corpus_scores(outputs, references)["bleu"],
                  "rep": ratio_score([sum(column) for column in zip(*rep)])}
    for name, value in recomputed.items():
        if not math.isclose(value, metrics[name], rel_tol=1e-9):
            raise RuntimeError(f"{result['system']} seed {result['seed']} ({decoding}): the recorded hypotheses give "
                               f"{name.upper()} {value:.4f}, recorded as {metrics[name]:.4f}: they have changed")
    counts_file = result["record_dir"] / result["decoding"][decoding]["metrics"].replace(".metrics.json",
                                                                                         ".drop_counts.json")
    hypotheses_sha256 = hashlib.sha256("\n".join(outputs).encode("utf-8")).hexdigest()
    kept = json.loads(counts_file.read_text()) if counts_file.is_file() else None
    if kept is None or kept["hypotheses_sha256"] != hypotheses_sha256:
        details = drop_details(sources, outputs, references, train_sources=train_sources, train_targets=train_targets,
                               tokenize=tokenize, runs=settings["drop_alignment"]["runs"])
        kept = {"drop": details["drop"], "hypotheses_sha256": hypotheses_sha256,
                "sentence_counts": [list(counts) for counts in details["sentence_counts"]]}
        counts_file.write_text(json.dumps(kept) + "\n")
    return {"rep": rep, "drop_counts": kept["sentence_counts"], "drop": kept["drop"], "recorded_drop": metrics["drop"]}


def coverage_p_values(system: dict, baseline: dict, decoding: str) -> dict[str, float]:
    """Paired bootstrap p-values (sacrebleu's procedure and resamples) of REP and DROP, system against baseline,
    and the largest difference between the DROP the p-value's counts give and the recorded DROP."""
    ours, theirs = coverage_statistics(system, decoding), coverage_statistics(baseline, decoding)
    return {"rep": paired_bootstrap_p(ours["rep"], theirs["rep"]),
            "drop": paired_bootstrap_p(ours["drop_counts"], theirs["drop_counts"]),
            "drop_difference": max(abs(x["drop"] - x["recorded_drop"]) for x in (ours, theirs))}


def anchor_table(results: dict) -> str:
    """Softmax (and the diagnostic runs of the same recipe) against the anchor's greedy BLEU."""
    rows = [(seed, result) for (system, seed), result in results.items() if system in ANCHOR_SYSTEMS]
    if not rows:
        return "No softmax run yet."
    lines = ["| system | seed | optimizer steps | greedy BLEU | anchor (MarianMTModel) | beam-5 BLEU | train time (min, machine) |",
             "|---|---|---|---|---|---|---|"]
    for seed, result in rows:
        lines.append(f"| {result['system']} | {seed} | {result['steps']:,} | **{result['decoding']['greedy']['bleu']:.2f}** | "
                     f"{ANCHOR_BLEU} | {result['decoding']['beam5']['bleu']:.2f} | {train_time(result)} |")
    verdicts = []
    for system, recipe in SOFTMAX_RECIPES.items():
        greedy = [result["decoding"]["greedy"]["bleu"] for _, result in rows if result["system"] == system]
        if not greedy:
            continue
        # judged on the mean over seeds: the best of several seeds would flatter the recipe
        mean = statistics.mean(greedy)
        spread = f"{mean_std(greedy)} over {len(greedy)} seed{'s' if len(greedy) > 1 else ''}"
        verdicts.append(
            f"Reached: softmax's greedy BLEU {recipe} is {spread}, at or above the anchor's {ANCHOR_BLEU}."
            if mean >= ANCHOR_BLEU else
            f"Not reached: softmax's greedy BLEU {recipe} is {spread}, {ANCHOR_BLEU - mean:.2f} below the anchor's "
            f"{ANCHOR_BLEU} (best seed {max(greedy):.2f}).")
    return "\n\n".join(["\n".join(lines), *verdicts])


def systems_table(results: dict) -> str:
    lines = ["| system | greedy BLEU | beam-5 BLEU | chrF | TER | REP | DROP | parameters | steps | train time (min, machine) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (system, seed), result in results.items():
        if seed != 1:
            continue
        decoding = result["decoding"]
        beam = decoding["beam5"]
        greedy = decoding.get("greedy", {}).get("bleu")
        label = system + (f" (beta = {result['coverage_penalty']:g}, tuned on val)" if result["coverage_penalty"]
                          else "")
        lines.append(f"| {label} | {fmt(greedy, 2)} | {beam['bleu']:.2f} | {beam['chrf']:.2f} | {beam['ter']:.2f} | "
                     f"{beam['rep']:.2f} | {fmt(beam['drop'], 2)} | {result['parameters']:,} | {result['steps']:,} | "
                     f"{train_time(result)} |")
    return "\n".join(lines)


def alignment_aer(alignment_dir: Path, system: str, seed: int) -> tuple[float, str] | None:
    """The AER that `hf-headattn-translate --alignments` gives by default, from examples/benchmark_alignment.py's
    record of (system, seed), and where it was read: a guided model's guided heads at its guided layer, else the
    heads' mean at the default layer. None without a record."""
    path = alignment_dir / f"{slug(system)}-seed-{seed}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    layer = record.get("default_layer", default_alignment_layer(max(row["layer"] for row in record["rows"]) + 1))
    row = next(row for row in record["rows"] if row["layer"] == layer and row["heads"] == "mean")
    guided = record.get("guided_heads")
    where = f"layer {layer}, " + (f"guided head{'s' if len(guided) > 1 else ''} {', '.join(map(str, guided))}"
                                  if guided else "heads' mean")
    return row["aer"], where


def bleu_p_cells(pairs: list[tuple[dict, dict]], references: list[str]) -> list[str]:
    """A claim's greedy and beam-5 BLEU p-values, each seed's system against its baseline, one cell each."""
    return [", ".join(f"{bleu_bootstrap_p(*pair, references, decoding):.3f}" for pair in pairs)
            for decoding in ("greedy", "beam5")]


def claims_tables(results: dict, references: list[str], claims: list | None = None,
                  alignment_dir: Path = Path("benchmarks/alignment")) -> str:
    """A table for each claim (by default the papers', `CLAIMS`) whose system and baseline share a seed. "bleu"
    claims give BLEU; "coverage" claims BLEU, REP and DROP with their p-values; "alignment" claims (guided
    alignment) BLEU with its p-values, REP, DROP and the AER of examples/benchmark_alignment.py's records in
    `alignment_dir`."""
    sections = []
    for question, system, baseline, compared in CLAIMS if claims is None else claims:
        seeds = sorted(seed for (name, seed) in results if name == system and (baseline, seed) in results)
        if not seeds:
            continue
        pairs = [(results[system, seed], results[baseline, seed]) for seed in seeds]
        lines = [f"### {question}", "",
                 f"Seeds: {', '.join(map(str, seeds))}. Mean ± standard deviation over seeds; p: sacrebleu's paired "
                 "bootstrap (1,000 resamples) of each seed's system against the baseline of the same seed (for REP "
                 "and DROP, the same test on their per-sentence counts).", ""]
        if compared == "alignment":
            lines += ["| | greedy BLEU | beam-5 BLEU | REP | DROP | AER (seeds; where read) | p (greedy) per seed | "
                      "p (beam 5) per seed | train time per seed (min, machine) |", "|---|---|---|---|---|---|---|---|---|"]
            for label, index in ((system, 0), (baseline, 1)):
                decoding = [pair[index]["decoding"] for pair in pairs]
                aers = [aer for seed in seeds if (aer := alignment_aer(alignment_dir, label, seed))]
                aer_cell = (f"{mean_std([aer for aer, _ in aers])} ({len(aers)}; {aers[0][1]})" if aers
                            else "not measured")
                p_values = bleu_p_cells(pairs, references) if index == 0 else [""] * 2
                lines.append(f"| {label} | {mean_std([d['greedy']['bleu'] for d in decoding])} | "
                             f"{mean_std([d['beam5']['bleu'] for d in decoding])} | "
                             f"{mean_std([d['beam5']['rep'] for d in decoding])} | "
                             f"{mean_std([d['beam5']['drop'] for d in decoding])} | {aer_cell} | {p_values[0]} | "
                             f"{p_values[1]} | {train_times(pairs, index)} |")
            lines += ["", "REP and DROP of the beam-5 translations; AER against eflomal's alignments of the same test "
                          "pairs (\"Word alignments from attention\" below), read where `--alignments` reads by "
                          "default."]
        elif compared == "bleu":
            lines += ["| | greedy BLEU | beam-5 BLEU | p (greedy) per seed | p (beam 5) per seed | train time per seed "
                      "(min, machine) |", "|---|---|---|---|---|---|"]
            for label, index in ((system, 0), (baseline, 1)):
                greedy = [pair[index]["decoding"]["greedy"]["bleu"] for pair in pairs]
                beam = [pair[index]["decoding"]["beam5"]["bleu"] for pair in pairs]
                p_values = bleu_p_cells(pairs, references) if index == 0 else [""] * 2
                lines.append(f"| {label} | {mean_std(greedy)} | {mean_std(beam)} | {p_values[0]} | {p_values[1]} | "
                             f"{train_times(pairs, index)} |")
        else:
            lines += ["| | beam-5 BLEU | REP (lower is better) | DROP (lower is better) | p (BLEU) per seed | "
                      "p (REP) per seed | p (DROP) per seed | train time per seed (min, machine) |",
                      "|---|---|---|---|---|---|---|---|"]
            coverage = [coverage_p_values(*pair, "beam5") for pair in pairs]
            for label, index in ((system, 0), (baseline, 1)):
                beam = [pair[index]["decoding"]["beam5"] for pair in pairs]
                p_values = ["", "", ""]
                if index == 0:
                    p_values = [", ".join(f"{bleu_bootstrap_p(*pair, references, 'beam5'):.3f}" for pair in pairs),
                                *(", ".join(f"{p[name]:.3f}" for p in coverage) for name in ("rep", "drop"))]
                lines.append(f"| {label} | {mean_std([b['bleu'] for b in beam])} | {mean_std([b['rep'] for b in beam])}"
                             f" | {mean_std([b['drop'] for b in beam])} | {' | '.join(p_values)} | "
                             f"{train_times(pairs, index)} |")
            lines += ["", f"p (DROP) comes from per-sentence counts of the evaluations' alignments where DROP's cache "
                          "held them when the report first tested the run, else of a new alignment (eflomal cannot be "
                          "seeded), kept beside each record (`*.drop_counts.json`) for every later report; the DROP "
                          f"those counts give is within {max(p['drop_difference'] for p in coverage):.2f} of the "
                          "recorded DROP."]
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def importance_table(results: dict) -> str:
    """DHICM's importances on the test set: the KL from uniform that Eq. 5 rewards (ln H: one head takes all)."""
    lines = ["| system | seed | module | mean KL from uniform (ln H = 1.386: one head) | tokens whose top head has "
             ">= 0.9 | share of tokens each head is the top one |", "|---|---|---|---|---|---|"]
    for (system, seed), result in results.items():
        for module, stats in result.get("head_importances", {}).items():
            shares = ", ".join(f"{share:.2f}" for share in stats["top_head_share"])
            lines.append(f"| {system} | {seed} | {module} | {stats['mean_kl']:.3f} | "
                         f"{stats['concentrated_share']:.1%} | {shares} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def length_figure(results: dict, path: Path) -> bool:
    systems = {}
    for system in FIGURE_SYSTEMS:
        if (system, 1) in results:
            result = results[system, 1]
            metrics = json.loads((result["record_dir"] / result["decoding"]["beam5"]["metrics"]).read_text())
            systems[system] = metrics["bleu_by_length"]
    if not systems:
        return False
    plot_bleu_by_length(systems, path, title="BLEU by source length, test_2016_flickr, beam 5, seed 1")
    return True


def describe_runs(results: dict) -> str:
    first = next(iter(results.values()))
    data = first["settings"]["data"]
    presets = {}  # preset name -> its flags, as the runs recorded them
    for result in results.values():
        presets.setdefault(result["settings"].get("preset_name", PRESET), result["settings"]["preset"])
    preset = ", ".join(f"--{key} {value}" for key, value in presets.pop(PRESET, TRAINING_PRESETS[PRESET]).items())
    other_presets = "; ".join(f"the `{name}` systems, trained by `--preset {name}` ("
                              + ", ".join(f"--{key} {value}" for key, value in flags.items()) + ")"
                              for name, flags in presets.items())
    machines = sorted({f"{r['machine_at_start']['processor']}, {r['machine_at_start']['cpu_count']} cores, "
                       f"{r['machine_at_start']['torch_threads']} torch threads"
                       + (f", {r['machine_at_start']['cuda']}" if r['machine_at_start']['cuda'] else "")
                       for r in results.values()})
    extra = sorted({r["settings"]["extra_flags"] for r in results.values() if r["settings"]["extra_flags"]})
    return (
        f"Training data: `{data['train_source']}` / `{Path(data['train_target']).name}` (all pairs unless the system "
        f"says otherwise), validation `{Path(data['valid_source']).name}`, test `{Path(data['test_source']).name}`. "
        f"Every system is trained by `hf-headattn-train --preset {PRESET}` ({preset}; model: d_model 256, 3 + 3 "
        "layers, 4 heads, FFN 1024, shared and tied embeddings for the Transformers; embedding 256, d = 512, one "
        "layer each side for the LSTMs)"
        + (f", except {other_presets}," if other_presets else "")
        + " plus its own flags, printed in each run's `result.json` "
        f"(`{Path(first['record_dir']).parent.parent}`)."
        + (f" Extra flags: {'; '.join(extra)}." if extra else "")
        + " BLEU, chrF and TER are sacrebleu's defaults (detokenized, cased); REP and DROP split words with "
        "sacrebleu's 13a tokenizer, DROP aligns with eflomal trained on the training pairs plus the test pairs. "
        f"Machines: {'; '.join(machines)}. Train time is the training command's wall-clock train_runtime_total, "
        "including the validation-loss passes every 500 steps; a run resumed from a checkpoint adds up its parts."
    )


def zero_share_table(results: dict) -> str:
    """Each system's share of exact zeros per attention site on the test set, mean +- standard deviation over the
    seeds that recorded it."""
    by_system: dict[str, list[dict]] = {}
    for (system, _), result in results.items():
        if "attention_zero_shares" in result:
            by_system.setdefault(system, []).append(result["attention_zero_shares"])
    lines = ["| system | seeds | encoder self-attention | decoder self-attention | cross-attention |",
             "|---|---|---|---|---|"]
    for system, records in by_system.items():
        cells = [mean_std([100 * record[site]["zero_share"] for record in records]) + " %"
                 if all(site in record for record in records) else "" for site in SITE_OUTPUTS]
        lines.append(f"| {system} | {len(records)} | {' | '.join(cells)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def learned_alphas_figures(records_dir: Path, results_file: Path) -> list[str]:
    """Links to the figures of learned alphas (`hf-headattn-plot learned-alphas`) kept with the records."""
    return [f"![Learned alphas of {path.parent.name}]({os.path.relpath(path, results_file.parent)})"
            for path in sorted(records_dir.glob("*/learned_alphas.png"))]


def write_report(args) -> None:
    records_dir = Path(args.records_dir)
    results = collect(records_dir)
    if not results:
        raise SystemExit(f"no recorded runs in {records_dir}")
    data = data_files(args)
    check_same_settings(results, data)
    references = Path(data["test_target"]).read_text(encoding="utf-8").splitlines()
    figure = records_dir / "bleu_by_length.png"
    commands = "\n".join(
        f"{r['command']}   # {r['finished']}, train {train_minutes(r)} min on {machine_label(r)}, load average "
        f"{r['machine_at_start']['load_average_1_5_15'][0]:.1f} at start, {r['machine_at_end']['load_average_1_5_15'][0]:.1f}"
        " at end" for r in results.values())
    sections = [
        "# Results on Multi30k De-En\n\nMeasured by `examples/benchmark_quality.py`: each system trained by the "
        f"package's training command with the anchor recipe (`--preset {PRESET}`) unless its name and claim name "
        "another (`malaviya2018`, `goindani2021`: the papers' own recipes), scored on test_2016_flickr. Runs "
        "are added one at a time; a system without a row has not been run yet.",
        "## Softmax against the anchor\n\nThe anchor: Transformers' `MarianMTModel` of the same shape and recipe "
        f"reached greedy BLEU {ANCHOR_BLEU} at {TRAINING_PRESETS[PRESET]['max_steps']:,} optimizer steps.\n\n"
        f"{anchor_table(results)}",
    ]
    batching = claims_tables(results, references, [BATCHING_QUESTION])
    if batching:
        sections.append(batching)
    sections.append(f"## Every system, seed 1\n\n{systems_table(results)}")
    if length_figure(results, figure):
        sections.append(f"![BLEU by source length]({os.path.relpath(figure, Path(args.results_file).parent)})")
    claims = (claims_tables(results, references, alignment_dir=Path(args.alignment_records_dir))
              or "No claim has runs of both its system and its baseline yet.")
    sections.append(f"## The papers' claims\n\n{claims}")
    zero_shares = zero_share_table(results)
    if zero_shares:
        sections.append("## Exact zeros in attention\n\nThe share of each site's attention weights that are exactly "
                        "zero on test_2016_flickr, teacher-forced on the references, over every layer and head and the "
                        "(query, key) pairs a query may attend to (`hf_headattn.attention_sparsity`); recorded by the "
                        f"runs since 2026-12-04.\n\n{zero_shares}")
    figures = learned_alphas_figures(records_dir, Path(args.results_file))
    if figures:
        sections.append("## Learned alphas\n\nEach head's alpha after training, by site and layer (Correia et al.'s "
                        "Figure 2), one mark a seed: `hf-headattn-plot learned-alphas`.\n\n" + "\n\n".join(figures))
    importances = importance_table(results)
    if importances:
        sections.append("## DHICM's head importances\n\nTeacher-forced on the test references; lambda = 0.1 is the "
                        f"paper's KL weight, lambda = 0 trains without the KL term.\n\n{importances}")
    notes = records_dir / "notes.md"  # what was learnt beside the runs (diagnostics, partial runs), kept by hand
    if notes.exists():
        sections.append(f"## Notes on these runs\n\n{notes.read_text(encoding='utf-8').strip()}")
    sections += kept_sections(Path(args.results_file))
    sections += [f"## Setup\n\n{describe_runs(results)}",
                 "## Commands that produced these results\n\nEach run, with its finish time, train time, machine and the "
                 "machine's 1-minute load average (above the machine's core count, the run shared the machine with "
                 "other work):\n\n"
                 f"```\n{commands}\n```"]
    report = "\n\n".join(sections) + "\n"
    Path(args.results_file).write_text(report, encoding="utf-8")
    print(f"wrote {args.results_file} ({len(results)} runs)")


# Sections other scripts write into the report between markers (examples/benchmark_<name>.py); a rewrite keeps them
# decoding, decoding-gpu, backends: in BENCHMARKS.md
OTHER_SECTIONS = ("alignment", "averaging", "decoding", "decoding-gpu", "decoding-full", "speed-gpu", "data_prep-intel",
                  "data_prep-amd", "data_prep-other",
                  "fast_path", "compiled_step", "backends", "backends-gpu", "translation_outputs", "decoding_profile",
                  "decoding_profile-gpu", "kernel_launches")


def section_markers(name: str) -> tuple[str, str]:
    """A section's markers; "<script>-<what>" names a second section of examples/benchmark_<script>.py."""
    script, _, what = name.partition("-")
    return (f"<!-- section written by examples/benchmark_{script}.py{f' ({what})' if what else ''} -->",
            f"<!-- end of section {name} -->")


def kept_sections(results_file: Path) -> list[str]:
    """The other scripts' sections of the report as it stands, markers included."""
    current = results_file.read_text(encoding="utf-8") if results_file.exists() else ""
    kept = []
    for name in OTHER_SECTIONS:
        start, end = section_markers(name)
        if start in current and end in current:
            kept.append(start + current.partition(start)[2].partition(end)[0] + end)
    return kept


def replace_section(results_file: Path, name: str, text: str) -> None:
    """Put `text` into the report as section `name` (between its markers), in place of the old one, else at the end
    (the report is written by :func:`write_report`, which keeps such sections)."""
    if name not in OTHER_SECTIONS:
        raise ValueError(f"Unknown report section {name!r}; known: {', '.join(OTHER_SECTIONS)}")
    start, end = section_markers(name)
    block = f"{start}\n{text.strip()}\n{end}"
    current = results_file.read_text(encoding="utf-8") if results_file.exists() else ""
    if start in current and end in current:
        before, _, rest = current.partition(start)
        updated = before + block + rest.partition(end)[2]
    else:
        updated = (current.rstrip("\n") + "\n\n" if current else "") + block + "\n"
    temporary = results_file.with_name(f".{results_file.name}.partial")
    temporary.write_text(updated, encoding="utf-8")
    os.replace(temporary, results_file)


PUBLISHED_MARKDOWN = "BENCHMARKS.md"


def add_publish_arguments(parser: argparse.ArgumentParser, committed: str) -> None:
    """The --output and --markdown flags that :func:`publish` reads; `committed`: the published JSON report."""
    parser.add_argument("--output", default=None,
                        help=f"the JSON report (default: {committed}, for a run that measures all of it)")
    parser.add_argument("--markdown", default=None,
                        help=f"the Markdown report that gets the table as its section (default: {PUBLISHED_MARKDOWN}, "
                             "beside the default --output; '' for none)")


def missing_rows(committed: Path, report: dict, rows) -> list:
    """The rows (`rows(report)`: a set of a report's row keys, e.g. sizes or systems) of the published JSON report
    `committed` that `report` does not measure; none if it does not exist yet."""
    if not committed.exists():
        return []
    try:
        published = rows(json.loads(committed.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"{committed}: not a report of this benchmark ({type(error).__name__}: {error}); this run's results "
              "replace it", file=sys.stderr)
        return []
    return sorted(published - rows(report), key=str)


def publish(report: dict, section: str, text: str, *, output: str | None, markdown: str | None, committed: str,
            rows=None, smoke: bool = False) -> None:
    """A benchmark's results: `report` as a JSON file and `text` as section `section` of a Markdown report, each file
    replaced whole (its folder created), then `text` printed.

    `output` and `markdown` are the --output and --markdown flags (:func:`add_publish_arguments`): given, they are
    used (--markdown '' for none), and --output alone writes no section (a section goes with its published JSON).
    Without --output, the JSON goes to the published report `committed` and, without --markdown, the section to
    BENCHMARKS.md, but only from a run that measures all of `committed`: a smoke run (`smoke`), or one whose rows
    (`rows(report)`, a set of row keys) lack some of the published JSON's (fewer sizes, systems or beams), leaves
    them as they are and says so, so that its numbers never replace the published ones in part."""
    partial = None
    if output is None:
        if smoke:
            partial = "a smoke run (--quick)"
        elif rows is not None and (missing := missing_rows(Path(committed), report, rows)):
            partial = f"this run does not measure {', '.join(map(str, missing))} of {committed}"
    json_path = Path(output) if output else None if partial else Path(committed)
    markdown_path = Path(markdown) if markdown else None if markdown == "" or output or partial else \
        Path(PUBLISHED_MARKDOWN)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = json_path.with_name(f".{json_path.name}.partial")
        temporary.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, json_path)
    if markdown_path is not None:
        replace_section(markdown_path, section, text)
    print(text)
    if partial:
        kept = " and ".join([committed] + ([PUBLISHED_MARKDOWN] if markdown is None else []))
        print(f"\nNot published: {partial}; {kept} left as {'they are' if markdown is None else 'it is'} (--output "
              "and --markdown write these results anyway).", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ the command
DEFAULT_DATA_DIR = "../shared/data/multi30k"


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags :func:`data_files` reads (shared with the other benchmarks that train these systems)."""
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="Multi30k folder (train/val/test_2016_flickr .de/.en); or give the six --*-source/"
                             "--*-target files of any parallel data instead")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}-source")
        parser.add_argument(f"--{split}-target")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=["transformer softmax"], choices=list(SYSTEMS),
                        metavar="SYSTEM", help="which systems to run, one after another (--list shows them)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds of each system")
    parser.add_argument("--list", action="store_true", help="print the systems and their training flags")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from the records")
    parser.add_argument("--no-report", action="store_true",
                        help="record the runs without rewriting the report (for several runs at once sharing the "
                             "records dir; rebuild the report afterwards with --report-only)")
    add_data_arguments(parser)
    parser.add_argument("--output-dir", default="runs/quality", help="model folders (not committed)")
    parser.add_argument("--records-dir", default="benchmarks/quality", help="what the report is built from")
    parser.add_argument("--alignment-records-dir", default="benchmarks/alignment",
                        help="examples/benchmark_alignment.py's records: the AER of the guided-alignment claims")
    parser.add_argument("--results-file", default="RESULTS.md")
    parser.add_argument("--cards-dir", default="model_cards/multi30k", help="where copies of the filled cards go")
    parser.add_argument("--dataset-name", default="Multi30k De-En (task 1)")
    parser.add_argument("--dataset-id", default="bentrevett/multi30k")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences decoded at once")
    parser.add_argument("--transformer-flags", default="",
                        help="training flags added to every Transformer's (e.g. a smaller model for a smoke test)")
    parser.add_argument("--lstm-flags", default="", help="training flags added to every LSTM's")
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.list:
        for system, spec in SYSTEMS.items():
            how = f"the model of {spec.decoded_like!r}" if spec.decoded_like else shlex.join(spec.flags) or "(preset)"
            print(f"{system:40s} {spec.architecture:12s} {how}")
        return
    given = [getattr(args, key) for key in DATA_KEYS]
    if any(given) and not all(given):
        parser.error("give all six --train/--valid/--test -source/-target files, or none (then --data-dir)")
    if not args.report_only:
        data = data_files(args)
        for path in data.values():
            if not Path(path).is_file():
                parser.error(f"no such file: {path}")
        for seed in args.seeds:
            for system in args.systems:
                run(system, seed, args, data)
                if not args.no_report:
                    write_report(args)
        return
    write_report(args)


if __name__ == "__main__":
    main()
