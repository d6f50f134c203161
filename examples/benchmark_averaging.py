#!/usr/bin/env python
"""What checkpoint averaging (`hf-headattn-average`) gains: the anchor-recipe softmax Transformer, its last
checkpoint against the mean of its last --last checkpoints, greedy and beam-5 BLEU on Multi30k's test_2016_flickr,
per seed, with sacrebleu's paired bootstrap p-value (1,000 resamples) of each seed's difference.

    python examples/benchmark_averaging.py --seeds 1 2 3

Each seed trains `hf-headattn-train --preset multi30k-anchor` (as examples/benchmark_quality.py's "transformer
softmax") with `--save_steps 200 --save_total_limit 5 --keep_checkpoints`, so that the last five checkpoints
(steps 1,400 to 2,090 of 2,090, about the last third of training) are kept, into --output-dir/seed-<n> (resumable:
run the command again after an interruption); `hf-headattn-average --last 5` writes seed-<n>-average. Both are
evaluated with `hf-headattn-evaluate`'s function; each seed's record goes to --records-dir/seed-<n>.json, the table
to --records-dir/section.md and, between its markers, to RESULTS.md.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's recipe and helpers
from benchmark_quality import (add_data_arguments, data_files, machine, machine_label, mean_std,  # noqa: E402
                               paired_bleu_p, replace_section, training_argv)
from hf_headattn.averaging import average_checkpoints, last_checkpoints  # noqa: E402
from hf_headattn.evaluation import evaluate_model  # noqa: E402
from hf_headattn.training import train  # noqa: E402
from hf_headattn.translation import read_lines  # noqa: E402

SYSTEM = "transformer softmax"
CHECKPOINT_FLAGS = ["--save_steps", "200", "--save_total_limit", "5", "--keep_checkpoints"]
DECODINGS = {"greedy": 1, "beam5": 5}
SECTION = "averaging"


def run_seed(seed: int, data: dict, args) -> dict:
    record_path = Path(args.records_dir) / f"seed-{seed}.json"
    if record_path.exists():
        print(f"seed {seed}: recorded already in {record_path}")
        return json.loads(record_path.read_text())
    model_dir = Path(args.output_dir) / f"seed-{seed}"
    train_argv = [*training_argv(SYSTEM, seed, data, model_dir, args), *CHECKPOINT_FLAGS,
                  *shlex.split(args.checkpoint_flags)]
    if not (model_dir / "train_results.json").is_file():
        train(train_argv)
    checkpoints = last_checkpoints(model_dir, args.last)
    average_dir = Path(args.output_dir) / f"seed-{seed}-average{args.last}"
    if not (average_dir / "config.json").is_file():
        average_checkpoints(checkpoints, average_dir)
    record = {"seed": seed, "averaged": [checkpoint.name for checkpoint in checkpoints],
              # where it trained and decoded: seeds of one table may run on different machines
              "trained_on": machine_label({"machine_at_start": machine()}),
              "training_command": shlex.join(["hf-headattn-train", *train_argv]),
              "average_command": shlex.join(["hf-headattn-average", "--last", str(args.last), str(model_dir),
                                             "--output_dir", str(average_dir)]),
              "command": shlex.join(["python", "examples/benchmark_averaging.py", "--seeds", str(seed)])}
    evaluation_dir = Path(args.records_dir) / f"seed-{seed}"
    references = read_lines(data["test_target"])
    for decoding, num_beams in DECODINGS.items():
        results = {}
        for name, folder in (("last", model_dir), ("average", average_dir)):
            evaluated = evaluate_model(folder, data["test_source"], data["test_target"], num_beams=num_beams,
                                       batch_size=args.batch_size, output_dir=evaluation_dir / name,
                                       test_name="test_2016_flickr", overwrite=True)  # a rerun redoes its seed
            results[name] = {"bleu": evaluated["bleu"], "chrf": evaluated["chrf"],
                             "hypotheses": read_lines(evaluated["files"]["hypotheses"])}
        record[decoding] = {
            "last": results["last"]["bleu"], "average": results["average"]["bleu"],
            "gain": results["average"]["bleu"] - results["last"]["bleu"],
            "p": paired_bleu_p(results["average"]["hypotheses"], results["last"]["hypotheses"], references)}
        print(f"seed {seed}, {decoding}: last checkpoint {record[decoding]['last']:.2f}, average of "
              f"{args.last} {record[decoding]['average']:.2f} (p = {record[decoding]['p']:.3f})")
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def section_text(records: list[dict], last: int) -> str:
    lines = ["| seed | trained on | averaged checkpoints | greedy: last | greedy: average | gain | p | beam 5: last | "
             "beam 5: average | gain | p |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for record in records:
        cells = [f"{record[d]['last']:.2f} | {record[d]['average']:.2f} | {record[d]['gain']:+.2f} | "
                 f"{record[d]['p']:.3f}" for d in DECODINGS]
        lines.append(f"| {record['seed']} | {record['trained_on']} | {', '.join(record['averaged'])} | "
                     f"{' | '.join(cells)} |")
    summary = "; ".join(
        f"{decoding}: last {mean_std([r[decoding]['last'] for r in records])}, average "
        f"{mean_std([r[decoding]['average'] for r in records])} (gain {statistics.mean(r[decoding]['gain'] for r in records):+.2f})"
        for decoding in DECODINGS)
    commands = "\n".join(f"{record['command']}   # {record['training_command']}" for record in records)
    return ("## Checkpoint averaging\n\n"
            f"Measured by `examples/benchmark_averaging.py`: the anchor-recipe softmax Transformer (`--preset "
            f"multi30k-anchor`, 2,090 steps), its last checkpoint against `hf-headattn-average --last {last}` of its "
            "checkpoints saved every 200 steps, on test_2016_flickr; p: sacrebleu's paired bootstrap (1,000 "
            f"resamples) of the two BLEU scores. Over {len(records)} seed(s): {summary}.\n\n" + "\n".join(lines)
            + f"\n\nCommands (and the training command of each seed):\n\n```\n{commands}\n```")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--last", type=int, default=5, help="checkpoints averaged")
    parser.add_argument("--batch-size", type=int, default=64)
    add_data_arguments(parser)
    parser.add_argument("--output-dir", default="runs/averaging/transformer-softmax", help="model folders")
    parser.add_argument("--records-dir", default="benchmarks/averaging")
    parser.add_argument("--results-file", default="RESULTS.md")
    parser.add_argument("--transformer-flags", default="", help="training flags added to the preset's (tests)")
    parser.add_argument("--checkpoint-flags", default="", help="flags after the checkpoint flags (tests)")
    parser.add_argument("--lstm-flags", default="", help=argparse.SUPPRESS)  # training_argv reads it
    args = parser.parse_args(argv)
    data = data_files(args)
    for seed in args.seeds:
        run_seed(seed, data, args)
    records = sorted((json.loads(path.read_text()) for path in Path(args.records_dir).glob("seed-*.json")),
                     key=lambda record: record["seed"])
    text = section_text(records, args.last)
    (Path(args.records_dir) / "section.md").write_text(text + "\n")
    replace_section(Path(args.results_file), SECTION, text)
    print(f"table: {Path(args.records_dir) / 'section.md'} and {args.results_file}")


if __name__ == "__main__":
    main()
