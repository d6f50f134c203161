#!/usr/bin/env python
"""Importance-guided head pruning of a trained DHICM model (the DHICM paper's future work, Sec. 8).

Averages every DHICM head's importance over the validation set (teacher-forced on the references), removes the
k least important heads of each DHICM module (the q/k/v projections physically shrink), saves the pruned model
(it loads through remote code like any other), and reports test BLEU/chrF and translation speed before and after.
Speed runs are interleaved (original, pruned, original, pruned, ...) so that the spread shows the noise.

    python examples/dhicm_head_pruning.py --model runs/dhicm-multi30k/dhicm --data-dir ../shared/data/multi30k \
        --heads-to-prune 1 --output-dir runs/dhicm-multi30k/dhicm-pruned
"""

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM

from hf_headattn.head_pruning import mean_head_importances, prune_least_important_heads
from hf_headattn.loading import add_trust_remote_code_argument, load_model_and_tokenizer, remote_code_allowed
from hf_headattn.metrics import score_translations
from hf_headattn.parallel_data import read_parallel_files
from hf_headattn.training import multi30k_paths
from hf_headattn.translation import translate_sentences


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="saved DHICM model folder (or a Hub id with --trust-remote-code)")
    add_trust_remote_code_argument(parser)
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    parser.add_argument("--heads-to-prune", type=int, default=1, help="heads removed from every DHICM module")
    parser.add_argument("--output-dir", required=True, help="where the pruned model is saved")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--speed-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    try:
        remote_code_allowed(args.model, args.trust_remote_code)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)

    data, output_dir = multi30k_paths(args.data_dir), Path(args.output_dir)
    valid = read_parallel_files(data["val.de"], data["val.en"])
    test = read_parallel_files(data["test_2016_flickr.de"], data["test_2016_flickr.en"])
    original, tokenizer = load_model_and_tokenizer(args.model, trust_remote_code=args.trust_remote_code)

    importances = mean_head_importances(original, tokenizer, valid["source"], valid["target"],
                                        batch_size=args.batch_size)
    pruned = copy.deepcopy(original)
    removed = prune_least_important_heads(pruned, importances, args.heads_to_prune)
    pruned.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    pruned = AutoModelForSeq2SeqLM.from_pretrained(output_dir, trust_remote_code=True).eval()  # just written here

    systems = {"original": original, "pruned": pruned}
    scores, seconds = {}, {name: [] for name in systems}
    for repeat in range(args.speed_repeats):
        for name, model in systems.items():
            start = time.perf_counter()
            hypotheses = translate_sentences(model, tokenizer, test["source"], args.num_beams, args.batch_size,
                                             desc=f"{name}, run {repeat + 1}")
            seconds[name].append(time.perf_counter() - start)
            scores[name] = score_translations(hypotheses, test["target"])
    (output_dir / "test_2016_flickr.hyp.en").write_text("\n".join(hypotheses) + "\n")

    report = {
        "settings": vars(args),
        "mean_importances": {name: values.tolist() for name, values in importances.items()},
        "removed_heads": removed,
        "results": {
            name: {
                **scores[name],
                "parameters": model.num_parameters(),
                "sentences_per_s_median": len(test) / statistics.median(seconds[name]),
                "seconds_per_run": seconds[name],
            }
            for name, model in systems.items()
        },
    }
    (output_dir / "pruning_results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"mean_importances": report["mean_importances"], "removed_heads": removed}, indent=2))
    print(f"\nbeam {args.num_beams}, batch {args.batch_size}, {args.threads} threads, {len(test)} test sentences")
    print("| model | BLEU | chrF | parameters | sentences/s (median) | seconds per run |\n|---|---|---|---|---|---|")
    for name, result in report["results"].items():
        runs = ", ".join(f"{value:.1f}" for value in result["seconds_per_run"])
        print(f"| {name} | {result['bleu']:.2f} | {result['chrf']:.2f} | {result['parameters']:,} | "
              f"{result['sentences_per_s_median']:.1f} | {runs} |")


if __name__ == "__main__":
    main()
