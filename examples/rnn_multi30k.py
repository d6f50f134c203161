#!/usr/bin/env python
"""The LSTM encoder-decoder systems of Iida et al. (multi-head, multi-hop attention) and Malaviya et al. (sparse
and constrained attention), trained with identical hyper-parameters on the first N pairs of Multi30k De-En and
scored on test_2016_flickr: BLEU, chrF, TER, REP and DROP (hf_headattn.metrics, words split with sacrebleu's
13a tokenizer; DROP aligns with eflomal trained on the training pairs plus the test set). Writes results.json and prints a Markdown table.

Systems: the Luong baseline (1 head, 1 hop), multi-head 2x1, multi-hop dependent 2x2, and the baseline with
csparsemax attention and PREDICTED fertility.

    python examples/rnn_multi30k.py --data-dir ../shared/data/multi30k --train-pairs 10000 \
        --output-dir runs/rnn-multi30k
"""

import argparse
import json
from pathlib import Path

import torch

from hf_headattn.metrics import all_metrics
from hf_headattn.evaluation import translate_and_score
from hf_headattn.parallel_data import read_parallel_files
from hf_headattn.training import train, multi30k_paths


SYSTEMS = {
    "baseline 1x1": [],
    "multi-head 2x1": ["--heads", "2"],
    "multi-hop dependent 2x2": ["--heads", "2", "--hops", "2", "--hop_mode", "dependent"],
    "csparsemax predicted 1x1": ["--attention_transform", "csparsemax", "--fertility", "predicted"],
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    parser.add_argument("--output-dir", default="runs/rnn-multi30k")
    parser.add_argument("--train-pairs", type=int, default=10000)
    parser.add_argument("--epochs", type=float, default=8)
    parser.add_argument("--embedding-size", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS), metavar="SYSTEM",
                        help=f"which systems to train (default: all of {', '.join(SYSTEMS)})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (e.g. 1 to run two --systems subsets side by side on 2 cores)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    data, output_dir = multi30k_paths(args.data_dir), Path(args.output_dir)
    train_text = read_parallel_files(data["train.de"], data["train.en"], args.train_pairs)
    test_text = read_parallel_files(data["test_2016_flickr.de"], data["test_2016_flickr.en"])
    for system in args.systems:
        model_dir = output_dir / system.replace(" ", "-")
        train_metrics = train([
            "--architecture", "rnn",
            "--train_source", str(data["train.de"]), "--train_target", str(data["train.en"]),
            "--valid_source", str(data["val.de"]), "--valid_target", str(data["val.en"]),
            "--max_train_pairs", str(args.train_pairs), "--max_valid_pairs", "200",
            "--output_dir", str(model_dir), "--vocab_size", "8000",
            "--embedding_size", str(args.embedding_size), "--hidden_size", str(args.hidden_size),
            "--dropout", str(args.dropout), "--label_smoothing", "0.1",
            "--num_train_epochs", str(args.epochs), "--per_device_train_batch_size", "64",
            "--learning_rate", str(args.learning_rate),
            "--warmup_steps", "300", "--seed", str(args.seed), *SYSTEMS[system],
        ])
        translated = translate_and_score(model_dir, data["test_2016_flickr.de"], data["test_2016_flickr.en"],
                                         num_beams=args.num_beams)
        hypotheses = translated["hypotheses"]
        (model_dir / "test_2016_flickr.hyp.en").write_text("\n".join(hypotheses) + "\n")
        metrics = all_metrics(test_text["source"], hypotheses, test_text["target"],
                              train_sources=train_text["source"], train_targets=train_text["target"],
                              tokenize="13a")  # the text is raw: split punctuation off words for REP and DROP
        result = {**metrics, "settings": vars(args), "parameters": train_metrics["parameters"],
                  "train_runtime_s": train_metrics["train_runtime"]}
        (model_dir / "test_metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"{system}: BLEU {metrics['bleu']:.2f}, REP {metrics['rep']:.2f}, DROP {metrics['drop']:.2f}")

    # every system trained into this folder so far, also by other runs (e.g. two --systems subsets side by side)
    results = {}
    for system in SYSTEMS:
        path = output_dir / system.replace(" ", "-") / "test_metrics.json"
        if path.exists():
            results[system] = json.loads(path.read_text())
    (output_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n| system | BLEU | chrF | TER | REP | DROP | parameters | train time (s, CPU) |\n|---|---|---|---|---|---|---|---|")
    for system, scores in results.items():
        print(f"| {system} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {scores['ter']:.2f} | {scores['rep']:.2f} | "
              f"{scores['drop']:.2f} | {scores['parameters']:,} | {scores['train_runtime_s']:.0f} |")


if __name__ == "__main__":
    main()
