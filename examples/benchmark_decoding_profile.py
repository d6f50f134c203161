"""Where one decoding batch's time goes: the fast path against `generate`, on any device.

On an H200 the fast path decoded 10,000 lines at 0.85x `generate`'s speed (BENCHMARKS.md, "Decoding speed:
translating a file (GPU)"), where on the CPU it is ~2x. This decodes one batch with each, `--rounds` alternating
timed runs and then one run each under torch.profiler, and reports per decoder step:

* wall time (the timed runs' median; the profiled run is slower);
* the operators' own time in the profiled run: on a GPU the kernels' time on the device, on a CPU the ATen operators'
  time on the host (the kernels run inside them), and the share of the profiled run's wall time outside them:
  Python, dispatch, launches, waits;
* ATen operator calls (those an operator makes inside counted too), and on a GPU kernel launches;
* host waits: reads of a value on the host (`aten::_local_scalar_dense`: `.item()`, `int()`, `bool()`; `nonzero`)
  and on a GPU the synchronising CUDA calls (`cudaStreamSynchronize`, ...), which `.tolist()` and copies to the host
  make too;

and the operators that took the most host time. A batch is the first --sentences lines of test_2016_flickr.de;
both searches must give the same lines.

    python examples/benchmark_decoding_profile.py --device cuda
"""

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_MODEL = "runs/quality/transformer-softmax/seed-1"  # examples/benchmark_quality.py's anchor-recipe model
TEST_SOURCE = "test_2016_flickr.de"
COMMITTED = {"cpu": "benchmarks/decoding_profile.json", "gpu": "benchmarks/decoding_profile-gpu.json"}
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
DEVICE_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
HOST_READS = ("aten::_local_scalar_dense", "aten::nonzero")
TOP_OPERATORS = 12


def searches(model, batch, num_beams: int) -> dict:
    """The two searches over `batch`, each returning its sequences."""
    from hf_headattn.decoding import fast_generate

    return {
        "generate": lambda: model.generate(**batch, num_beams=num_beams),
        "fast path": lambda: fast_generate(model, batch["input_ids"], batch["attention_mask"], num_beams=num_beams),
    }


def synchronized(search, device: torch.device):
    """`search`'s sequences, once the device has finished computing them."""
    sequences = search()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sequences


def profiled(search, device: torch.device) -> dict:
    """Counts and times of one run of `search` under torch.profiler (times in ms)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        synchronized(search, device)
        wall = time.perf_counter() - started
    events = profiler.key_averages()
    aten = [event for event in events if event.key.startswith("aten::")]
    count = {event.key: event.count for event in events}
    if device.type == "cuda":
        operators_ms = sum(event.self_device_time_total for event in events
                           if event.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    else:
        operators_ms = sum(event.self_cpu_time_total for event in aten) / 1e3
    top = sorted(aten, key=lambda event: -event.self_cpu_time_total)[:TOP_OPERATORS]
    return {
        "profiled_wall_ms": 1e3 * wall, "operators_ms": operators_ms,
        "operator_calls": sum(event.count for event in aten),
        "kernel_launches": sum(count.get(name, 0) for name in LAUNCHES),
        "host_reads": sum(count.get(name, 0) for name in HOST_READS),
        "device_waits": sum(count.get(name, 0) for name in DEVICE_WAITS),
        "top_operators": [{"name": event.key, "calls": event.count, "host_ms": event.self_cpu_time_total / 1e3,
                           "device_ms": getattr(event, "self_device_time_total", 0) / 1e3} for event in top],
    }


def measure(args) -> dict:
    from benchmark_quality import DEFAULT_DATA_DIR, machine

    from hf_headattn.loading import load_model_and_tokenizer, resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model.to(device).eval()
    source = Path(args.data_dir or DEFAULT_DATA_DIR) / TEST_SOURCE
    lines = source.read_text(encoding="utf-8").splitlines()[:args.sentences]
    batch = tokenizer(lines, return_tensors="pt", padding=True).to(device)
    runs = searches(model, batch, args.num_beams)
    with torch.inference_mode():
        sequences = {name: synchronized(search, device) for name, search in runs.items()}  # also the warm-up
        texts = {name: tokenizer.batch_decode(ids, skip_special_tokens=True) for name, ids in sequences.items()}
        steps = {name: ids.shape[-1] - 1 for name, ids in sequences.items()}
        seconds = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, search in runs.items():
                started = time.perf_counter()
                synchronized(search, device)
                seconds[name].append(time.perf_counter() - started)
        systems = {}
        for name, search in runs.items():
            wall_ms = 1e3 * statistics.median(seconds[name])
            systems[name] = {"steps": steps[name], "wall_ms": wall_ms, "rounds_ms": [1e3 * s for s in seconds[name]],
                             **profiled(search, device)}
    return {"machine": machine(), "device": str(device), "model": args.model, "sentences": len(lines),
            "num_beams": args.num_beams, "threads": args.threads, "systems": systems,
            "same_lines": texts["fast path"] == texts["generate"],
            "command": shlex.join(["python", "examples/benchmark_decoding_profile.py", *args.argv])}


def section_text(report: dict) -> str:
    m, on_gpu = report["machine"], report["device"].startswith("cuda")
    where = f"GPU: {m['cuda']}" if on_gpu else "CPU"
    operators = "kernels on the device" if on_gpu else "ATen operators"
    lines = [
        f"## Decoding profile: one batch, fast path against generate ({where})", "",
        f"Measured by `examples/benchmark_decoding_profile.py`: the anchor-recipe softmax model decodes the first "
        f"{report['sentences']} lines of {TEST_SOURCE} at {report['num_beams']} beams, each search "
        f"{len(next(iter(report['systems'].values()))['rounds_ms'])} times alternating (median), then once under "
        f"torch.profiler for the counts and the operators' time; {report['threads']} CPU threads; {m['cpu_model']}, "
        f"{m['cpu_count']} CPUs, torch {m['torch']}, Transformers {m['transformers']}. Per decoder step: wall time, "
        f"the {operators}' own time, ATen operator calls (those an operator makes inside counted too), kernel "
        "launches, host reads (`_local_scalar_dense`, "
        "`nonzero`) and synchronising CUDA calls. Same lines: "
        f"{'yes' if report['same_lines'] else 'NO'}.", "",
        "Why: on an H200 the fast path decoded at 0.85x `generate`'s speed (\"Decoding speed: translating a file "
        "(GPU)\"), on the CPU at ~2x. examples/benchmark_gpu.sh runs this there too: a search whose wall time is "
        "mostly outside the operators is host-bound, and its operator calls, launches and waits are what it pays "
        "for.", "",
        "| search | steps | wall ms | wall ms a step | operators' ms a step (profiled) | outside the operators "
        "(profiled) | operator calls a step | kernel launches a step | host reads a step | CUDA waits a step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, system in report["systems"].items():
        steps = system["steps"]
        outside = max(0.0, 1 - system["operators_ms"] / system["profiled_wall_ms"])
        lines.append(
            f"| {name} | {steps} | {system['wall_ms']:.0f} | {system['wall_ms'] / steps:.2f} | "
            f"{system['operators_ms'] / steps:.2f} | {outside:.0%} | {system['operator_calls'] / steps:.0f} | "
            f"{system['kernel_launches'] / steps:.0f} | {system['host_reads'] / steps:.1f} | "
            f"{system['device_waits'] / steps:.1f} |")
    for name, system in report["systems"].items():
        lines += ["", f"{name}, the operators that took the most host time (profiled run, "
                      f"{system['profiled_wall_ms']:.0f} ms):", "",
                  "| operator | calls | host ms | device ms |", "|---|---:|---:|---:|"]
        lines += [f"| `{op['name']}` | {op['calls']} | {op['host_ms']:.1f} | {op['device_ms']:.1f} |"
                  for op in system["top_operators"]]
    return "\n".join(lines + ["", "Command:", "", "```", report["command"], "```"])


def main(argv=None) -> None:
    from benchmark_quality import add_publish_arguments, publish

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model folder of this package")
    parser.add_argument("--data-dir", help=f"Multi30k folder ({TEST_SOURCE}'s first lines are the batch)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (a GPU if one is visible)")
    parser.add_argument("--sentences", type=int, default=128, help="the fast path's batch at beam 5")
    parser.add_argument("--num-beams", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_publish_arguments(parser, COMMITTED["cpu"] + " (on a GPU " + COMMITTED["gpu"] + ")")
    args = parser.parse_args(argv)
    args.argv = argv
    report = measure(args)
    kind = "gpu" if report["device"].startswith("cuda") else "cpu"
    publish(report, "decoding_profile" + ("-gpu" if kind == "gpu" else ""), section_text(report),
            output=args.output, markdown=args.markdown, committed=COMMITTED[kind], rows=measured_rows)


def measured_rows(report: dict) -> set:
    """A report's rows, for `publish`: a run of another batch or beam size does not replace the published one."""
    return {(report["sentences"], report["num_beams"], name) for name in report["systems"]}


if __name__ == "__main__":
    main()
