#!/usr/bin/env python
"""What n-best lists and alignments cost on top of a plain beam search, in one process, on the same lines:
`hf_headattn.translation.translate` with --num_beams beams, plain (the best hypothesis' text), with n-best lists
(--nbest hypotheses each, with scores), with alignments, and with both.

Rounds are interleaved (every setting once per round, each round starting one setting later); the table shows the
median [min-max] seconds over --rounds rounds and each setting's time over the plain run's (the issue's target: at
most 1.2x). The model is loaded once, outside the timings; torch gets --threads intra-op threads.

    hf-headattn-demo --output_dir runs/demo
    python examples/benchmark_translation_outputs.py --model runs/demo/model --toy 1000 --lines 2000 --rounds 5 \
        --output benchmarks/translation_outputs.json --markdown BENCHMARKS.md
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's report sections

TARGET = 1.2  # issue 45: n-best lists and alignments at most 1.2x a plain run of the same beam
SECTION = "translation_outputs"  # of BENCHMARKS.md


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a saved model folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="source lines")
    source.add_argument("--toy", type=int, metavar="N", help="N German sentences of the demo's toy corpus (seed 7)")
    parser.add_argument("--lines", type=int, default=1000, help="the first N lines (repeated if the file is shorter)")
    parser.add_argument("--num_beams", type=int, default=5)
    parser.add_argument("--nbest", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", help="write the measurements as JSON here")
    parser.add_argument("--markdown", help="put the table into this report (BENCHMARKS.md) as its own section")
    args = parser.parse_args(argv)

    import torch

    from hf_headattn.loading import load_model_and_tokenizer
    from hf_headattn.parallel_data import read_lines
    from hf_headattn.translation import translate

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model)
    if args.toy:
        from hf_headattn.toy_corpus import make_toy_corpus

        lines = [source for source, _ in make_toy_corpus(args.toy, seed=7)]
    else:
        lines = list(read_lines(args.input))
    lines = (lines * (args.lines // max(len(lines), 1) + 1))[:args.lines]
    settings = {
        "plain": {},
        f"n-best {args.nbest}": {"nbest": args.nbest},
        "alignments": {"alignments": True},
        f"n-best {args.nbest} + alignments": {"nbest": args.nbest, "alignments": True},
    }
    seconds = {name: [] for name in settings}
    names = list(settings)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            started = time.perf_counter()
            translate(model, tokenizer, lines, num_beams=args.num_beams, batch_size=args.batch_size, progress=False,
                      **settings[name])
            seconds[name].append(time.perf_counter() - started)
    plain = statistics.median(seconds["plain"])
    rows = {name: {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                   "ratio_to_plain": statistics.median(times) / plain} for name, times in seconds.items()}
    report = {"model": args.model, "lines": len(lines), "num_beams": args.num_beams, "threads": args.threads,
              "rounds": args.rounds, "cpu": cpu_name(), "target_ratio": TARGET, "settings": rows}
    table = markdown_table(report)
    print(table)
    if args.markdown:
        from pathlib import Path

        from benchmark_quality import replace_section

        command = "python examples/benchmark_translation_outputs.py " + " ".join(argv if argv is not None else sys.argv[1:])
        replace_section(Path(args.markdown), SECTION, "## n-best lists and alignments\n\n" + table + (
            f"\n\n`{command}`: `hf_headattn.translation.translate` in one process, the model loaded once; the "
            f"issue's target is at most {TARGET}x the plain run's time for n-best lists and for alignments.\n"))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
    return report


def markdown_table(report: dict) -> str:
    lines = [f"{report['lines']:,} lines, beam {report['num_beams']}, {report['threads']} threads, {report['rounds']} "
             f"rounds, {report['cpu']}", "", "| setting | seconds, median [min-max] | x plain |", "|---|---|---|"]
    for name, row in report["settings"].items():
        lines.append(f"| {name} | {row['median_s']:.2f} [{row['min_s']:.2f}-{row['max_s']:.2f}] | "
                     f"{row['ratio_to_plain']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
