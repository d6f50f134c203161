#!/usr/bin/env python
"""Translation quality of every registered attention variant and of the LSTM family, trained with identical
hyper-parameters and the same fixed budget (epochs over the same pairs, so the same optimizer steps) on
Multi30k De-En (or any line-aligned parallel files), scored on one test set with BLEU, chrF, TER, REP and DROP
(`hf_headattn.evaluation.evaluate_model`: beam search, words split with sacrebleu's 13a tokenizer, DROP aligned
with eflomal trained on the training pairs plus the test pairs).

Writes, per system, a model folder with its evaluation JSON and a model card (README.md) filled from it;
then one table (BLEU, chrF, TER, REP, DROP, parameters, train time) to --results-file and to every card, and
copies of the cards to --cards-dir. Each system's results are kept in its folder, so subsets of --systems can
run side by side (e.g. two processes with --threads 1 on two cores): every run rewrites the table from all the
systems found in --output-dir.

    python examples/benchmark_quality.py --output-dir runs/quality --results-file RESULTS.md
"""

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS  # noqa: E402
from hf_headattn.evaluation import evaluate_model  # noqa: E402
from hf_headattn.hub import write_model_card  # noqa: E402
from hf_headattn.training import train, multi30k_paths  # noqa: E402


# Each Transformer variant at the site (and layers) its paper puts it; every other site is softmax.
TRANSFORMER_SYSTEMS = {
    "softmax": {},
    "running_sum": {"--cross_attention": "running_sum"},  # the coverage-penalised softmax that tests the seam
    "mma": {"--encoder_self_attention": "mma"},  # Cui et al.: encoder self-attention
    "dhicm": {f"--{site}": "dhicm" for site in ("encoder-self-attention", "decoder-self-attention",
                                                 "cross-attention")},  # Goindani & Shrivastava: last layer
    "sparsemax": {"--cross_attention": "sparsemax"},  # Malaviya et al.: the source attention
    "csoftmax": {"--cross_attention": "csoftmax", "--fertility": "guided"},
    "csparsemax": {"--cross_attention": "csparsemax", "--fertility": "guided"},
    "multihop": {"--cross_attention": "multihop"},  # Iida et al.'s second hop over the heads
}
RNN_SYSTEMS = {
    "lstm baseline 1x1": {},
    "lstm multi-hop dependent 2x2": {"--heads": "2", "--hops": "2", "--hop_mode": "dependent"},
    "lstm csparsemax 1x1": {"--attention_transform": "csparsemax", "--fertility": "guided"},
}
SYSTEMS = {**{f"transformer {name}": flags for name, flags in TRANSFORMER_SYSTEMS.items()}, **RNN_SYSTEMS}
assert set(TRANSFORMER_SYSTEMS) == set(ATTENTION_VARIANTS), "benchmark_quality: a registered variant has no system"


DATA_KEYS = [f"{split}_{side}" for split in ("train", "valid", "test") for side in ("source", "target")]


def data_files(args) -> dict:
    """The six files: those given on the command line, or Multi30k's from --data-dir."""
    if all(getattr(args, key) for key in DATA_KEYS):
        return {key: str(getattr(args, key)) for key in DATA_KEYS}
    paths = multi30k_paths(args.data_dir)
    names = ["train.de", "train.en", "val.de", "val.en", "test_2016_flickr.de", "test_2016_flickr.en"]
    return {key: str(paths[name]) for key, name in zip(DATA_KEYS, names)}


def folder_name(system: str) -> str:
    return system.replace(" ", "-")


def train_and_evaluate(system: str, args, data: dict, argv: list[str]) -> dict:
    model_dir = Path(args.output_dir) / folder_name(system)
    architecture = "rnn" if system.startswith("lstm") else "transformer"
    sizes = (["--d_model", str(args.d_model), "--ffn_dim", str(4 * args.d_model), "--heads", "4"]
             if architecture == "transformer" else
             ["--embedding_size", str(args.embedding_size), "--hidden_size", str(args.hidden_size)])
    flags = [item for flag, value in SYSTEMS[system].items() for item in (flag, value)]
    train_metrics = train([
        "--architecture", architecture,
        "--train_source", str(data["train_source"]), "--train_target", str(data["train_target"]),
        "--valid_source", str(data["valid_source"]), "--valid_target", str(data["valid_target"]),
        "--max_train_pairs", str(args.train_pairs), "--max_valid_pairs", "200",
        "--output_dir", str(model_dir), "--vocab_size", str(args.vocab_size), *sizes,
        "--dropout", str(args.dropout), "--label_smoothing", "0.1",
        "--num_train_epochs", str(args.epochs), "--per_device_train_batch_size", str(args.batch_size),
        "--learning_rate", str(args.learning_rate),
        "--warmup_steps", str(args.warmup_steps), "--seed", str(args.seed), *flags,
    ])
    evaluation = evaluate_model(
        model_dir, data["test_source"], data["test_target"], num_beams=args.num_beams, batch_size=32, device="cpu",
        train_source=data["train_source"], train_target=data["train_target"], output_dir=model_dir,
    )
    result = {
        "system": system, "architecture": architecture,
        **{key: evaluation[key] for key in ("bleu", "chrf", "ter", "rep", "drop")},
        "parameters": train_metrics["parameters"], "train_runtime_s": train_metrics["train_runtime"],
        "evaluation_json": evaluation["files"]["metrics"], "settings": settings(args),
        "threads": torch.get_num_threads(), "command": command_line(argv),
    }
    (model_dir / "quality_result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{system}: BLEU {result['bleu']:.2f}, REP {result['rep']:.2f}, DROP {result['drop']:.2f}")
    return result


def settings(args) -> dict:
    """The arguments that change what is trained and measured (not which systems, threads or report files)."""
    ignored = ("systems", "threads", "report_only", "results_note", "results_file", "cards_dir", "dataset_name",
               "dataset_id")
    return {key: value for key, value in vars(args).items() if key not in ignored}


def command_line(argv: list[str]) -> str:
    return shlex.join(["python", "examples/benchmark_quality.py", *argv])


def collect_results(output_dir: Path) -> dict:
    """Every system with a result in output_dir (also from other runs), in SYSTEMS order."""
    results = {}
    for system in SYSTEMS:
        path = output_dir / folder_name(system) / "quality_result.json"
        if path.exists():
            results[system] = json.loads(path.read_text())
    return results


def results_table(results: dict) -> str:
    lines = ["| system | BLEU | chrF | TER | REP | DROP | parameters | train time (s, CPU) |",
             "|---|---|---|---|---|---|---|---|"]
    for system, r in results.items():
        lines.append(f"| {system} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['ter']:.2f} | {r['rep']:.2f} | "
                     f"{r['drop']:.2f} | {r['parameters']:,} | {r['train_runtime_s']:.0f} |")
    return "\n".join(lines)


def optimizer_steps(args) -> int:
    return math.ceil(args.epochs * math.ceil(args.train_pairs / args.batch_size))  # as Trainer counts them


def describe_setup(results: dict, note: str | None = None) -> str:
    """The shared settings of every system in `results` (an error if two systems were trained differently)."""
    settings_seen = {json.dumps(r["settings"], sort_keys=True) for r in results.values()}
    if len(settings_seen) > 1:
        raise ValueError("the systems found were trained with different settings; use a fresh --output-dir:\n"
                         + "\n".join(settings_seen))
    args = argparse.Namespace(**next(iter(results.values()))["settings"])
    data = data_files(args)
    threads = sorted({r["threads"] for r in results.values()})
    return (
        f"Training data: the first {args.train_pairs:,} pairs of `{data['train_source']}` / "
        f"`{Path(data['train_target']).name}`, a BPE vocabulary of {args.vocab_size:,}. Every system: "
        f"{args.epochs:g} epochs at batch size {args.batch_size} ({optimizer_steps(args):,} optimizer steps), AdamW, "
        "learning rate "
        f"{args.learning_rate:g} with inverse-square-root decay after {args.warmup_steps} warm-up steps, dropout "
        f"{args.dropout:g}, label smoothing 0.1, seed {args.seed}. Transformers: d_model {args.d_model}, 3 + 3 "
        f"layers, 4 heads, FFN {4 * args.d_model}; each variant at its paper's site (`examples/benchmark_quality.py`"
        f" lists them), softmax elsewhere; csoftmax and csparsemax with GUIDED fertility. LSTMs: embedding "
        f"{args.embedding_size}, d = {args.hidden_size}, one layer each side. Test set: "
        f"`{Path(data['test_source']).name}` ({'beam ' + str(args.num_beams)}); REP and DROP split words with "
        f"sacrebleu's 13a tokenizer, DROP aligns with eflomal trained on the training pairs plus the test pairs. "
        f"Train time is wall-clock seconds on CPU ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {'/'.join(map(str, threads))} torch thread(s) per run), including the "
        "validation passes at the end of each epoch."
        + (f" {note}" if note else "")
    )


def write_results(results: dict, args) -> None:
    table = results_table(results)
    setup = describe_setup(results, args.results_note)
    commands = "\n".join(dict.fromkeys(r["command"] for r in results.values()))
    Path(args.results_file).write_text(
        "# Results across variants (CPU, fixed budget)\n\n"
        "Measured by `examples/benchmark_quality.py`: every registered attention variant and the LSTM family, "
        "trained with identical hyper-parameters and the same number of optimizer steps, then scored on the same "
        "test set. These are small CPU-trained models, to compare the variants with each other, not to compare "
        "with the papers' absolute numbers.\n\n"
        f"{table}\n\n## Setup\n\n{setup}\n\n## Commands that produced these results\n\n```\n{commands}\n```\n"
    )
    cards_dir = Path(args.cards_dir)
    cards_dir.mkdir(parents=True, exist_ok=True)
    for system, result in results.items():
        model_dir = Path(args.output_dir) / folder_name(system)
        card = write_model_card(model_dir, result["evaluation_json"], dataset_name=args.dataset_name,
                                dataset_id=args.dataset_id, model_name=f"hf_headattn {system} (Multi30k De-En)")
        with card.open("a", encoding="utf-8") as handle:
            handle.write(f"\n## Compared with the other variants (same data, hyper-parameters and budget)\n\n"
                         f"{table}\n\n{setup}\n")
        shutil.copyfile(card, cards_dir / f"{folder_name(system)}.md")
    print(f"\n{table}\n\nwrote {args.results_file} and {len(results)} model card(s) in {cards_dir}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data/multi30k",
                        help="Multi30k folder (train/val/test_2016_flickr .de/.en); or give the four --*-source/"
                             "--*-target files of any parallel data instead")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}-source")
        parser.add_argument(f"--{split}-target")
    parser.add_argument("--output-dir", default="runs/quality")
    parser.add_argument("--results-file", default="RESULTS.md")
    parser.add_argument("--cards-dir", default="model_cards/multi30k", help="where copies of the filled cards go")
    parser.add_argument("--dataset-name", default="Multi30k De-En (task 1)")
    parser.add_argument("--dataset-id", default="bentrevett/multi30k")
    parser.add_argument("--train-pairs", type=int, default=10000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--epochs", type=float, default=4, help="the budget: epochs over --train-pairs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS), metavar="SYSTEM",
                        help=f"which systems to train (default: all of {', '.join(SYSTEMS)})")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (e.g. 1 for two runs)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the table and cards")
    parser.add_argument("--results-note", help="a sentence added to the setup in the table's text (e.g. how the "
                        "runs shared the machine)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    given = [getattr(args, key) for key in DATA_KEYS]
    if any(given) and not all(given):
        parser.error("give all six --train/--valid/--test -source/-target files, or none (then --data-dir)")
    if not args.report_only:
        data = data_files(args)
        for path in data.values():
            if not Path(path).is_file():
                parser.error(f"no such file: {path}")
        for system in args.systems:
            train_and_evaluate(system, args, data, sys.argv[1:] if argv is None else argv)
    results = collect_results(Path(args.output_dir))
    if not results:
        raise SystemExit(f"no system results in {args.output_dir}")
    write_results(results, args)


if __name__ == "__main__":
    main()
