#!/usr/bin/env python
"""Decoding speed as a deployment sees it: whole processes translating a file, side by side, on the same weights.

Each system is one process that loads a model and translates the first --sentences lines of test_2016_flickr.de into
a file; its wall time, from start to exit (imports and loading included), is what is compared:

* anchor: a plain-Transformers user with `MarianMTModel.generate`, batches of 32 in file order, on the model's
  `to_marian()` copy (no hf_headattn imported);
* `hf-headattn-translate --decoding generate`: this package through Transformers' `generate`, on the
  `HeadAttnForConditionalGeneration.from_marian` model of the anchor's weights, saved by this checkout;
* `hf-headattn-translate`: the fast path (hf_headattn/decoding.py; the command's default batches of 128 sentences,
  4,096 source tokens), float32, with `--quantize int8`, and with `--dtype bfloat16` (fast only on CPUs with native
  bfloat16 arithmetic, e.g. AVX512-BF16; it warns elsewhere);
* at beam search on real lengths, the fast path (float32 and int8) with `--early_stopping true`, CTranslate2's rule
  for ending a sentence's search, so that both decode the same steps;
* CTranslate2 float32 and int8 on the same weights (`hf-headattn-export --format ctranslate2`), used by hand:
  the export's tokenizer through `tokenizers` and `ctranslate2.Translator.translate_batch` (batches of 32, as it sorts
  them), no Transformers imported;
* every other variant trained by examples/benchmark_quality.py (the fast path, float32 and int8), beside softmax,
  with its time over its family's softmax model's on the same path (the Transformer's: "ours"; the LSTM's:
  "lstm baseline 1x1"), which issue 43 wants within 1.2x for every variant.

Rounds are interleaved (every system once per round, each round starting one system later); tables show the median
[min-max] of --rounds rounds, sentences per second, the speed-up over the anchor (anchor time / system time), the
share of lines translated exactly as the anchor translates them, and BLEU against the reference (sacrebleu). All
processes get the same cores (--threads): torch's intra-op threads; CTranslate2, on the CPU, as many translators of one
thread each (`inter_threads`, its setup for throughput: batches decoded in parallel), which on a 2-core Intel Xeon
(AMX) VM decoded the file 2.3x (float32, beam 5) to 9.5x (int8, greedy) faster than one translator of 2 threads
(BENCHMARKS.md, the real-length table's note).

Start-up: in every round each system's process also translates the file's first line alone (greedy); the median of
those runs is its start-up (imports, loading, exit), and its time less its start-up is its decoding time, which the
tables compare with CTranslate2's of the same precision (issue 43: the fast path's decoding at most CTranslate2's,
float32 and int8).

Workloads: real lengths (each translation ends where the model ends it) and, with --full-length N, full batches:
every translation held to N tokens (min = max new tokens; CTranslate2's min/max_decoding_length), so that no sentence
leaves its batch early and every step costs the whole batch. Each workload is a section of its own in BENCHMARKS.md.

    python examples/benchmark_decoding.py                  # ~1 h on 2 cores; trains missing models first
    python examples/benchmark_decoding.py --quick          # a smoke run: 40 sentences, 1 round, no variants
    python examples/benchmark_decoding.py --device cuda    # the GPU table: float32, float16 and bfloat16
    python examples/benchmark_decoding.py --full-length 30 --variants  # full batches of 30 tokens, no variants

On a GPU (--device cuda) every process runs there: the anchor in float32, ours in float32, float16 and bfloat16
(int8 is the CPU's), and CTranslate2 (float32, float16, int8_float16) where its CUDA build is installed; the report
says why CTranslate2 did not run otherwise. The GPU table is a section of its own in BENCHMARKS.md, and its JSON
defaults to benchmarks/decoding-gpu.json.

The models are those of examples/benchmark_quality.py (runs/quality/<system>/seed-<n>); a missing one is trained first
with the same command and flags. Results: --output (JSON) and a section of BENCHMARKS.md between its markers.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's systems and helpers

SECTIONS = {"cpu": "decoding", "cuda": "decoding-gpu"}  # BENCHMARKS.md sections, by --device (real lengths)
FULL_LENGTH_SECTION = "decoding-full"  # the full-batch workload's (--full-length), CPU or GPU
ANCHOR_BATCH = 32
TARGETS = {  # issue 35: speed-up over the anchor at beam 5, and agreement with it
    ("ours, fast", 5): 1.5, ("ours, fast int8", 5): 2.5}
GPU_TARGETS = {("ours, fast", 5): 2.0}  # issue 43: on a GPU, speed-up over "ours, generate" at beam 5
# issue 43: the fast path's decoding time (time less start-up) at most CTranslate2's of the same precision
EARLY_STOPPING = ", early stopping"  # the rows that end beam search by CTranslate2's rule (--early_stopping true)
CTRANSLATE2_TARGETS = {"ours, fast": "CTranslate2 float32", "ours, fast int8": "CTranslate2 int8",
                       f"ours, fast{EARLY_STOPPING}": "CTranslate2 float32",
                       f"ours, fast int8{EARLY_STOPPING}": "CTranslate2 int8"}
ANCHOR, GENERATE = "anchor: MarianMTModel.generate", "ours, generate"
STARTUP = "start-up"  # the plan's key of the start-up runs (the first line alone)
DEFAULT_VARIANTS = ["transformer sparsemax", "transformer csoftmax predicted", "transformer csparsemax predicted",
                    "transformer mma", "transformer dhicm", "transformer multihop", "lstm baseline 1x1",
                    "lstm sparsemax", "lstm csparsemax predicted", "lstm 2x2 dependent"]
# issue 43: every variant within 1.2x of its family's softmax model's time on the fast path
VARIANT_TARGET = 1.2


# ------------------------------------------------------------------------------------------------ the processes
def anchor_process(model_dir: str, input_file: str, output_file: str, num_beams: int, threads: int,
                   device: str, full_length: int = 0) -> None:
    """What a plain-Transformers user writes: MarianMTModel.generate in batches of 32, in file order (with
    `full_length`, every translation held to that many tokens)."""
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    torch.set_num_threads(threads)
    model = MarianMTModel.from_pretrained(model_dir).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = Path(input_file).read_text(encoding="utf-8").splitlines()
    translations = []
    with torch.inference_mode():
        for start in range(0, len(lines), ANCHOR_BATCH):
            batch = tokenizer(lines[start:start + ANCHOR_BATCH], return_tensors="pt", padding=True, truncation=True,
                              return_token_type_ids=False).to(device)
            generated = model.generate(**batch, num_beams=num_beams, **held_to(full_length))
            translations += tokenizer.batch_decode(generated, skip_special_tokens=True)
    Path(output_file).write_text("".join(text.strip() + "\n" for text in translations), encoding="utf-8")


def ctranslate2_process(model_dir: str, input_file: str, output_file: str, num_beams: int, threads: int,
                        max_decoding_length: int, device: str, compute_type: str, full_length: int = 0) -> None:
    """What a CTranslate2 user writes (no hf_headattn, no Transformers imported): the export's tokenizer through
    `tokenizers`, `Translator.translate_batch` over the whole file in batches of 32 (CTranslate2 sorts them by
    length), the best hypothesis decoded; on the CPU `threads` translators of one thread each take the batches in
    parallel. Its lines are those `hf-headattn-translate` gives with the export."""
    import ctranslate2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer" / "tokenizer.json"))
    cores = {"inter_threads": threads, "intra_threads": 1} if device == "cpu" else {"intra_threads": threads}
    translator = ctranslate2.Translator(model_dir, device=device, compute_type=compute_type, **cores)
    lines = Path(input_file).read_text(encoding="utf-8").splitlines()
    lengths = {"max_decoding_length": full_length, "min_decoding_length": full_length} if full_length else {
        "max_decoding_length": max_decoding_length}
    results = translator.translate_batch([encoding.tokens for encoding in tokenizer.encode_batch(lines)],
                                         beam_size=num_beams, max_batch_size=ANCHOR_BATCH, **lengths)
    translations = [tokenizer.decode([tokenizer.token_to_id(token) for token in result.hypotheses[0]]).strip()
                    if line.strip() else "" for line, result in zip(lines, results)]
    Path(output_file).write_text("".join(text + "\n" for text in translations), encoding="utf-8")


def held_to(full_length: int) -> dict:
    """generate's arguments that hold every translation to `full_length` tokens (none for 0: real lengths)."""
    return {"min_new_tokens": full_length, "max_new_tokens": full_length} if full_length else {}


def timed(argv: list[str], env: dict) -> float:
    started = time.perf_counter()
    completed = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return seconds


# ------------------------------------------------------------------------------------------------ preparation
def ctranslate2_unavailable(device: str) -> str | None:
    """Why CTranslate2 cannot run on `device` here (None: it can)."""
    try:
        import ctranslate2
    except ImportError as error:
        return f"ctranslate2 is not installed ({error})"
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return (f"this ctranslate2 {ctranslate2.__version__} sees no CUDA device (a CPU-only build, or no CUDA "
                "libraries)")
    return None


def prepare_models(args, data: dict) -> dict:
    """Model folders: the softmax zoo model, its MarianMTModel copy, its CTranslate2 exports, and the variants'."""
    from benchmark_quality import slug, training_argv

    from hf_headattn import HeadAttnForConditionalGeneration
    from hf_headattn.export import export_ctranslate2
    from hf_headattn.loading import load_model_and_tokenizer
    from hf_headattn.training import train

    def zoo_model(system: str) -> Path:
        model_dir = Path(args.output_dir) / slug(system) / f"seed-{args.seed}"
        if not (model_dir / "train_results.json").is_file():
            train(training_argv(system, args.seed, data, model_dir, args))
        return model_dir

    work = Path(args.work_dir)
    softmax = zoo_model("transformer softmax")
    model, tokenizer = load_model_and_tokenizer(softmax)
    folders = {"marian": work / "marian", "softmax": work / "ours"}
    marian = model.to_marian()
    # ours: the issue's `from_marian` model of the anchor's weights, saved by this checkout (its code, not the code
    # the zoo model was saved with)
    ours = HeadAttnForConditionalGeneration.from_marian(marian)
    for name, saved in (("marian", marian), ("softmax", ours)):
        saved.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    folders["ctranslate2"] = ctranslate2_unavailable(args.device) or "ran"  # the report says why it did not
    if folders["ctranslate2"] == "ran":
        for quantization in ("float32", "int8"):
            folders[f"ct2 {quantization}"] = work / f"ct2-{quantization}"
            export_ctranslate2(model, tokenizer, folders[f"ct2 {quantization}"], quantization=quantization,
                               overwrite=True, source=str(softmax))
    folders["max_length"] = model.generation_config.max_length or 256
    folders["variants"] = {system: zoo_model(system) for system in args.variants}
    return folders


def commands(folders: dict, input_file: Path, outputs: Path, num_beams: int, threads: int,
             device: str = "cpu", full_length: int = 0) -> dict[str, tuple[list[str], Path]]:
    """System name -> (the command that translates `input_file`, the file it writes), on `device` (cpu or cuda),
    every translation held to `full_length` tokens (0: real lengths)."""
    python, this = sys.executable, os.path.abspath(__file__)
    systems = {}

    def add(name: str, argv: list[str], output_flag: bool = True) -> None:
        output = outputs / f"{name.replace(' ', '_').replace(',', '').replace(':', '')}.beam{num_beams}.txt"
        systems[name] = ([*argv, "--output", str(output)] if output_flag else [*argv[:5], str(output), *argv[5:]],
                         output)

    def ours(model_dir: Path, *flags: str) -> list[str]:
        held = [f"--{name}={value}" for name, value in held_to(full_length).items()]
        return [python, "-m", "hf_headattn.commands.translate", "--model", str(model_dir), "--input",
                str(input_file), "--num_beams", str(num_beams), "--quiet", "--device", device, *held, *flags]

    # the reduced-precision paths: int8 on the CPU; float16 and bfloat16 on a GPU (bfloat16 on the CPU too, where
    # the table shows whether this CPU has native bfloat16 arithmetic)
    reduced = {"int8": ["--quantize", "int8"], "bfloat16": ["--dtype", "bfloat16"]} if device == "cpu" else \
        {"float16": ["--dtype", "float16"], "bfloat16": ["--dtype", "bfloat16"]}
    # CTranslate2's compute types on each export: (export, compute type) per row
    ctranslate2_rows = {"cpu": {"float32": ("float32", "default"), "int8": ("int8", "default")},
                        "cuda": {"float32": ("float32", "float32"), "float16": ("float32", "float16"),
                                 "int8_float16": ("int8", "int8_float16")}}[device]
    add("anchor: MarianMTModel.generate", [python, this, "--anchor-process", str(folders["marian"]), str(input_file),
                                           str(num_beams), str(threads), device, str(full_length)],
        output_flag=False)
    add("ours, generate", ours(folders["softmax"], "--decoding", "generate"))
    add("ours, fast", ours(folders["softmax"]))
    for name, flags in reduced.items():
        add(f"ours, fast {name}", ours(folders["softmax"], *flags))
    if num_beams > 1 and not full_length:
        # CTranslate2 ends a sentence's beam search once it has num_beams finished hypotheses, where generate's
        # default searches on: these rows take its rule, so that they and CTranslate2 decode the same steps
        add(f"ours, fast{EARLY_STOPPING}", ours(folders["softmax"], "--early_stopping", "true"))
        if "int8" in reduced:
            add(f"ours, fast int8{EARLY_STOPPING}", ours(folders["softmax"], "--early_stopping", "true",
                                                         *reduced["int8"]))
    if "ct2 float32" in folders:
        for name, (export, compute_type) in ctranslate2_rows.items():
            add(f"CTranslate2 {name}", [python, this, "--ctranslate2-process", str(folders[f"ct2 {export}"]),
                                        str(input_file), str(num_beams), str(threads), str(folders["max_length"] - 1),
                                        device, compute_type, str(full_length)], output_flag=False)
    variant_reduced = next(iter(reduced))  # each variant's reduced-precision row: int8 on the CPU, float16 on a GPU
    for system, model_dir in folders["variants"].items():
        add(f"{system}, fast", ours(model_dir))
        add(f"{system}, fast {variant_reduced}", ours(model_dir, *reduced[variant_reduced]))
    return systems


# ------------------------------------------------------------------------------------------------ the run
def measured_rows(report: dict) -> set[tuple[str, str]]:
    """The (beams, system) rows of a report."""
    return {(beams, row["system"]) for beams, rows in report["rows"].items() for row in rows}


def run(args) -> dict:
    import sacrebleu
    import torch

    from benchmark_quality import data_files, machine

    data = data_files(args)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    test_sources = Path(data["test_source"]).read_text(encoding="utf-8").splitlines()
    sources = repeated(test_sources, args.sentences)
    references = repeated(Path(data["test_target"]).read_text(encoding="utf-8").splitlines(), args.sentences)
    input_file = work / "input.de"
    input_file.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    folders = prepare_models(args, data)
    outputs = work / "outputs"
    outputs.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [
               os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH")]))}
    plan = {beams: chosen(commands(folders, input_file, outputs, beams, args.threads, args.device, args.full_length),
                          args.systems)
            for beams in args.beams}
    # start-up: each system's process on the first line alone, greedy, at real length
    first_line = work / "first-line.de"
    first_line.write_text(sources[0] + "\n", encoding="utf-8")
    (work / "start-up").mkdir(exist_ok=True)
    plan[STARTUP] = chosen(commands(folders, first_line, work / "start-up", 1, args.threads, args.device),
                           args.systems)
    seconds = {beams: {name: [] for name in systems} for beams, systems in plan.items()}
    failures = {}  # "system, beam N" -> the end of its error: it leaves the later rounds, the others go on
    started = time.perf_counter()
    for round_index in range(args.rounds):
        for beams, systems in plan.items():
            label = "start-up (first line)" if beams == STARTUP else f"beam {beams}"
            names = [name for name in systems if f"{name}, {label}" not in failures]
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                try:
                    seconds[beams][name].append(timed(systems[name][0], env))
                except RuntimeError as error:
                    failures[f"{name}, {label}"] = str(error).strip().splitlines()[-1][:300]
                    print(f"round {round_index + 1}/{args.rounds}, {label}: {name} failed:\n{error}",
                          file=sys.stderr)
                    continue
                print(f"round {round_index + 1}/{args.rounds}, {label}: {name} "
                      f"{seconds[beams][name][-1]:.1f} s", file=sys.stderr)
    startup = {name: statistics.median(times) for name, times in seconds.pop(STARTUP).items() if times}
    del plan[STARTUP]
    for name in {name for systems in plan.values() for name in systems if name.endswith(EARLY_STOPPING)}:
        # the start-up runs are greedy, which has no beam search to end: the same process as the row without it
        if name.removesuffix(EARLY_STOPPING) in startup:
            startup[name] = startup[name.removesuffix(EARLY_STOPPING)]
    rows, references_used = {}, {}
    for beams, systems in plan.items():
        ran = {name: value for name, value in systems.items() if seconds[beams][name]}
        reference = next((name for name in (ANCHOR, GENERATE) if name in ran), None)
        if reference is None:
            raise SystemExit(f"beam {beams}: neither {ANCHOR!r} nor {GENERATE!r} ran, nothing to compare with")
        references_used[str(beams)] = reference
        anchor_lines = ran[reference][1].read_text(encoding="utf-8").splitlines()
        anchor_median = statistics.median(seconds[beams][reference])
        rows[beams] = []
        for name, (argv, output) in ran.items():
            hypotheses = output.read_text(encoding="utf-8").splitlines()
            counterpart = ctranslate2_counterpart(name)
            counterpart_lines = (ran[counterpart][1].read_text(encoding="utf-8").splitlines()
                                 if counterpart in ran and counterpart != name else None)
            median = statistics.median(seconds[beams][name])
            rows[beams].append({
                "system": name, "seconds": seconds[beams][name], "median": median,
                "sentences_per_second": len(sources) / median, "speedup": anchor_median / median,
                "same_as_anchor": sum(a == b for a, b in zip(hypotheses, anchor_lines)) / len(sources),
                "same_as_ctranslate2": None if counterpart_lines is None else
                sum(a == b for a, b in zip(hypotheses, counterpart_lines)) / len(sources),
                "bleu": sacrebleu.corpus_bleu(hypotheses, [references], force=True).score,
                "startup": startup.get(name),
                "decoding": median - startup[name] if name in startup else None,
                "command": shlex.join(argv)})
    return {"machine": {**machine(), "threads": args.threads}, "device": args.device,
            "ctranslate2": folders["ctranslate2"], "sentences": len(sources), "test_lines": len(test_sources),
            "reference": references_used, "failures": failures,
            "rounds": args.rounds,
            "seed": args.seed, "model": str(folders["softmax"]), "variants": list(folders["variants"]),
            "minutes": (time.perf_counter() - started) / 60,
            "full_length": args.full_length,
            "command": shlex.join(["python", "examples/benchmark_decoding.py", *sys.argv[1:]]),
            "torch": torch.__version__, "rows": {str(beams): table for beams, table in rows.items()}}


def repeated(lines: list[str], count: int) -> list[str]:
    """The first `count` lines, the file read again from its start as often as `count` needs."""
    return [lines[index % len(lines)] for index in range(count)]


def chosen(systems: dict, names: list[str] | None) -> dict:
    """The systems `names` asks for (all when None), in the plan's order; an unknown name is refused with the known."""
    if names is None:
        return systems
    unknown = [name for name in names if name not in systems]
    if unknown:
        raise SystemExit(f"--systems: unknown {', '.join(map(repr, unknown))}; known here: "
                         f"{', '.join(map(repr, systems))}")
    return {name: value for name, value in systems.items() if name in names}


# ------------------------------------------------------------------------------------------------ the report
def relative_to_softmax(name: str, medians: dict) -> str:
    """A variant row's time over its family's softmax row on the same path ('ours, fast' is the Transformer's,
    'lstm baseline 1x1, fast' the LSTM's), with issue 43's 1.2x mark."""
    from benchmark_quality import SYSTEMS

    system, _, path = name.partition(", ")
    if system not in SYSTEMS or system == "lstm baseline 1x1":
        return ""
    softmax = "ours" if SYSTEMS[system].architecture == "transformer" else "lstm baseline 1x1"
    if f"{softmax}, {path}" not in medians:
        return ""
    ratio = medians[name] / medians[f"{softmax}, {path}"]
    return f"{ratio:.2f}x (target <= {VARIANT_TARGET}x: {'met' if ratio <= VARIANT_TARGET else 'not met'})"


def ctranslate2_counterpart(name: str) -> str | None:
    """The CTranslate2 row of a row's precision: int8 for the int8 rows, float32 for the others, none for the
    half-precision rows and CTranslate2's own."""
    if name.startswith("CTranslate2") or "float16" in name:  # bfloat16 too
        return None
    return "CTranslate2 int8" if "int8" in name else "CTranslate2 float32"


def relative_to_ctranslate2(name: str, decodings: dict) -> str:
    """A row's decoding time (its time less its start-up) over CTranslate2's of the same precision
    (:func:`ctranslate2_counterpart`), with issue 43's mark (at most 1.0x) on the fast path's rows."""
    counterpart = ctranslate2_counterpart(name)
    if counterpart is None or decodings.get(name) is None or decodings.get(counterpart) is None or min(decodings[name],
                                                                               decodings[counterpart]) <= 0:
        return ""  # no start-up measured, or a run too short to tell decoding from start-up
    ratio = decodings[name] / decodings[counterpart]
    if CTRANSLATE2_TARGETS.get(name) != counterpart:
        return f"{ratio:.2f}x"
    return f"{ratio:.2f}x (target <= 1.0x: {'met' if ratio <= 1.0 else 'not met'})"


def section_text(report: dict) -> str:
    machine = report["machine"]
    on_gpu = report.get("device", "cpu") == "cuda"
    where = f"GPU: {machine['cuda']}" if on_gpu else "CPU"
    test_lines = report.get("test_lines", report["sentences"])
    what = (f"the first {report['sentences']:,} lines of test_2016_flickr.de" if report["sentences"] <= test_lines else
            f"test_2016_flickr.de's {test_lines:,} lines repeated to {report['sentences']:,} lines")
    reference = set(report.get("reference", {}).values()) or {ANCHOR}
    compared = "the anchor" if reference == {ANCHOR} else " / ".join(sorted(reference))
    full_length = report.get("full_length", 0)
    workload = f"every sentence held to {full_length} tokens" if full_length else "translating a file"
    lines = [
        f"## Decoding speed: {workload} ({where})",
        "",
        f"Measured by `examples/benchmark_decoding.py`: whole processes (start to exit, loading included) translating "
        f"{what} with the anchor-recipe softmax model (seed "
        f"{report['seed']}) and the same weights as `MarianMTModel` and CTranslate2"
        + ("; each variant's zoo model beside them" if report.get("variants", True) else
           " (no variants: examples/benchmark_fast_path.py times their fast paths)")
        + f"; median [min-max] of {report['rounds']} interleaved rounds; {machine['threads']} CPU threads; "
        + (f"{machine['cuda']}, " if on_gpu else "")
        + f"{machine.get('cpu_model') or machine['processor']}, {machine['cpu_count']} CPUs, torch {machine['torch']}, "
        f"Transformers {machine['transformers']}. Speed-up = {compared} time / system time; \"same\" = lines "
        f"translated exactly as {compared} translates them; BLEU against the reference (sacrebleu).",
    ]
    if full_length:
        lines += ["", f"Full batches: every translation is held to {full_length} tokens (`--min_new_tokens` = "
                      f"`--max_new_tokens` = {full_length}; CTranslate2's `min_decoding_length` = "
                      f"`max_decoding_length`), so no sentence leaves its batch early and every step costs the whole "
                      "batch."]
    if any(row.get("startup") is not None for table in report["rows"].values() for row in table):
        lines += ["", "Start-up = the median time of the same process translating the first line alone (greedy): "
                      "imports, loading and exit. Decoding = time - start-up. Decoding / CTranslate2 = a row's "
                      "decoding time over CTranslate2's of the same precision (float32; int8 for the int8 rows), "
                      "which issue 43 wants at most 1.0x for the fast path; \"same as CTranslate2\" compares their "
                      "lines."]
    if any(EARLY_STOPPING in row["system"] for table in report["rows"].values() for row in table):
        lines += ["", f"The rows ending in \"{EARLY_STOPPING[2:]}\" end a sentence's beam search by CTranslate2's rule "
                      "(`--early_stopping true`: once it has num_beams finished hypotheses), where the others give "
                      "generate's lines (its default searches on while a running beam is likely to score better): "
                      "they decode the steps CTranslate2 decodes, so their decoding / CTranslate2 compares a step "
                      "with a step."]
    if report.get("ctranslate2", "ran") != "ran":
        lines += ["", f"CTranslate2 did not run: {report['ctranslate2']}."]
    for name, error in report.get("failures", {}).items():
        lines += ["", f"{name} failed: `{error}`."]
    for beams, table in report["rows"].items():
        lines += ["", f"### Beam {beams}" if beams != "1" else "### Greedy", "",
                  f"| system | seconds | start-up s | decoding s | sentences/s | speed-up | decoding / CTranslate2 | "
                  f"same as {'anchor' if report.get('reference', {}).get(beams, ANCHOR) == ANCHOR else 'generate'} | "
                  "same as CTranslate2 | BLEU | time / family's softmax |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        medians = {row["system"]: row["median"] for row in table}
        decodings = {row["system"]: row.get("decoding") for row in table}
        for row in table:
            target = (GPU_TARGETS if on_gpu else TARGETS).get((row["system"], int(beams)))
            if target and report.get("reference", {}).get(beams, ANCHOR) != (GENERATE if on_gpu else ANCHOR):
                target = None  # each target is a speed-up over one reference: the CPU's anchor, the GPU's generate
            mark = f" (target {target}x: {'met' if row['speedup'] >= target else 'not met'})" if target else ""
            startup, decoding = (f"{row[key]:.1f}" if row.get(key) is not None else "" for key in ("startup",
                                                                                                  "decoding"))
            same_as_ctranslate2 = ("" if row.get("same_as_ctranslate2") is None else
                                   f"{100 * row['same_as_ctranslate2']:.1f}%")
            lines.append(f"| {row['system']} | {row['median']:.1f} [{min(row['seconds']):.1f}-"
                         f"{max(row['seconds']):.1f}] | {startup} | {decoding} | {row['sentences_per_second']:.1f} | "
                         f"{row['speedup']:.2f}x{mark} | {relative_to_ctranslate2(row['system'], decodings)} | "
                         f"{100 * row['same_as_anchor']:.1f}% | {same_as_ctranslate2} | {row['bleu']:.2f} | "
                         f"{relative_to_softmax(row['system'], medians)} |")
    lines += ["", "Command:", "", "```", report["command"], "```"]
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--anchor-process":
        model_dir, input_file, output_file, beams, threads, device, full_length = argv[1:8]
        return anchor_process(model_dir, input_file, output_file, int(beams), int(threads), device, int(full_length))
    if argv and argv[0] == "--ctranslate2-process":
        model_dir, input_file, output_file, beams, threads, length, device, compute_type, full_length = argv[1:10]
        return ctranslate2_process(model_dir, input_file, output_file, int(beams), int(threads), int(length), device,
                                   compute_type, int(full_length))
    # imported after the processes' dispatch: each timed process imports only what its user would (benchmark_quality
    # brings torch, Transformers and this package, seconds a CTranslate2 process would otherwise be charged)
    from benchmark_quality import add_data_arguments, add_publish_arguments, publish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", default="cpu", choices=sorted(SECTIONS), help="where every process decodes")
    parser.add_argument("--seed", type=int, default=1, help="of the zoo models")
    parser.add_argument("--full-length", type=int, default=0, metavar="N",
                        help="full batches: every translation held to N tokens (default 0: real lengths)")
    parser.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS,
                        help="zoo systems beside softmax (given alone: none, so no zoo model is trained)")
    parser.add_argument("--systems", nargs="+", help="run only these rows (e.g. 'ours, generate' 'ours, fast'); "
                        "speed-ups are over the anchor, or over 'ours, generate' where the anchor does not run")
    parser.add_argument("--quick", action="store_true", help="40 sentences, 1 round, no variants (a smoke run)")
    add_data_arguments(parser)
    parser.add_argument("--output-dir", default="runs/quality", help="model folders (benchmark_quality's)")
    parser.add_argument("--work-dir", default=None, help="exports, input and outputs (default: a temporary folder)")
    add_publish_arguments(parser, "benchmarks/decoding.json (benchmarks/decoding-gpu.json on a GPU, "
                                  "benchmarks/decoding-full.json with --full-length)")
    parser.add_argument("--transformer-flags", default="", help="training flags added to every Transformer's")
    parser.add_argument("--lstm-flags", default="", help="training flags added to every LSTM's")
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.rounds, args.variants = 40, 1, []
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
    if args.full_length < 0:
        parser.error(f"--full-length must be a number of tokens >= 1, or 0 for real lengths; got {args.full_length}")
    section = FULL_LENGTH_SECTION if args.full_length else SECTIONS[args.device]
    with tempfile.TemporaryDirectory() as temporary:
        args.work_dir = args.work_dir or temporary
        report = run(args)
    publish(report, section, section_text(report), output=args.output, markdown=args.markdown,
            committed=f"benchmarks/{section}.json", rows=measured_rows, smoke=args.quick)


if __name__ == "__main__":
    main()
