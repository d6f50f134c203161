"""Hugging Face `evaluate` metric modules shipped with hf_headattn; load them with `hf_headattn.metrics.load_metric`."""
