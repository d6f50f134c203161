#!/usr/bin/env python
"""Train a HeadAttn translation model with Seq2SeqTrainer; see `--help` (or hf_headattn/training.py) for usage."""

from hf_headattn.training import main


if __name__ == "__main__":
    main()
