#!/usr/bin/env python
"""Training-step time of MMA encoder self-attention against plain softmax at the same shape, measured side by
side in one run (interleaved repeats, same batch, same thread count). Prints and optionally writes JSON.

    python examples/benchmark_mma.py --d-model 512 --layers 6 --batch-size 32 --source-length 30 --repeats 7
"""

import argparse
import json
import statistics
import time

import torch

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration


def build(args, encoder_self_attention):
    torch.manual_seed(0)
    config = HeadAttnConfig(
        vocab_size=args.vocab_size, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, encoder_self_attention=encoder_self_attention,
    )
    model = HeadAttnForConditionalGeneration(config).train()
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def make_batch(args):
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, args.vocab_size, (args.batch_size, args.source_length), generator=generator)
    lengths = torch.randint(args.source_length // 2, args.source_length + 1, (args.batch_size,), generator=generator)
    attention_mask = (torch.arange(args.source_length)[None] < lengths[:, None]).long()
    labels = torch.randint(3, args.vocab_size, (args.batch_size, args.target_length), generator=generator)
    return dict(input_ids=input_ids.masked_fill(attention_mask == 0, 0), attention_mask=attention_mask, labels=labels)


def step_seconds(model, optimizer, batch, steps):
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=30)
    parser.add_argument("--target-length", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="training steps per timing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings per model")
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    batch = make_batch(args)
    models = {"softmax": build(args, "softmax"), "mma": build(args, {"type": "mma", "window": args.window})}
    for model, optimizer in models.values():  # warm-up
        step_seconds(model, optimizer, batch, 2)
    times = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, (model, optimizer) in models.items():
            times[name].append(step_seconds(model, optimizer, batch, args.steps))
    ratios = [mma / softmax for mma, softmax in zip(times["mma"], times["softmax"])]
    result = {
        "shape": {key: getattr(args, key) for key in ("d_model", "layers", "heads", "batch_size", "source_length",
                                                       "target_length", "window")},
        "threads": torch.get_num_threads(),
        "softmax_step_s": times["softmax"],
        "mma_step_s": times["mma"],
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(f"softmax step: median {statistics.median(times['softmax']) * 1000:.1f} ms")
    print(f"mma step:     median {statistics.median(times['mma']) * 1000:.1f} ms")
    print(f"mma / softmax: median {result['ratio_median']:.3f} (min {result['ratio_min']:.3f}, max "
          f"{result['ratio_max']:.3f}) over {args.repeats} interleaved repeats, {torch.get_num_threads()} threads")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
