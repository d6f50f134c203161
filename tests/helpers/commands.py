"""The console commands and what each one's --help must show."""

from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS

# console script -> (module it runs, words its --help must show besides the defaults and the examples)
COMMANDS = {
    "hf-headattn-train": ("hf_headattn.commands.train", ["--cross_attention", *ATTENTION_VARIANTS]),
    "hf-headattn-evaluate": ("hf_headattn.commands.evaluate", ["--num_beams", "--json", "(default: 4)"]),
    "hf-headattn-translate": ("hf_headattn.commands.translate", ["--num_beams", "--nbest", "--alignments", "jsonl", "|||"]),
    "hf-headattn-average": ("hf_headattn.commands.average", ["--last", "--checkpoints", "--output_dir"]),
    "hf-headattn-export": ("hf_headattn.commands.export", ["--format", "ctranslate2", "--quantization", "int8", "to_marian"]),
    "hf-headattn-plot": ("hf_headattn.commands.plot", ["attention-map", "head-importances", "bleu-by-length"]),
    "hf-headattn-hub": ("hf_headattn.commands.hub", ["card", "push", "space"]),
    "hf-headattn-demo": ("hf_headattn.commands.demo", ["(default: runs/demo)", "csparsemax", "dhicm", "multihop"]),
    "hf-headattn-app": ("hf_headattn.commands.app", ["--model", "--port", "--time_limit", "side by side", "(default: 7860)"]),
}
