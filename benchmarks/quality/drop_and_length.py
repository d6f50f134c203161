#!/usr/bin/env python
"""Does DROP follow the output length? Every recorded run of a preset's systems, from its beam-5 hypotheses.

A diagnostic for RESULTS.md's notes, not a table row. For each run that examples/benchmark_quality.py recorded under
benchmarks/quality with the preset: the length of its beam-5 output against the reference (sacrebleu's 13a tokens, as
BLEU counts them), BLEU's brevity penalty, and the run's recorded DROP and REP; then, over all runs, the correlation of
DROP with the length ratio, the least-squares slope, and each system's mean DROP with and without the part the slope
puts down to its length (its residual over the fit, plus the mean DROP of all runs).

    python benchmarks/quality/drop_and_length.py --preset malaviya2018 \\
        --reference ../shared/data/multi30k/test_2016_flickr.en
"""

import argparse
import statistics
import sys
from pathlib import Path

import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the quality benchmark's records
from benchmark_quality import SYSTEMS, collect, hypotheses  # noqa: E402

DECODING = "beam5"


def runs(records: Path, preset: str, reference: list[str]) -> list[dict]:
    """The recorded runs (`benchmark_quality.collect`) of the systems trained with `preset`, measured."""
    found = []
    for (system, seed), result in collect(records).items():
        if SYSTEMS[system].preset != preset:
            continue
        outputs = hypotheses(result, DECODING)
        if len(outputs) != len(reference):
            raise ValueError(f"{result['record_dir'] / result['decoding'][DECODING]['hypotheses']}: {len(outputs)} "
                             f"lines, the reference has {len(reference)}")
        bleu = sacrebleu.corpus_bleu(outputs, [reference])
        recorded = result["decoding"][DECODING]
        found.append({"system": system, "seed": seed, "length": bleu.sys_len / bleu.ref_len,
                      "brevity_penalty": bleu.bp, "bleu": bleu.score, "drop": recorded["drop"],
                      "rep": recorded["rep"]})
    return found


def length_fit(found: list[dict]) -> dict:
    """Over the runs: Pearson's r of DROP with the length ratio, the least-squares line DROP = a + b length, and per
    system its runs, mean length, mean DROP and the DROP the line puts at the mean length of all runs (the system's
    mean residual over the line plus the mean DROP of all runs)."""
    lengths, drops = [run["length"] for run in found], [run["drop"] for run in found]
    fit, mean_drop = statistics.linear_regression(lengths, drops), statistics.mean(drops)
    systems = {}
    for system in dict.fromkeys(run["system"] for run in found):
        mine = [run for run in found if run["system"] == system]
        residual = statistics.mean(run["drop"] - (fit.intercept + fit.slope * run["length"]) for run in mine)
        systems[system] = {"runs": len(mine), "length": statistics.mean(run["length"] for run in mine),
                           "drop": statistics.mean(run["drop"] for run in mine),
                           "drop_at_mean_length": mean_drop + residual}
    return {"correlation": statistics.correlation(lengths, drops), "slope": fit.slope, "systems": systems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="malaviya2018", help="the runs of the systems trained with this preset")
    parser.add_argument("--reference", default="../shared/data/multi30k/test_2016_flickr.en")
    parser.add_argument("--records", default=str(Path(__file__).resolve().parent))
    args = parser.parse_args()
    reference = Path(args.reference).read_text(encoding="utf-8").splitlines()
    found = runs(Path(args.records), args.preset, reference)
    if len(found) < 3:
        raise SystemExit(f"{len(found)} runs of --preset {args.preset} in {args.records}: a fit needs 3 or more")
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
