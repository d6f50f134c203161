"""`evaluate` module folder: `evaluate.load(<this folder>)` or `hf_headattn.metrics.load_metric("bleu_by_length")`."""
