#!/usr/bin/env python
"""Alignment error rate (AER) of the word alignments `hf-headattn-translate --alignments` reads from each variant's
attention, on Multi30k's test_2016_flickr.

Multi30k has no gold alignments (and no German-English gold set installs from the package registries), so the
reference is eflomal's: trained on the training pairs (its priors, as DROP trains it) and run `--reference-runs`
times on the test pairs (source, reference translation), each run symmetrised with grow-diag-final-and. eflomal
samples and cannot be seeded, so every AER is given as the mean +- standard deviation over the runs, and the row
"eflomal, another run" (each run against the others) shows how far the reference disagrees with itself.

Each model aligns the reference translations by forced decoding (`hf_headattn.translation.align`): the reference is
fed to the decoder, and each target word links to the source word of its highest attention weight (heads averaged,
or weighed by the model's own weights over heads), at every decoder layer of a Transformer. Words are split at
whitespace on both sides, as the reference's are. AER = 1 - 2 |A & S| / (|A| + |S|) summed over the corpus (one
set of links, so sure = possible); precision and recall are given beside it.

    python examples/benchmark_alignment.py --systems "transformer softmax" "lstm baseline 1x1" --seed 1

The models are those of examples/benchmark_quality.py (runs/quality/<system>/seed-<n>): a missing one is trained
first with the same command and flags. Each system's result goes to --records-dir/<system>-seed-<n>.json; the
table to --records-dir/section.md and, between its markers, to RESULTS.md.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's systems and helpers
from benchmark_quality import (SYSTEMS, add_data_arguments, data_files, replace_section, slug,  # noqa: E402
                               training_argv)
from hf_headattn.loading import load_model_and_tokenizer  # noqa: E402
from hf_headattn.metrics import drop_alignment_runs  # noqa: E402
from hf_headattn.training import train  # noqa: E402
from hf_headattn.translation import (align, cross_attention_layers, default_alignment_layer,  # noqa: E402
                                     read_lines)
from hf_headattn.translation.alignments import alignment_layer_index, guided_heads  # noqa: E402

DEFAULT_SYSTEMS = ["transformer softmax", "transformer sparsemax", "transformer csoftmax predicted",
                   "transformer csparsemax predicted", "transformer multihop", "lstm baseline 1x1",
                   "lstm sparsemax", "lstm csparsemax predicted", "lstm 2x2 dependent"]
SECTION = "alignment"


def links_of(pharaoh: str) -> set[tuple[int, int]]:
    return {tuple(int(x) for x in link.split("-")) for link in pharaoh.split()}


def alignment_scores(predicted: list[set], reference: list[set]) -> dict:
    """Corpus AER, precision and recall of `predicted` links against `reference` links (sure = possible)."""
    common = sum(len(a & s) for a, s in zip(predicted, reference))
    predicted_links, reference_links = sum(map(len, predicted)), sum(map(len, reference))
    return {"aer": 100 * (1 - 2 * common / max(predicted_links + reference_links, 1)),
            "precision": 100 * common / max(predicted_links, 1), "recall": 100 * common / max(reference_links, 1),
            "links": predicted_links}


def against_runs(predicted: list[set], runs: list[list[set]]) -> dict:
    """Mean and standard deviation of each score over the reference runs."""
    scores = [alignment_scores(predicted, reference) for reference in runs]
    summary = {}
    for key in ("aer", "precision", "recall"):
        values = [score[key] for score in scores]
        summary[key] = statistics.mean(values)
        summary[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    summary["links"] = scores[0]["links"]
    return summary


def reference_alignments(data: dict, sentences: int | None, runs: int) -> tuple[list[list[set]], dict]:
    sources, references = read_lines(data["test_source"]), read_lines(data["test_target"])
    if sentences:
        sources, references = sources[:sentences], references[:sentences]
    alignment_runs, how = drop_alignment_runs(
        sources, references, references, train_sources=read_lines(data["train_source"]),
        train_targets=read_lines(data["train_target"]), tokenize="whitespace", runs=runs)
    return [[set(map(tuple, sentence)) for sentence in run[0]] for run in alignment_runs], how


def model_dir_of(system: str, seed: int, data: dict, args) -> Path:
    """The system's model folder, trained first (as benchmark_quality trains it) when there is none."""
    model_dir = Path(args.output_dir) / slug(system) / f"seed-{seed}"
    if not (model_dir / "train_results.json").is_file():
        train(training_argv(system, seed, data, model_dir, args))
    return model_dir


def measure(system: str, seed: int, data: dict, runs: list[list[set]], args) -> dict:
    model_dir = model_dir_of(system, seed, data, args)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    sources, references = read_lines(data["test_source"]), read_lines(data["test_target"])
    if args.sentences:
        sources, references = sources[:args.sentences], references[:args.sentences]
    guided = guided_heads(model)  # guided alignment: "mean" at the guided layer is its guided heads, "all" the layer's
    rows = []
    for layer in range(cross_attention_layers(model)):
        for heads in ("mean", "all", "hop") if guided and guided[0] == layer else ("mean", "hop"):
            started = time.perf_counter()
            try:
                predicted = align(model, tokenizer, sources, references, alignment_layer=layer, alignment_heads=heads,
                                  batch_size=args.batch_size)
            except ValueError as error:
                if heads == "hop" and "no weights over heads" in str(error):
                    continue  # only models with weights over heads have this reduction
                raise
            rows.append({"layer": layer, "heads": heads,
                         "seconds": round(time.perf_counter() - started, 1),
                         **against_runs([links_of(links) for links in predicted], runs)})
    return {"system": system, "seed": seed, "model_dir": str(model_dir), "sentences": len(sources),
            "reference_runs": len(runs), "default_layer": alignment_layer_index(model, None),
            "guided_heads": guided[1] if guided else None, "rows": rows,
            "command": shlex.join(["python", "examples/benchmark_alignment.py", "--systems", system,
                                   "--seed", str(seed)])}


def diagonal(sources: list[str], references: list[str]) -> list[set]:
    """Each target word j linked to source word round(j * I / J): what position alone predicts."""
    result = []
    for source, reference in zip(sources, references):
        source_words, target_words = len(source.split()), len(reference.split())
        result.append({(min(round(j * source_words / max(target_words, 1)), source_words - 1), j)
                       for j in range(target_words)} if source_words else set())
    return result


def fmt(summary: dict) -> str:
    return f"{summary['aer']:.1f} ± {summary['aer_std']:.1f} | {summary['precision']:.1f} | {summary['recall']:.1f}"


def table(records: list[dict], baselines: dict) -> str:
    lines = ["| system | seed | layer | heads | AER (lower is better) | precision | recall | links per reference "
             "word |", "|---|---|---|---|---|---|---|---|"]
    words = baselines["reference_words"]
    for name, summary in baselines["rows"].items():
        lines.append(f"| {name} | | | | {fmt(summary)} | {summary['links'] / words:.2f} |")
    for record in records:
        layers = max(row["layer"] for row in record["rows"]) + 1
        default_layer = record.get("default_layer", default_alignment_layer(layers))
        guided = record.get("guided_heads")
        for row in record["rows"]:
            layer = "(one attention)" if layers == 1 else str(row["layer"])
            marker = " (default)" if row["layer"] == default_layer and row["heads"] == "mean" else ""
            heads = row["heads"]
            if guided is not None and row["layer"] == default_layer and heads == "mean":
                heads = f"guided ({', '.join(map(str, guided))})"
            lines.append(f"| {record['system']} | {record['seed']} | {layer}{marker} | {heads} | "
                         f"{fmt(row)} | {row['links'] / words:.2f} |")
    return "\n".join(lines)


def section_text(records: list[dict], baselines: dict) -> str:
    commands = "\n".join(sorted({record["command"] for record in records}))
    return (
        "## Word alignments from attention (AER)\n\n"
        f"Measured by `examples/benchmark_alignment.py` on test_2016_flickr ({baselines['sentences']:,} pairs): "
        "the alignments `hf-headattn-translate --alignments` gives, read from each model by forced decoding of the "
        "reference translation, against eflomal's symmetrised alignments of the same pairs (aligner trained on the "
        f"{baselines['aligner']['aligner_training_pairs']:,} training pairs; mean ± standard deviation over {baselines['runs']} eflomal runs, since eflomal "
        "cannot be seeded; no German-English gold alignment set installs from the registries). Words are split at "
        "whitespace. \"(default)\" marks what the command uses without `--alignment_layer`/`--alignment_heads`; "
        "\"hop\" weighs the heads by the model's weights over heads; a model trained with guided alignment is read at "
        "its guided layer, from its \"guided\" heads (\"all\": that layer's every head).\n\n"
        f"{table(records, baselines)}\n\nCommands:\n\n```\n{commands}\n```"
    )


def write_table(records_dir: Path, baselines: dict, results_file: Path) -> None:
    records = [json.loads(path.read_text()) for path in sorted(records_dir.glob("*-seed-*.json"))]
    order = {name: k for k, name in enumerate(SYSTEMS)}
    records.sort(key=lambda record: (order.get(record["system"], len(order)), record["seed"]))
    text = section_text(records, baselines)
    (records_dir / "section.md").write_text(text + "\n")
    replace_section(results_file, SECTION, text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=list(SYSTEMS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reference-runs", type=int, default=3, help="eflomal runs of the reference alignments")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N test pairs")
    parser.add_argument("--batch-size", type=int, default=64)
    add_data_arguments(parser)
    parser.add_argument("--output-dir", default="runs/quality", help="model folders (benchmark_quality's)")
    parser.add_argument("--records-dir", default="benchmarks/alignment")
    parser.add_argument("--results-file", default="RESULTS.md")
    parser.add_argument("--transformer-flags", default="", help="training flags added to every Transformer's")
    parser.add_argument("--lstm-flags", default="", help="training flags added to every LSTM's")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the table from the records")
    args = parser.parse_args(argv)
    records_dir = Path(args.records_dir)
    if args.report_only:
        write_table(records_dir, json.loads((records_dir / "baselines.json").read_text()), Path(args.results_file))
        return
    data = data_files(args)
    records_dir.mkdir(parents=True, exist_ok=True)

    runs, how = reference_alignments(data, args.sentences, args.reference_runs)
    sources, references = read_lines(data["test_source"]), read_lines(data["test_target"])
    if args.sentences:
        sources, references = sources[:args.sentences], references[:args.sentences]
    others = [against_runs(run, [other for other in runs if other is not run]) for run in runs] if len(runs) > 1 else []
    baselines = {"sentences": len(sources), "runs": len(runs), "aligner": how,
                 "reference_words": sum(len(reference.split()) for reference in references),
                 "rows": {"diagonal (position only)": against_runs(diagonal(sources, references), runs)}}
    if others:
        baselines["rows"]["eflomal, another run"] = {
            key: statistics.mean(other[key] for other in others) for key in others[0]}
    (records_dir / "baselines.json").write_text(json.dumps(baselines, indent=2) + "\n")
    for system in args.systems:  # the table is rewritten after each system, so a long list reports as it goes
        record = measure(system, args.seed, data, runs, args)
        (records_dir / f"{slug(system)}-seed-{args.seed}.json").write_text(json.dumps(record, indent=2) + "\n")
        best = min(record["rows"], key=lambda row: row["aer"])
        print(f"{system}: AER {best['aer']:.1f} at layer {best['layer']} ({best['heads']})")
        write_table(records_dir, baselines, Path(args.results_file))
    print(f"table: {records_dir / 'section.md'} and {args.results_file}")


if __name__ == "__main__":
    main()
