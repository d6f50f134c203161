#!/usr/bin/env python
"""Softmax vs. DHICM (Goindani & Shrivastava) with identical hyper-parameters on the first N pairs of Multi30k
De-En, scored on test_2016_flickr (BLEU, chrF with sacrebleu). DHICM sits, as in the paper's best setting, at
the last layer's encoder self-, decoder self- and cross-attention with lambda = 0.1. Writes a JSON and prints
a table.

    python examples/dhicm_multi30k.py --data-dir ../shared/data/multi30k --train-pairs 10000 \
        --output-dir runs/dhicm-multi30k
"""

import argparse
import json
from pathlib import Path

from hf_headattn.evaluation import translate_and_score
from hf_headattn.training import train, multi30k_paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    parser.add_argument("--output-dir", default="runs/dhicm-multi30k")
    parser.add_argument("--train-pairs", type=int, default=10000)
    parser.add_argument("--epochs", type=float, default=8)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4, help="4: the paper's optimal De-En setting (Table 2)")
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--dhicm-dropout", type=float, default=0.3, help="dropout after U x (Eq. 2)")
    parser.add_argument("--kl-weight", type=float, default=0.1, help="lambda of Eq. 5")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    data, output_dir = multi30k_paths(args.data_dir), Path(args.output_dir)
    dhicm = json.dumps({"type": "dhicm", "layers": [-1], "dropout": args.dhicm_dropout, "kl_weight": args.kl_weight})
    systems = {"softmax": "softmax", "dhicm": dhicm}
    results = {}
    for system, spec in systems.items():
        model_dir = output_dir / system
        train_metrics = train([
            "--train_source", str(data["train.de"]), "--train_target", str(data["train.en"]),
            "--valid_source", str(data["val.de"]), "--valid_target", str(data["val.en"]),
            "--max_train_pairs", str(args.train_pairs), "--max_valid_pairs", "200",
            "--output_dir", str(model_dir), "--vocab_size", "8000", "--d_model", str(args.d_model),
            "--layers", str(args.layers), "--heads", str(args.heads), "--ffn_dim", str(args.ffn_dim),
            "--dropout", str(args.dropout), "--label_smoothing", "0.1",
            "--num_train_epochs", str(args.epochs), "--per_device_train_batch_size", "64", "--learning_rate", "1e-3",
            "--warmup_steps", "300",
            "--seed", str(args.seed),
            "--encoder_self_attention", spec, "--decoder_self_attention", spec, "--cross_attention", spec,
        ])
        scores = translate_and_score(model_dir, data["test_2016_flickr.de"], data["test_2016_flickr.en"],
                                     num_beams=args.num_beams)
        (model_dir / "test_2016_flickr.hyp.en").write_text("\n".join(scores.pop("hypotheses")) + "\n")
        results[system] = {**scores, "parameters": train_metrics["parameters"],
                           "train_runtime_s": train_metrics["train_runtime"]}
        print(f"{system}: {results[system]}")

    (output_dir / "results.json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=2) + "\n")
    print("\n| system | test_2016_flickr BLEU | chrF | parameters | train time (s, CPU) |\n|---|---|---|---|---|")
    for system, scores in results.items():
        print(f"| {system} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {scores['parameters']:,} | "
              f"{scores['train_runtime_s']:.0f} |")


if __name__ == "__main__":
    main()
