#!/usr/bin/env python
"""Speed of the attention backends (issue 31, item 4): the same model run with each `attn_implementation` that its
softmax sites can call, for softmax and for MMA (encoder self-attention, as Cui et al. place it), side by side in one
process, on the same batches and thread count:

* train: target tokens/s of forward + backward + AdamW step (flex attention has no backward on the CPU in PyTorch
  2.13: its rows say so instead of a number);
* forward: target tokens/s of a teacher-forced forward pass without gradients (what scoring and evaluation run);
* greedy / beam5: sentences/s of cached decoding with `generate`, every output exactly --output-length tokens long
  (min_new_tokens = max_new_tokens) so that every run does the same work.

Backends: eager, sdpa and flex_attention (compiled by Transformers' flex_attention_forward; an untimed warm-up round
compiles it for every shape the timed rounds use, and its time is reported apart); on CUDA also flash_attention_2 for softmax when `flash_attn` (or the
`kernels` package) is installed. Batches are random token ids with sentence lengths drawn from [--min-length,
--max-length] (speed depends on the shapes, not on which tokens), right-padded, --batch-size sentences each.

Timings repeat --repeats times, interleaved (every system once per round, each round starting one system later);
the table shows the median [min-max] and the time ratio of medians against sdpa softmax, with the issue's target
(flex MMA within 1.2x of sdpa softmax on the CPU). On CUDA each backend's forward, and every variant's forward with
sdpa (`sync_variants`, each at every site it declares), also runs under `torch.cuda.set_sync_debug_mode("error")`
(inputs checked beforehand, as `generate` does), which raises at any host synchronisation inside the forward; the
report records it.

    python examples/benchmark_backends.py  # ~10 min on 2 cores: benchmarks/backends.json and its BENCHMARKS.md section
    python examples/benchmark_backends.py --quick --output /tmp/backends.json --markdown /tmp/BENCHMARKS.md
"""

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmark_quality's report sections
from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration  # noqa: E402
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS, every_site_placement  # noqa: E402
from hf_headattn.runtime.seq2seq_common import inputs_checked_by_caller  # noqa: E402


# BENCHMARKS.md sections and published JSON reports by device type: a run on one device leaves the other's
SECTIONS = {"cpu": "backends", "cuda": "backends-gpu"}
COMMITTED = {"cpu": "benchmarks/backends.json", "cuda": "benchmarks/backends-gpu.json"}
VARIANTS = {"softmax": {}, "mma": {"encoder_self_attention": "mma"}}
CPU_BACKENDS = ("eager", "sdpa", "flex_attention")
ANCHOR = ("softmax", "sdpa")
MEASURES = ("train", "forward", "greedy", "beam5")
TARGETS = [("mma", "flex_attention", 1.2)]  # (variant, backend, largest time ratio to sdpa softmax), on the CPU
UNITS = {"train": "target tokens/s", "forward": "target tokens/s", "greedy": "sentences/s", "beam5": "sentences/s"}
PAD, EOS, START = 0, 1, 0


# ------------------------------------------------------------------------------------------------ inputs and models
def make_batches(count: int, batch_size: int, vocab_size: int, min_length: int, max_length: int, seed: int):
    """`count` batches of right-padded source ids (ending in EOS) and labels (-100 on padding)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        def padded(lengths, fill):
            ids = torch.full((batch_size, max(lengths)), fill)
            for row, length in enumerate(lengths):
                ids[row, : length - 1] = torch.randint(2, vocab_size, (length - 1,), generator=generator)
                ids[row, length - 1] = EOS
            return ids

        source_lengths = torch.randint(min_length, max_length + 1, (batch_size,), generator=generator).tolist()
        target_lengths = torch.randint(min_length, max_length + 1, (batch_size,), generator=generator).tolist()
        input_ids = padded(source_lengths, PAD)
        batches.append({"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(),
                        "labels": padded(target_lengths, -100)})
    return batches


def build_model(placement: dict, backend: str, d_model: int, layers: int, vocab_size: int, device):
    """A random HeadAttn model with the variants `placement` gives (config fields), running `backend`."""
    torch.manual_seed(0)
    config = HeadAttnConfig(
        vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=d_model // 64, decoder_attention_heads=d_model // 64, encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model, max_position_embeddings=256, dropout=0.1, attention_dropout=0.0,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=START, **placement,
    )
    model = HeadAttnForConditionalGeneration(config).to(device)
    model.set_attn_implementation(backend)
    model._benchmark_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model


def backends_for(device) -> list[str]:
    backends = list(CPU_BACKENDS)
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") or importlib.util.find_spec("kernels"):
            backends.append("flash_attention_2")
    return backends


def systems_for(variants, backends) -> list[tuple[str, str]]:
    """(variant, backend) pairs that can run: flash attention takes no per-head masks (mma)."""
    return [(variant, backend) for variant in variants for backend in backends
            if not (variant == "mma" and backend.startswith("flash"))]


def cannot_run(backend: str, device, measure_name: str) -> str | None:
    """None, or why `backend` cannot run `measure_name` on `device`: flex attention is refused on a CPU whose compiled
    kernel is wrong (`attention_backends.cpu_flex_problem`) and has no backward on any CPU."""
    if backend != "flex_attention" or device.type != "cpu":
        return None
    from hf_headattn.runtime.attention_backends import cpu_flex_problem

    if cpu_flex_problem() is not None:
        return "refused: PyTorch's compiled CPU kernel is wrong on this CPU"
    if measure_name == "train":
        return "no CPU backward (PyTorch 2.13 flex attention)"
    return None


# ------------------------------------------------------------------------------------------------ measurements
def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def to_device(batch: dict, device) -> dict:
    return {key: value.to(device) for key, value in batch.items()}


def train_seconds(model, batches, device) -> tuple[float, int]:
    model.train()
    optimizer = model._benchmark_optimizer
    tokens, start = 0, time.perf_counter()
    for batch in batches:
        batch = to_device(batch, device)
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()
        tokens += int((batch["labels"] != -100).sum())
    synchronize(device)
    return time.perf_counter() - start, tokens


def forward_seconds(model, batches, device) -> tuple[float, int]:
    model.eval()
    tokens, start = 0, time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            batch = to_device(batch, device)
            model(**batch)
            tokens += int((batch["labels"] != -100).sum())
    synchronize(device)
    return time.perf_counter() - start, tokens


def generate_seconds(model, batches, num_beams: int, output_length: int, device) -> tuple[float, int]:
    model.eval()
    sentences, start = 0, time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            model.generate(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                           num_beams=num_beams, do_sample=False, min_new_tokens=output_length,
                           max_new_tokens=output_length)
            sentences += batch["input_ids"].shape[0]
    synchronize(device)
    return time.perf_counter() - start, sentences


def measure(model, measure_name: str, batches, output_length: int, device) -> float:
    """One throughput of `measure_name` (units in UNITS)."""
    if measure_name == "train":
        seconds, amount = train_seconds(model, batches, device)
    elif measure_name == "forward":
        seconds, amount = forward_seconds(model, batches, device)
    else:
        seconds, amount = generate_seconds(model, batches, 1 if measure_name == "greedy" else 5, output_length, device)
    return amount / seconds


def host_sync_free(model, batch, device) -> bool | None:
    """On CUDA: whether a forward pass runs without host synchronisation (the inputs checked beforehand, as generate
    does); None elsewhere."""
    if device.type != "cuda":
        return None
    model.eval()
    batch = to_device(batch, device)
    model.check_inputs(**batch)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad(), inputs_checked_by_caller():
            model(**batch)
        return True
    except RuntimeError:
        return False
    finally:
        torch.cuda.set_sync_debug_mode("default")


def sync_variants(num_heads: int) -> dict[str, dict]:
    """Every registered variant at every site it declares (`every_site_placement`), for the host-synchronisation
    check on CUDA (sdpa at the softmax sites)."""
    return {name: every_site_placement(name, num_heads) for name in ATTENTION_VARIANTS}


def host_sync_by_variant(args, batch, device) -> dict | None:
    """On CUDA: for every variant, whether its forward runs without host synchronisation; None elsewhere."""
    if device.type != "cuda":
        return None
    results = {}
    for name, placement in sync_variants(args.d_model // 64).items():
        model = build_model(placement, "sdpa", args.d_model, args.layers, args.vocab_size, device)
        results[name] = host_sync_free(model, batch, device)
    return results


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


# One process compiles flex attention for two models, each for full passes and decoding steps of several shapes and
# masks: more graphs than torch.compile's default recompile limit (8), past which flex attention silently runs
# unfused (the eager reference, several times slower). A deployment compiles one model's; the limit is raised so that
# every flex system here is measured compiled.
RECOMPILE_LIMIT = 64


def run(args) -> dict:
    import torch._dynamo

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    backends = [backend for backend in backends_for(device) if backend in args.backends]
    systems = systems_for(args.variants, backends)
    batches = make_batches(args.batches, args.batch_size, args.vocab_size, args.min_length, args.max_length, seed=0)
    models = {system: build_model(VARIANTS[system[0]], system[1], args.d_model, args.layers, args.vocab_size, device)
              for system in systems}
    warm_up = {}
    for system, model in models.items():  # an untimed round: compiles flex attention for every shape timed below
        start = time.perf_counter()
        for measure_name in args.measures:
            if cannot_run(system[1], device, measure_name) is None:
                measure(model, measure_name, batches, args.output_length, device)
        warm_up[system] = time.perf_counter() - start
    rounds = {system: {measure_name: [] for measure_name in args.measures} for system in systems}
    for round_index in range(args.repeats):
        order = systems[round_index % len(systems):] + systems[:round_index % len(systems)]
        for system in order:
            for measure_name in args.measures:
                if cannot_run(system[1], device, measure_name) is not None:
                    continue
                rounds[system][measure_name].append(
                    measure(models[system], measure_name, batches, args.output_length, device))
        print(f"round {round_index + 1}/{args.repeats} done", flush=True)
    results = {}
    for system in systems:
        entry = {"warm_up_seconds": warm_up[system],
                 "host_sync_free_forward": (None if cannot_run(system[1], device, "forward")
                                            else host_sync_free(models[system], batches[0], device))}
        for measure_name in args.measures:
            reason = cannot_run(system[1], device, measure_name)
            entry[measure_name] = {"not_run": reason} if reason else summary(rounds[system][measure_name])
        results[f"{system[0]} {system[1]}"] = entry
    return results, host_sync_by_variant(args, batches[0], device)


# ------------------------------------------------------------------------------------------------ report
def time_ratio(results: dict, system: str, measure_name: str, anchor: str = " ".join(ANCHOR)) -> float | None:
    """Time of `system` over time of `anchor` for `measure_name` (throughputs inverted), None if either did not run."""
    mine, theirs = results.get(system, {}).get(measure_name, {}), results.get(anchor, {}).get(measure_name, {})
    if "median" not in mine or "median" not in theirs:
        return None
    return theirs["median"] / mine["median"]


def check_targets(results: dict, measures, device_type: str) -> list[dict]:
    checks = []
    if device_type != "cpu":
        return checks
    for variant, backend, limit in TARGETS:
        for measure_name in measures:
            ratio = time_ratio(results, f"{variant} {backend}", measure_name)
            if ratio is not None:
                checks.append({"system": f"{variant} {backend}", "measure": measure_name, "limit": limit,
                               "ratio": ratio, "met": ratio <= limit})
    return checks


def _cell(entry: dict) -> str:
    if "not_run" in entry:
        return f"n/a: {entry['not_run']}"
    return f"{entry['median']:,.1f} [{entry['min']:,.1f}-{entry['max']:,.1f}]"


def section_text(report: dict) -> str:
    machine, settings, results = report["machine"], report["settings"], report["results"]
    measures = settings["measures"]
    lines = [
        f"## Attention backends ({machine['device']})",
        "",
        f"`{report['command']}` — {machine['processor']}, {machine['threads']} threads, torch {machine['torch']}, "
        f"Transformers {machine['transformers']}; d_model {settings['d_model']}, {settings['layers']} + "
        f"{settings['layers']} layers, {settings['d_model'] // 64} heads, random weights; {settings['batches']} "
        f"batches of {settings['batch_size']} sentences of {settings['min_length']}-{settings['max_length']} tokens; "
        f"outputs of {settings['output_length']} tokens; median [min-max] of {settings['repeats']} interleaved rounds; "
        f"ratio = time / time of sdpa softmax (below 1: faster). MMA: encoder self-attention. torch.compile's "
        f"recompile limit raised to {RECOMPILE_LIMIT} (one process compiles flex attention for two models; past the "
        f"default 8 graphs it would run unfused). {report['minutes']:.1f} minutes.",
        "",
        "| system | " + " | ".join(f"{name} ({UNITS[name]}) | ratio" for name in measures)
        + " | warm-up s | forward without host sync |",
        "|---|" + "---:|---:|" * len(measures) + "---:|---|",
    ]
    for system, entry in results.items():
        cells = []
        for measure_name in measures:
            ratio = time_ratio(results, system, measure_name)
            cells += [_cell(entry[measure_name]), "" if ratio is None else f"{ratio:.2f}"]
        sync = entry.get("host_sync_free_forward")
        lines.append(f"| {system} | " + " | ".join(cells) + f" | {entry['warm_up_seconds']:.1f} | "
                     + ("n/a (CPU)" if sync is None else "yes" if sync else "NO") + " |")
    host_sync = report.get("host_sync_free_forward_by_variant")
    if host_sync:
        lines += ["", "Forward without host synchronisation (sdpa, inputs checked beforehand): " + ", ".join(
            f"{name} {'yes' if free else 'NO'}" for name, free in host_sync.items()) + "."]
    if report["targets"]:
        met = sum(check["met"] for check in report["targets"])
        lines += ["", f"Targets (issue 31): {met} of {len(report['targets'])} met.", "",
                  "| target | measure | time ratio | met |", "|---|---|---:|---|"]
        lines += [f"| {check['system']} <= {check['limit']:.1f}x sdpa softmax | {check['measure']} | "
                  f"{check['ratio']:.2f} | {'yes' if check['met'] else 'NO'} |" for check in report["targets"]]
    return "\n".join(lines)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main(argv=None):
    from benchmark_quality import add_publish_arguments, publish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--backends", nargs="+", default=[*CPU_BACKENDS, "flash_attention_2"])
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=list(MEASURES))
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-length", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=28)
    parser.add_argument("--output-length", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    add_publish_arguments(parser, f"{COMMITTED['cpu']} ({COMMITTED['cuda']} on a GPU)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny model, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.layers, args.vocab_size, args.batches, args.batch_size = 256, 1, 100, 1, 4
        args.repeats, args.output_length, args.max_length = 1, 3, 12
    start = time.perf_counter()
    results, host_sync = run(args)
    device_type = torch.device(args.device).type
    import transformers

    report = {
        "command": "python examples/benchmark_backends.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": cpu_name() if args.device == "cpu" else
                    torch.cuda.get_device_name(), "threads": args.threads, "device": args.device,
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "settings": {name: getattr(args, name) for name in ("d_model", "layers", "vocab_size", "batches", "batch_size",
                                                             "min_length", "max_length", "output_length", "repeats",
                                                             "measures")},
        "results": results,
        "host_sync_free_forward_by_variant": host_sync,
        "targets": check_targets(results, args.measures, device_type),
        "minutes": (time.perf_counter() - start) / 60,
    }
    publish(report, SECTIONS[device_type], section_text(report), output=args.output, markdown=args.markdown,
            committed=COMMITTED[device_type], rows=lambda report: set(report["results"]), smoke=args.quick)
    return report


if __name__ == "__main__":
    main()
