"""Kernel launches of one train step (forward and backward) per attention variant, counted on the CPU: ATen calls
(a TorchDispatchMode sees every operator call below autograd, each a kernel launch on a GPU, views included) plus
Triton launches, through the torch path and through the Triton kernels (runtime/triton_kernels.py).

The torch rows run the sparse solvers' device path, the branch-free sorting a GPU runs (`sparse_solvers.HOST_DEVICES`
emptied; on the CPU they would branch on the data and call fewer, data-dependent operators). The Triton rows run the
kernels in Triton's interpreter (TRITON_INTERPRET=1, set here before triton is imported), each launch counted once
and the interpreter's own tensor calls not at all. Counts do not depend on the widths, the batch or the machine
(nothing branches on the data), so the models are small: 6 + 6 layers, 8 heads, random weights. Both families: the
Transformer (the variant at cross-attention) and the LSTM of the malaviya2018 preset (one decoder step a position).

    python examples/benchmark_kernel_launches.py

writes benchmarks/kernel_launches.json and its section of BENCHMARKS.md (--output, --markdown: elsewhere).
"""

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path

if __name__ == "__main__":
    # triton reads it as it is imported (Transformers imports triton with the models): the kernels run on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration, HeadAttnRNNConfig
from hf_headattn import HeadAttnRNNForConditionalGeneration
from hf_headattn.runtime import sparse_solvers

sys.path.insert(0, str(Path(__file__).resolve().parent))

COMMITTED = "benchmarks/kernel_launches.json"

VARIANTS = ("softmax", "sparsemax", "csoftmax", "csparsemax")
KERNELS = ("_constrained_scan_forward", "_constrained_scan_backward", "_sparsemax_forward", "_sparsemax_backward")
TARGET = 1.3  # the target: a train step within 1.3x softmax's launches


class LaunchCounter(TorchDispatchMode):
    """Counts ATen operator calls, and (through `counted_kernels`) Triton launches, during which it counts nothing
    else: the interpreter's copies are not the kernel's launches."""

    def __init__(self):
        super().__init__()
        self.aten_calls = 0
        self.triton_launches = 0
        self.inside_launch = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside_launch:
            self.aten_calls += 1
        return func(*args, **(kwargs or {}))


class CountedKernel:
    """A Triton kernel whose launches (`kernel[grid](...)`) `counter` counts."""

    def __init__(self, kernel, counter: LaunchCounter):
        self.kernel, self.counter = kernel, counter

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def counted(*args, **kwargs):
            self.counter.triton_launches += 1
            self.counter.inside_launch = True
            try:
                return launch(*args, **kwargs)
            finally:
                self.counter.inside_launch = False

        return counted


@contextlib.contextmanager
def counted_kernels(counter: LaunchCounter):
    from hf_headattn.runtime import triton_kernels

    originals = {name: getattr(triton_kernels, name) for name in KERNELS}
    try:
        for name, kernel in originals.items():
            setattr(triton_kernels, name, CountedKernel(kernel, counter))
        yield
    finally:
        for name, kernel in originals.items():
            setattr(triton_kernels, name, kernel)


@contextlib.contextmanager
def kernels_backend(backend: str):
    """The kernels `sparse_attention.kernel_backend` picks ("torch": the solvers' device path)."""
    saved = os.environ.get("HF_HEADATTN_KERNELS"), sparse_solvers.HOST_DEVICES
    os.environ["HF_HEADATTN_KERNELS"] = backend
    sparse_solvers.HOST_DEVICES = ()
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("HF_HEADATTN_KERNELS")
        else:
            os.environ["HF_HEADATTN_KERNELS"] = saved[0]
        sparse_solvers.HOST_DEVICES = saved[1]


def transformer(variant: str):
    config = HeadAttnConfig(vocab_size=100, d_model=64, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                            decoder_attention_heads=8, encoder_ffn_dim=128, decoder_ffn_dim=128,
                            max_position_embeddings=64, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                            cross_attention=variant)
    return HeadAttnForConditionalGeneration(config)


def lstm(variant: str):
    """The malaviya2018 preset's LSTM (2 layers, the sink token, the sink in every transform), narrower."""
    config = HeadAttnRNNConfig(vocab_size=100, embedding_size=64, hidden_size=64, encoder_layers=2, decoder_layers=2,
                               dropout=0.3, embedding_dropout=False, attention_score="general", sink="token",
                               sink_every_transform=True, attention_transform=variant, pad_token_id=0, eos_token_id=1,
                               decoder_start_token_id=0)
    return HeadAttnRNNForConditionalGeneration(config)


def batch(sentences: int, length: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(2, 100, (sentences, length), generator=generator)
    source[:, -1] = 1
    mask = torch.ones_like(source)
    mask[0, length // 2:] = 0  # one padded sentence: masked keys on the path
    labels = torch.randint(2, 100, (sentences, length), generator=generator)
    return {"input_ids": source, "attention_mask": mask, "labels": labels}


def count_train_step(model, inputs: dict, backend: str) -> dict:
    counter = LaunchCounter()
    model.train()
    with kernels_backend(backend), (counted_kernels(counter) if backend == "triton" else contextlib.nullcontext()):
        with counter:
            loss = model(**inputs).loss
            loss.backward()
    return {"aten_calls": counter.aten_calls, "triton_launches": counter.triton_launches,
            "launches": counter.aten_calls + counter.triton_launches}


def measure(args) -> dict:
    from benchmark_quality import machine

    inputs = batch(args.sentences, args.length)
    rows = []
    for family, build in (("transformer", transformer), ("lstm", lstm)):
        softmax = None
        for variant in VARIANTS:
            torch.manual_seed(0)
            model = build(variant)
            for backend in (("torch",) if variant == "softmax" else ("torch", "triton")):
                counts = count_train_step(model, inputs, backend)
                softmax = softmax or counts["launches"]
                rows.append({"family": family, "variant": variant, "path": backend, **counts,
                             "over_softmax": round(counts["launches"] / softmax, 2)})
                print(rows[-1], file=sys.stderr)
    import triton

    return {"machine": machine(), "triton": triton.__version__, "sentences": args.sentences, "length": args.length,
            "rows": rows, "command": shlex.join(["python", "examples/benchmark_kernel_launches.py", *args.argv])}


def section_text(report: dict) -> str:
    m = report["machine"]
    lines = [
        "## Kernel launches of a train step (counted on the CPU)", "",
        "Measured by `examples/benchmark_kernel_launches.py`: one forward and backward of a random model, "
        f"{report['sentences']} sentences of {report['length']} source and {report['length']} target tokens (one "
        "padded), counting ATen calls (a TorchDispatchMode: every operator call below autograd, views included; each "
        "a kernel launch on a GPU) and Triton launches. Transformer: 6 + 6 layers, 8 heads, the variant at "
        "cross-attention; LSTM: the malaviya2018 preset's (2 + 2 layers, the <SINK> token in every transform), one "
        "decoder step a target position. *torch*: the sparse solvers' device path, the branch-free sorting a GPU runs "
        "(`sparse_solvers.HOST_DEVICES` emptied); *triton*: `HF_HEADATTN_KERNELS=triton`, the kernels of "
        "`runtime/triton_kernels.py` run in Triton's interpreter (`TRITON_INTERPRET=1`), a launch counted once. "
        "Nothing branches on the data, so the counts hold for any width, batch and machine (the torch rows of the "
        "Transformer grow with the target length, one solver step a position; its triton rows do not); "
        f"{m['cpu_model']}, torch {m['torch']}, Transformers {m['transformers']}, triton {report['triton']}.", "",
        f"| family | variant | path | ATen calls | Triton launches | launches | / softmax | <= {TARGET}x softmax |",
        "|---|---|---|---:|---:|---:|---:|---|"]
    for row in report["rows"]:
        met = "" if row["variant"] == "softmax" else ("yes" if row["over_softmax"] <= TARGET else "no")
        lines.append(f"| {row['family']} | {row['variant']} | {row['path']} | {row['aten_calls']:,} | "
                     f"{row['triton_launches']} | {row['launches']:,} | {row['over_softmax']:.2f} | {met} |")
    return "\n".join(lines + ["", "Command:", "", "```", report["command"], "```"])


def main(argv=None) -> None:
    from benchmark_quality import add_publish_arguments, publish

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=4, help="the counts do not depend on it")
    parser.add_argument("--length", type=int, default=20, help="source and target tokens a sentence")
    add_publish_arguments(parser, COMMITTED)
    args = parser.parse_args(argv)
    args.argv = argv
    report = measure(args)
    publish(report, "kernel_launches", section_text(report), output=args.output, markdown=args.markdown,
            committed=COMMITTED)


if __name__ == "__main__":
    main()
