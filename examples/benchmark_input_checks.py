"""What the forward/generate input checks (issue 17) cost: a training step and beam-search decoding of both model
families, with the checks and without them, interleaved round by round; reports after/before time ratios.

"Before" runs the same code with the checks bypassed: the undecorated forward (`forward.__wrapped__`) inside
`inputs_checked_by_caller()`, and `GenerationMixin.generate` without the models' own `generate` (which checks the
source once and marks the decoding steps as checked). The checks' own cost per call is printed too.

    python examples/benchmark_input_checks.py --rounds 30 --output benchmarks/input_checks.json
"""

import argparse
import json
import statistics
import time

import torch
from transformers import GenerationMixin

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration, HeadAttnRNNConfig
from hf_headattn.runtime.seq2seq_common import inputs_checked_by_caller
from hf_headattn.runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration


VOCAB, PAD, EOS = 4000, 0, 1


def models():
    transformer = HeadAttnForConditionalGeneration(HeadAttnConfig(
        vocab_size=VOCAB, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, dropout=0.1))
    rnn = HeadAttnRNNForConditionalGeneration(HeadAttnRNNConfig(
        vocab_size=VOCAB, embedding_size=128, hidden_size=128, num_heads=2, num_hops=2, pad_token_id=PAD,
        eos_token_id=EOS, decoder_start_token_id=PAD))
    return {"transformer": transformer, "rnn": rnn}


def batch(sentences, source_length, target_length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, VOCAB, (sentences, source_length), generator=generator)
    lengths = torch.randint(source_length // 2, source_length + 1, (sentences,), generator=generator)
    attention_mask = (torch.arange(source_length)[None] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
    labels = torch.randint(2, VOCAB, (sentences, target_length), generator=generator)
    return input_ids, attention_mask, labels


def training_step(model, checked, input_ids, attention_mask, labels):
    model.zero_grad(set_to_none=True)
    if checked:
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    else:
        with inputs_checked_by_caller():
            loss = type(model).forward.__wrapped__(model, input_ids=input_ids, attention_mask=attention_mask,
                                                   labels=labels).loss
    loss.backward()


@torch.no_grad()
def decode(model, checked, input_ids, attention_mask):
    settings = dict(attention_mask=attention_mask, num_beams=4, max_new_tokens=10, min_new_tokens=10)
    if checked:
        return model.generate(input_ids, **settings)
    with inputs_checked_by_caller():
        return GenerationMixin.generate(model, input_ids, **settings)


def timed(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    train_batch = batch(16, 20, 20)
    decode_batch = batch(4, 20, 20)[:2]
    results = {}
    for name, model in models().items():
        jobs = {"train step": (training_step, (*train_batch,), True),
                "beam4 x 10 steps": (decode, (*decode_batch,), False)}
        for label, (function, arguments, training) in jobs.items():
            model.train(training)
            function(model, True, *arguments)  # warm-up
            times = {True: [], False: []}
            for round_ in range(args.rounds):
                for checked in ((True, False) if round_ % 2 else (False, True)):  # alternate which goes first
                    times[checked].append(timed(function, model, checked, *arguments))
            ratios = [after / before for after, before in zip(times[True], times[False])]
            fastest_ratio = min(times[True]) / min(times[False])  # the least disturbed run of each, on a shared machine
            results[f"{name} {label}"] = dict(
                ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                ratio_of_fastest=fastest_ratio,
                checked_median_s=statistics.median(times[True]), unchecked_median_s=statistics.median(times[False]))
            print(f"{name:11s} {label:17s} after/before {statistics.median(ratios):.3f} (median of {args.rounds}; "
                  f"{min(ratios):.3f}-{max(ratios):.3f}), fastest/fastest {fastest_ratio:.3f}, "
                  f"median {statistics.median(times[True]) * 1e3:.1f} ms vs "
                  f"{statistics.median(times[False]) * 1e3:.1f} ms")
        input_ids, attention_mask, labels = train_batch
        arguments = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        start = time.perf_counter()
        for _ in range(200):
            model.check_inputs(**arguments)
        per_call = (time.perf_counter() - start) / 200
        results[f"{name} check_inputs per call"] = dict(seconds=per_call)
        print(f"{name:11s} check_inputs on the training batch: {per_call * 1e6:.0f} us per call")
    results["settings"] = dict(rounds=args.rounds, threads=torch.get_num_threads(), torch=torch.__version__,
                               train_batch=list(train_batch[0].shape), decode_batch=list(decode_batch[0].shape))
    if args.output:
        with open(args.output, "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
