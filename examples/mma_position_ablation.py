#!/usr/bin/env python
"""The MMA paper's Table 3 ablation at small scale: softmax vs. MMA encoder self-attention, each with and without
position embeddings, trained with identical hyper-parameters on the first N pairs of Multi30k and scored on
test_2016_flickr (BLEU, chrF with sacrebleu). Writes a JSON and prints a table.

    python examples/mma_position_ablation.py --data-dir ../shared/data/multi30k --train-pairs 10000 \
        --output-dir runs/mma-ablation
"""

import argparse
import json
from pathlib import Path

from hf_headattn.evaluation import translate_and_score
from hf_headattn.training import train, multi30k_paths


SYSTEMS = {
    "softmax": ("softmax", "sinusoidal"),
    "mma": ('{"type": "mma", "window": 1}', "sinusoidal"),
    "softmax, no positions": ("softmax", "none"),
    "mma, no positions": ('{"type": "mma", "window": 1}', "none"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    parser.add_argument("--output-dir", default="runs/mma-ablation")
    parser.add_argument("--train-pairs", type=int, default=10000)
    parser.add_argument("--epochs", type=float, default=6)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--num-beams", type=int, default=4)
    args = parser.parse_args(argv)

    data, output_dir = multi30k_paths(args.data_dir), Path(args.output_dir)
    results = {}
    for system, (encoder_attention, position_embedding) in SYSTEMS.items():
        model_dir = output_dir / system.replace(", ", "-").replace(" ", "-")
        train([
            "--train_source", str(data["train.de"]), "--train_target", str(data["train.en"]),
            "--valid_source", str(data["val.de"]), "--valid_target", str(data["val.en"]),
            "--max_train_pairs", str(args.train_pairs), "--max_valid_pairs", "200",
            "--output_dir", str(model_dir), "--vocab_size", "8000", "--d_model", str(args.d_model),
            "--layers", str(args.layers), "--heads", str(args.heads), "--ffn_dim", str(args.ffn_dim),
            "--num_train_epochs", str(args.epochs), "--per_device_train_batch_size", "64", "--learning_rate", "1e-3",
            "--warmup_steps", "200",
            "--seed", "1",
            "--encoder_self_attention", encoder_attention, "--position_embedding", position_embedding,
        ])
        scores = translate_and_score(model_dir, data["test_2016_flickr.de"], data["test_2016_flickr.en"],
                                     num_beams=args.num_beams)
        (model_dir / "test_2016_flickr.hyp.en").write_text("\n".join(scores.pop("hypotheses")) + "\n")
        results[system] = scores
        print(f"{system}: {scores}")

    (output_dir / "ablation_results.json").write_text(json.dumps({"settings": vars(args), "results": results},
                                                                  indent=2) + "\n")
    print("\n| system | test_2016_flickr BLEU | chrF |\n|---|---|---|")
    for system, scores in results.items():
        print(f"| {system} | {scores['bleu']:.2f} | {scores['chrf']:.2f} |")


if __name__ == "__main__":
    main()
