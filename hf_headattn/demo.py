"""Offline end-to-end demo: make a toy corpus, train a tokenizer and a small model on it with Seq2SeqTrainer,
save the model folder, reload it through `trust_remote_code`, and translate held-out sentences with
`pipeline("translation")`.

    hf-headattn-demo                    # the command (hf_headattn.commands.demo); writes runs/demo/

Tooling, not model runtime: never copied into a checkpoint.
"""

import json
from pathlib import Path

from .output_files import write_text

DEFAULT_OUTPUT_DIR = "runs/demo"


def runaway_lines(hypotheses: list[str], references: list[str]) -> list[int]:
    """1-based numbers of the hypotheses that run on past their reference's end (over twice its words, and 3 more):
    a model that loops repeats words until the length limit, and BLEU counts every one of them against the whole
    corpus while exact match counts the line once."""
    return [number for number, (hypothesis, reference) in enumerate(zip(hypotheses, references), start=1)
            if len(hypothesis.split()) > 2 * len(reference.split()) + 3]


def run(output_dir: str | Path, epochs: float = 5, cross_attention: str = "softmax", show: bool = True) -> dict:
    """Train and test the demo model; returns (and writes to demo_results.json) the test sentences' BLEU, exact
    match and runaway lines (`runaway_lines`). `show` prints five translations and a summary line, which names
    the runaway lines, if any: they are why BLEU can be far lower than exact match."""
    import sacrebleu
    from transformers import pipeline

    from .parallel_data import read_lines
    from .toy_corpus import write_toy_corpus
    from .training import train
    from .training.run import summary_line

    output_dir = Path(output_dir)
    data = write_toy_corpus(output_dir / "data", n_train=3000, n_valid=100, n_test=100, seed=0)
    model_dir = output_dir / "model"
    metrics = train([
        "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
        "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
        "--output_dir", str(model_dir), "--overwrite_output_dir", "--vocab_size", "400", "--d_model", "128",
        "--layers", "2", "--heads", "4", "--ffn_dim", "256", "--num_train_epochs", str(epochs),
        "--per_device_train_batch_size", "32", "--warmup_steps", "100", "--learning_rate", "1e-3",
        "--logging_steps", "100", "--cross_attention", cross_attention,
    ])

    if show:
        print(summary_line(metrics, model_dir), flush=True)

    # What a user without this package does: the folder carries its own code and pipeline.
    translator = pipeline("translation", model=str(model_dir), trust_remote_code=True)
    sources, references = read_lines(data["test.src"]), read_lines(data["test.tgt"])
    hypotheses = [item["translation_text"] for item in translator(sources, num_beams=4)]
    summary = {
        "test_sentences": len(sources),
        "exact_match": sum(h == r for h, r in zip(hypotheses, references)) / len(sources),
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score,
        "runaway_lines": runaway_lines(hypotheses, references),
        "model_dir": str(model_dir),
    }
    write_text(output_dir / "demo_results.json", json.dumps(summary, indent=2) + "\n")
    if show:
        for source, hypothesis, reference in list(zip(sources, hypotheses, references))[:5]:
            print(f"  {source}\n    -> {hypothesis}\n    (reference: {reference})")
        runaway = summary["runaway_lines"]
        loops = "hypothesis loops" if len(runaway) == 1 else "hypotheses loop"
        why = (f" | {len(runaway)} {loops} past the reference's end (test line {', '.join(map(str, runaway))}): "
               "BLEU counts each repeated word" if runaway else "")
        print(f"BLEU {summary['bleu']:.2f} | exact match {summary['exact_match']:.0%} | "
              f"{summary['test_sentences']:,} test sentences{why} | written: {model_dir}")
    return summary
