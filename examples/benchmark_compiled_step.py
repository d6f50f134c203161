#!/usr/bin/env python
"""Does a compiled decoding step pay? The fast path's decoder step, eager against `torch.compile`, one process.

Issue 43 lists a compiled decoder step as a lever for the fast path (hf_headattn/decoding.py). This measures it
on the step the fast path runs: the model's forward over one new token per row with its cache
(`model(encoder_outputs=..., decoder_input_ids=..., cache=..., use_cache=True)`), --sentences source lines
repeated --num-beams times (the rows of a beam search's batch), --steps steps from the start token, each step
fed the argmax of the last (the cache grows as it does in decoding). Three numbers:

* compile time: the first pass through the compiled model over every step (dynamo, AOTAutograd and Inductor's
  C++ build, recompiles for the growing cache included), with an empty Inductor cache (a fresh temporary
  TORCHINDUCTOR_CACHE_DIR unless one is set), as a new install pays it; and again after `torch._dynamo.reset()`
  with that cache filled, as every later process pays it (dynamo traces again; Inductor's code is reused);
* the steps' time, eager and compiled, in interleaved rounds after that (median of --rounds);
* break-even: the decoding steps a process must run before the filled-cache compile time is paid back (none when
  the compiled step is not faster).

The compiled step's tokens are checked against the eager step's (the argmax at every step, every row).

    python examples/benchmark_compiled_step.py --model runs/quality/transformer-softmax/seed-1
"""
from __future__ import annotations

import argparse
import atexit
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # set before torch reads it; removed at exit
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cache-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_MODEL = "runs/quality/transformer-softmax/seed-1"  # examples/benchmark_quality.py's anchor-recipe model
TEST_SOURCE = "test_2016_flickr.de"
COMMITTED = "benchmarks/compiled_step.json"


def decoder_rows(model, tokenizer, lines: list[str], beams: int) -> dict:
    """The encoder's outputs and source mask of `lines`, each row repeated `beams` times, as the fast path's beam
    search holds them."""
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    encoder_outputs = model.get_encoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                          return_dict=True)
    return {"encoder_outputs": type(encoder_outputs)(
                last_hidden_state=encoder_outputs.last_hidden_state.repeat_interleave(beams, dim=0)),
            "attention_mask": batch.attention_mask.repeat_interleave(beams, dim=0)}


def decode_steps(forward, model, rows: dict, steps: int) -> tuple[list[float], torch.Tensor]:
    """Seconds of each of `steps` decoder steps through `forward`, and the tokens chosen [rows, steps]."""
    tokens = torch.full((rows["attention_mask"].shape[0], 1), model.config.decoder_start_token_id)
    cache, seconds, chosen = None, [], []
    for _ in range(steps):
        started = time.perf_counter()
        outputs = forward(**rows, decoder_input_ids=tokens, cache=cache, use_cache=True, return_dict=True)
        cache = outputs["cache" if "cache" in outputs else "past_key_values"]
        tokens = outputs.logits[:, -1].argmax(dim=-1, keepdim=True)
        seconds.append(time.perf_counter() - started)
        chosen.append(tokens)
    return seconds, torch.cat(chosen, dim=1)


def measure(args) -> dict:
    from benchmark_quality import DEFAULT_DATA_DIR, machine

    from hf_headattn.loading import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()
    source = Path(args.data_dir or DEFAULT_DATA_DIR) / TEST_SOURCE
    lines = source.read_text(encoding="utf-8").splitlines()[:args.sentences]
    compiled = torch.compile(model, dynamic=True)
    with torch.inference_mode():
        rows = decoder_rows(model, tokenizer, lines, args.num_beams)
        started = time.perf_counter()
        _, compiled_tokens = decode_steps(compiled, model, rows, args.steps)
        compile_seconds = time.perf_counter() - started
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=True)
        started = time.perf_counter()
        decode_steps(compiled, model, rows, args.steps)
        warm_compile_seconds = time.perf_counter() - started
        _, eager_tokens = decode_steps(model, model, rows, args.steps)  # also the eager path's warm-up
        rounds = []
        for _ in range(args.rounds):
            eager, _ = decode_steps(model, model, rows, args.steps)
            compiled_steps, _ = decode_steps(compiled, model, rows, args.steps)
            rounds.append({"eager_s": sum(eager), "compiled_s": sum(compiled_steps)})
    eager_step = statistics.median(r["eager_s"] for r in rounds) / args.steps
    compiled_step = statistics.median(r["compiled_s"] for r in rounds) / args.steps
    saving = eager_step - compiled_step
    return {"machine": machine(), "model": args.model, "rows": rows["attention_mask"].shape[0],
            "sentences": len(lines), "num_beams": args.num_beams, "steps": args.steps, "threads": args.threads,
            "compile_s": compile_seconds, "warm_compile_s": warm_compile_seconds, "rounds": rounds,
            "eager_step_ms": 1000 * eager_step, "compiled_step_ms": 1000 * compiled_step,
            "ratio": compiled_step / eager_step,
            "break_even_steps": warm_compile_seconds / saving if saving > 0 else None,
            "same_tokens": bool(torch.equal(compiled_tokens, eager_tokens)),
            "command": shlex.join(["python", "examples/benchmark_compiled_step.py", *args.argv])}


def section_text(report: dict) -> str:
    m = report["machine"]
    break_even = (f"{report['break_even_steps']:,.0f} steps" if report["break_even_steps"] is not None
                  else "never (the compiled step is not faster)")
    return "\n".join([
        "## Compiled decoding step (CPU)", "",
        f"Measured by `examples/benchmark_compiled_step.py`: the fast path's decoder step (one new token a row, with "
        f"its cache) of the anchor-recipe softmax model, {report['sentences']} sentences x {report['num_beams']} beams "
        f"= {report['rows']} rows, {report['steps']} steps from the start token, eager against "
        f"`torch.compile(model, dynamic=True)` in one process, median of {len(report['rounds'])} interleaved rounds "
        f"after the first compiled pass; {report['threads']} threads; {m['cpu_model']}, {m['cpu_count']} CPUs, "
        f"torch {m['torch']}, Transformers {m['transformers']}.", "",
        "Compile s: the first pass over the steps, Inductor's cache empty (a new install) and filled (every later "
        "process); break-even: the decoding steps of this size a process runs before the filled-cache compile is paid "
        "back.", "",
        "| compile s, empty cache | compile s, filled cache | eager ms a step | compiled ms a step | compiled / eager "
        "| break-even | same tokens |",
        "|---:|---:|---:|---:|---:|---|---|",
        f"| {report['compile_s']:.1f} | {report['warm_compile_s']:.1f} | {report['eager_step_ms']:.1f} | "
        f"{report['compiled_step_ms']:.1f} | "
        f"{report['ratio']:.2f} | {break_even} | {'yes' if report['same_tokens'] else 'no'} |",
        "", "Command:", "", "```", report["command"], "```"])


def main(argv=None) -> None:
    from benchmark_quality import add_publish_arguments, publish

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model folder of this package (Transformer family)")
    parser.add_argument("--data-dir", help=f"Multi30k folder ({TEST_SOURCE}'s first lines are the batch)")
    parser.add_argument("--sentences", type=int, default=128, help="the fast path's default batch")
    parser.add_argument("--num-beams", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_publish_arguments(parser, COMMITTED)
    args = parser.parse_args(argv)
    args.argv = argv
    report = measure(args)
    publish(report, "compiled_step", section_text(report), output=args.output, markdown=args.markdown,
            committed=COMMITTED)


if __name__ == "__main__":
    main()
