#!/usr/bin/env python
"""Data preparation at scale: from a training command's start to its first optimizer step, against the same
libraries used by hand, at 29k, 290k and 2.9M sentence pairs (Multi30k's training pairs repeated).

Two whole processes per size, in turn, five rounds of them below 1M pairs (--rounds; the table gives medians with
their ranges and the median of the rounds' time ratios) and one above, each timed from its start, with its peak
memory (the proportional set size, PSS, of the process and all its children summed, sampled every --interval
seconds):

* by hand: what a user of the libraries writes: `tokenizers`' BPE trainer on the two files (the tokenizer settings
  of `hf_headattn.tokenization.train_tokenizer`), `datasets.Dataset.from_generator` over the line pairs,
  `datasets.map` of the `PreTrainedTokenizerFast` over every core, and the pairs' token lengths as arrays (what a
  token-budget batch sampler needs); nothing checked, nothing warned about;
* the command: `hf-headattn-train` on the same files with a tiny model (d_model 64, one layer), --max_steps 1 and
  --logging_steps 1, timed to its first optimizer step (the moment its output shows the step's logged loss): its
  imports, data preparation (reading, checks, tokenizer training, tokenisation, lengths; started beside the imports,
  hf_headattn/training/data_prefetch.py), model and one step. Its time to exit (one validation pass and the save of
  a 0.6M-parameter model more) is shown beside it. The package's bytecode is written first, as `pip install` does.

The by-hand process ends when its data is ready, so its time to exit is its time; the target compares the command's
time to its first step with it.

Every process starts with empty caches (its own HF_DATASETS_CACHE and HF_HEADATTN_CACHE). Results: --output (JSON)
and a section of BENCHMARKS.md, one for each CPU vendor (benchmarks/data_prep-intel.json, benchmarks/data_prep-amd.json
and their sections), so that a run on one machine leaves the other's table as it is.

    python examples/benchmark_data_prep.py                      # 29k, 290k and 2.9M pairs: ~15 min on 2 cores
    python examples/benchmark_data_prep.py --pairs 29000        # one size
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's report sections

# One published table per CPU vendor: the target is to be met on each of the project's machines (issue 75), and a
# run on one must not replace the other's numbers.
CPU_VENDORS = ("intel", "amd")  # any other CPU: "other"
TARGET_TIME, TARGET_PEAK_MIB, PEAK_AT = 1.2, 1024, 2_900_000  # issue 43: <= 1.2x the baseline; < 1 GB at 2.9M


# ------------------------------------------------------------------------------------------------ by hand
def by_hand(source: str, target: str, workdir: str) -> None:
    """The baseline, in this process (run as a child: `--by-hand SOURCE TARGET WORKDIR`)."""
    import datasets
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    backend.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(),
        pre_tokenizers.Split(Regex(r"▁?[\p{L}\p{M}]+|▁?\p{N}+|▁?[^\p{L}\p{M}\p{N}▁]+|▁+"), behavior="isolated")])
    backend.decoder = decoders.Metaspace()
    backend.train([source, target], trainers.BpeTrainer(vocab_size=8000, min_frequency=2,
                                                        special_tokens=["<pad>", "</s>", "<unk>"]))
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>", model_max_length=128)

    def pairs(source_path, target_path):
        with open(source_path, encoding="utf-8") as sources, open(target_path, encoding="utf-8") as targets:
            for source_line, target_line in zip(sources, targets):
                yield {"source": source_line.rstrip("\n"), "target": target_line.rstrip("\n")}

    dataset = datasets.Dataset.from_generator(pairs, gen_kwargs={"source_path": source, "target_path": target},
                                              cache_dir=workdir)
    encoded = dataset.map(lambda batch: tokenizer(batch["source"], text_target=batch["target"], max_length=128,
                                                  truncation=True),
                          batched=True, num_proc=os.cpu_count(), remove_columns=["source", "target"])
    lengths = encoded.map(lambda batch: {"source_length": [len(ids) for ids in batch["input_ids"]],
                                         "target_length": [len(ids) for ids in batch["labels"]]},
                          batched=True, num_proc=os.cpu_count(), remove_columns=encoded.column_names)
    lengths = lengths.with_format("numpy")
    print(json.dumps({"pairs": len(encoded), "tokens": int(lengths["source_length"][:].sum()
                                                           + lengths["target_length"][:].sum())}))


# ------------------------------------------------------------------------------------------------ measuring
def peak_memory_mib(process: subprocess.Popen, interval: float) -> dict[str, float]:
    """Sample `process` and its children until it exits (Linux: /proc/PID/smaps_rollup): the largest sums of their
    PSS (`pss`: everything, memory-mapped files such as `datasets`' Arrow caches included) and of their anonymous
    PSS (`anonymous`: what the kernel cannot drop and read again from disk), in MiB."""
    import psutil

    peaks = {"pss": 0, "anonymous": 0}
    root = psutil.Process(process.pid)
    while process.poll() is None:
        sums = {"pss": 0, "anonymous": 0}
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for member in members:
            try:
                fields = dict(line.split(":", 1) for line in
                              Path(f"/proc/{member.pid}/smaps_rollup").read_text().splitlines()[1:])
            except (OSError, ValueError):
                continue  # exited meanwhile
            sums["pss"] += int(fields["Pss"].split()[0])
            sums["anonymous"] += int(fields["Pss_Anon"].split()[0])
        peaks = {key: max(peaks[key], sums[key]) for key in peaks}
        time.sleep(interval)
    return {key: value / 1024 for key, value in peaks.items()}


# the training command's progress bar writes each log as a line `loss 9.363 | grad_norm ...`
# (training.trainer.NumericProgressCallback): with --logging_steps 1, the first one follows the first optimizer step
FIRST_STEP_LOGGED = re.compile(rb"(?:^|[\r\n])loss [0-9.eE+-]+ \|")


def first_match_seconds(stream, output, started: float, pattern: re.Pattern | None) -> float | None:
    """Copy `stream` into `output` until it ends; the seconds since `started` at which `pattern` first appeared."""
    seen, tail = None, b""
    for chunk in iter(lambda: stream.read1(65536), b""):
        output.write(chunk)
        if seen is None and pattern is not None:
            tail = (tail + chunk)[-4096:]  # a line cut between two reads is matched whole
            if pattern.search(tail):
                seen = time.perf_counter() - started
    return seen


def measure(argv: list[str], env: dict, interval: float, log: Path, until: re.Pattern | None = None) -> dict:
    """Run `argv` to its end, its output into `log`: its seconds to exit, and to the first output matching `until`."""
    started = time.perf_counter()
    with log.open("wb") as output:
        process = subprocess.Popen(argv, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        peak = {}
        sampler = threading.Thread(target=lambda: peak.update(peak_memory_mib(process, interval)))
        sampler.start()
        matched = first_match_seconds(process.stdout, output, started, until)
        returncode = process.wait()
        seconds = time.perf_counter() - started
        sampler.join()
    if returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({returncode}); its output: {log}\n"
                           + log.read_text(errors="replace")[-3000:])
    if until is not None and matched is None:
        raise RuntimeError(f"{shlex.join(argv)} never wrote a line matching {until.pattern!r}; its output: {log}")
    return {"seconds": seconds if until is None else matched, "seconds_to_exit": seconds, "peak_mib": peak["pss"],
            "peak_anonymous_mib": peak["anonymous"], "command": shlex.join(argv)}


def corpus(data_dir: Path, pairs: int, workdir: Path) -> tuple[Path, Path]:
    """Multi30k's training pairs repeated (and cut) to `pairs` lines, as two files."""
    files = []
    for language in ("de", "en"):
        lines = (data_dir / f"train.{language}").read_text(encoding="utf-8").splitlines(keepends=True)
        path = workdir / f"train-{pairs}.{language}"
        with path.open("w", encoding="utf-8") as output:
            for start in range(0, pairs, len(lines)):
                output.writelines(lines[:min(len(lines), pairs - start)])
        files.append(path)
    return files[0], files[1]


def run_size(pairs: int, args, workdir: Path) -> dict:
    """Both processes on `pairs` pairs, in turn, `rounds_at(pairs, args.rounds)` times: each one's median seconds
    with the range, its largest peaks, and the median of the rounds' time ratios (each round's command over its
    by-hand process, so that the machine's drift between rounds cancels)."""
    source, target = corpus(Path(args.data_dir), pairs, workdir)
    rounds = []
    for round_number in range(rounds_at(pairs, args.rounds)):
        results = {}
        for name in args.order:
            cache = workdir / f"cache-{name}-{pairs}"
            shutil.rmtree(cache, ignore_errors=True)  # every process starts with empty caches
            shutil.rmtree(workdir / f"model-{pairs}", ignore_errors=True)
            env = {**os.environ, "HF_DATASETS_CACHE": str(cache / "datasets"),
                   "HF_HEADATTN_CACHE": str(cache / "ours"), "HF_HUB_OFFLINE": "1"}
            until = None
            if name == "by hand":
                argv = [sys.executable, os.path.abspath(__file__), "--by-hand", str(source), str(target), str(cache)]
            else:
                until = FIRST_STEP_LOGGED
                argv = ["hf-headattn-train", "--train_source", str(source), "--train_target", str(target),
                        "--valid_source", str(Path(args.data_dir) / "val.de"),
                        "--valid_target", str(Path(args.data_dir) / "val.en"), "--vocab_size", "8000",
                        "--d_model", "64", "--layers", "1", "--heads", "2", "--ffn_dim", "128", "--max_steps", "1",
                        "--logging_steps", "1", "--output_dir", str(workdir / f"model-{pairs}")]
            log = workdir / f"{name.replace(' ', '-')}-{pairs}-{round_number}.log"
            results[name] = measure(argv, env, args.interval, log, until)
            print(f"{pairs:,} pairs, {name}: {results[name]['seconds']:.1f} s (exit at "
                  f"{results[name]['seconds_to_exit']:.1f} s), peak {results[name]['peak_mib']:.0f} MiB "
                  f"({results[name]['peak_anonymous_mib']:.0f} MiB anonymous)", file=sys.stderr)
        rounds.append(results)
    summary = {name: summarise([results[name] for results in rounds]) for name in args.order}
    return {"pairs": pairs, **summary,
            "time_ratio": statistics.median(results["command"]["seconds"] / results["by hand"]["seconds"]
                                            for results in rounds),
            "memory_ratio": summary["command"]["peak_mib"] / summary["by hand"]["peak_mib"]}


# From this many pairs a size is measured once: a run takes minutes, and a second's noise does not move its ratio
ONE_ROUND_FROM_PAIRS = 1_000_000


def rounds_at(pairs: int, rounds: int) -> int:
    return 1 if pairs >= ONE_ROUND_FROM_PAIRS else rounds


def summarise(measures: list[dict]) -> dict:
    """One process's rounds: median seconds (to the first step, to exit) with the range, and the largest peaks."""
    seconds = [measure["seconds"] for measure in measures]
    return {"seconds": statistics.median(seconds), "seconds_min": min(seconds), "seconds_max": max(seconds),
            "seconds_to_exit": statistics.median(measure["seconds_to_exit"] for measure in measures),
            "peak_mib": max(measure["peak_mib"] for measure in measures),
            "peak_anonymous_mib": max(measure["peak_anonymous_mib"] for measure in measures),
            "command": measures[0]["command"], "rounds": measures}


def compile_package() -> None:
    """The package's bytecode written, as `pip install` writes a wheel's: a checkout run where
    PYTHONDONTWRITEBYTECODE is set (as in this project's sandboxes) would otherwise compile every module the command
    imports at each start, ~0.5 s of its time on 2 cores that no installed copy pays."""
    import compileall

    import hf_headattn

    compileall.compile_dir(os.path.dirname(hf_headattn.__file__), quiet=1)


# ------------------------------------------------------------------------------------------------ the report
def section_text(report: dict) -> str:
    machine = report["machine"]
    lines = [
        f"## Data preparation: start to the first optimizer step ({machine.get('cpu_model') or machine['processor']})",
        "",
        "Measured by `examples/benchmark_data_prep.py`: whole processes on Multi30k's training pairs repeated to each "
        "size, with empty caches; peak memory is the largest summed PSS of the process and its children, all of it "
        "and its anonymous part (without memory-mapped files such as `datasets`' Arrow caches); below 1M pairs, "
        "medians [ranges] of five rounds in turn, the largest peaks, and the time ratio as the median of the rounds' "
        "ratios. *By hand*: "
        "`tokenizers`' BPE trainer on the two files, `Dataset.from_generator`, `datasets.map` of the tokenizer over "
        "every core, the token lengths (timed to exit). *Command*: `hf-headattn-train --max_steps 1` with a tiny "
        "model, its data prepared in a process forked before its imports (`training/data_prefetch.py`), timed to its "
        "first optimizer step (its first logged loss), and to exit (one validation pass and the save more); the "
        "package's bytecode written first, as `pip install` writes it. "
        f"{machine.get('cpu_model') or machine['processor']}, "
        f"{machine['cpu_count']} CPUs, torch {machine['torch']}, Transformers {machine['transformers']}.",
        "",
        "| pairs | by hand s | by hand peak MiB (anonymous) | command s to first step | command s to exit | "
        "command peak MiB (anonymous) | time ratio | memory ratio | targets |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["sizes"]:
        hand, ours = row["by hand"], row["command"]
        checks = [f"time <= {TARGET_TIME}x: {'met' if row['time_ratio'] <= TARGET_TIME else 'not met'}"]
        if row["pairs"] >= PEAK_AT:
            checks.append(f"peak < 1 GB: {'met' if ours['peak_mib'] < TARGET_PEAK_MIB else 'not met'}")
        lines.append(f"| {row['pairs']:,} | {_seconds(hand)} | {hand['peak_mib']:.0f} "
                     f"({hand['peak_anonymous_mib']:.0f}) | {_seconds(ours)} | {ours['seconds_to_exit']:.1f} | "
                     f"{ours['peak_mib']:.0f} "
                     f"({ours['peak_anonymous_mib']:.0f}) | {row['time_ratio']:.2f} | {row['memory_ratio']:.2f} | "
                     f"{'; '.join(checks)} |")
    lines += ["", "Command:", "", "```", report["command"], "```"]
    return "\n".join(lines)


def _seconds(result: dict) -> str:
    """Median seconds, with the range where there were several rounds."""
    rounds = result.get("rounds", [])
    text = f"{result['seconds']:.1f}"
    return text + f" [{result['seconds_min']:.1f}-{result['seconds_max']:.1f}]" if len(rounds) > 1 else text


def cpu_vendor(cpu_model: str | None) -> str:
    """Which published table a machine's run belongs to, from its CPU's model name ("AMD EPYC", "Intel(R) Xeon(R)
    ..."); "other" for any other CPU."""
    return next((name for name in CPU_VENDORS if name in (cpu_model or "").lower()), "other")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--by-hand":
        return by_hand(*argv[1:4])
    from benchmark_quality import DEFAULT_DATA_DIR, add_publish_arguments, cpu_model, machine, publish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[29_000, 290_000, 2_900_000])
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="Multi30k (train.de/en, val.de/en)")
    parser.add_argument("--order", nargs=2, default=["by hand", "command"], choices=["by hand", "command"],
                        help="which process of each size runs first")
    parser.add_argument("--rounds", type=int, default=5,
                        help=f"rounds of both processes for each size below {ONE_ROUND_FROM_PAIRS:,} pairs (larger "
                             "sizes: one); the table gives medians and ranges")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between memory samples")
    parser.add_argument("--work-dir", help="corpora, caches and logs (default: a temporary folder)")
    add_publish_arguments(parser, "benchmarks/data_prep-VENDOR.json")
    args = parser.parse_args(argv)
    vendor = cpu_vendor(cpu_model())
    if sorted(args.order) != ["by hand", "command"]:
        parser.error("--order names 'by hand' and 'command', once each")
    compile_package()
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.work_dir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        report = {"machine": machine(), "command": shlex.join(["python", "examples/benchmark_data_prep.py", *argv]),
                  "sizes": [run_size(pairs, args, workdir) for pairs in args.pairs]}
    publish(report, f"data_prep-{vendor}", section_text(report), output=args.output, markdown=args.markdown,
            committed=f"benchmarks/data_prep-{vendor}.json", rows=lambda report: {size["pairs"] for size in report["sizes"]})


if __name__ == "__main__":
    main()
