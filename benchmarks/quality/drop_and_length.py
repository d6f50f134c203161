#!/usr/bin/env python
"""Does DROP follow the output length? Every recorded run of a preset's systems, from its beam-5 hypotheses.

A diagnostic for RESULTS.md's notes, not a table row. For each run under benchmarks/quality/PREFIX*/seed-*: the
length of its beam-5 output against the reference (sacrebleu's 13a tokens, as BLEU counts them), BLEU's brevity
penalty, and the run's recorded DROP and REP; then, over all runs, the correlation of DROP with the length ratio,
the least-squares slope, and each system's mean DROP with and without the part the slope puts down to its length
(its residual over the fit, plus the mean DROP of all runs).

    python benchmarks/quality/drop_and_length.py --prefix lstm-malaviya2018- \\
        --reference ../shared/data/multi30k/test_2016_flickr.en
"""

import argparse
import json
import statistics
from pathlib import Path

import sacrebleu

HYPOTHESES, METRICS = "test_2016_flickr.beam5.hyp.en", "test_2016_flickr.beam5.metrics.json"


def runs(records: Path, prefix: str, reference: list[str]) -> list[dict]:
    found = []
    for folder in sorted(records.glob(f"{prefix}*/seed-*")):
        if not (folder / HYPOTHESES).exists():
            continue
        hypotheses = (folder / HYPOTHESES).read_text(encoding="utf-8").splitlines()
        if len(hypotheses) != len(reference):
            raise ValueError(f"{folder / HYPOTHESES}: {len(hypotheses)} lines, the reference has {len(reference)}")
        bleu = sacrebleu.corpus_bleu(hypotheses, [reference])
        metrics = json.loads((folder / METRICS).read_text(encoding="utf-8"))
        found.append({"system": folder.parent.name.removeprefix(prefix), "seed": folder.name.removeprefix("seed-"),
                      "length": bleu.sys_len / bleu.ref_len, "brevity_penalty": bleu.bp, "bleu": bleu.score,
                      "drop": metrics["drop"], "rep": metrics["rep"]})
    return found


def length_fit(found: list[dict]) -> dict:
    """Over the runs: Pearson's r of DROP with the length ratio, the least-squares line DROP = a + b length, and per
    system its runs, mean length, mean DROP and the DROP the line puts at the mean length of all runs (the system's
    mean residual over the line plus the mean DROP of all runs)."""
    lengths, drops = [run["length"] for run in found], [run["drop"] for run in found]
    fit = statistics.linear_regression(lengths, drops)
    systems = {}
    for system in dict.fromkeys(run["system"] for run in found):
        mine = [run for run in found if run["system"] == system]
        residual = statistics.mean(run["drop"] - (fit.intercept + fit.slope * run["length"]) for run in mine)
        systems[system] = {"runs": len(mine), "length": statistics.mean(run["length"] for run in mine),
                           "drop": statistics.mean(run["drop"] for run in mine),
                           "drop_at_mean_length": statistics.mean(drops) + residual}
    return {"correlation": statistics.correlation(lengths, drops), "slope": fit.slope, "systems": systems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", default="lstm-malaviya2018-", help="record folders benchmarks/quality/PREFIX*")
    parser.add_argument("--reference", default="../shared/data/multi30k/test_2016_flickr.en")
    parser.add_argument("--records", default=str(Path(__file__).resolve().parent))
    args = parser.parse_args()
    reference = Path(args.reference).read_text(encoding="utf-8").splitlines()
    found = runs(Path(args.records), args.prefix, reference)
    if len(found) < 3:
        raise SystemExit(f"{len(found)} runs under {args.records}/{args.prefix}*: a fit needs 3 or more")
    fit = length_fit(found)
    print("| system | seed | length / reference | brevity penalty | BLEU | REP | DROP |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for run in found:
        print(f"| {run['system']} | {run['seed']} | {run['length']:.3f} | {run['brevity_penalty']:.3f} | "
              f"{run['bleu']:.2f} | {run['rep']:.2f} | {run['drop']:.2f} |")
    print(f"\n{len(found)} runs: Pearson r(length, DROP) = {fit['correlation']:.2f}; "
          f"DROP {fit['slope'] / 100:+.2f} per 1% more length\n")
    print("| system | runs | mean length | mean DROP | DROP at the mean length (fit residual + mean) |")
    print("|---|---:|---:|---:|---:|")
    for system, row in fit["systems"].items():
        print(f"| {system} | {row['runs']} | {row['length']:.3f} | {row['drop']:.2f} | "
              f"{row['drop_at_mean_length']:.2f} |")


if __name__ == "__main__":
    main()
