#!/usr/bin/env python
"""The training command (`hf-headattn-train`, `python -m hf_headattn.commands.train`) as a script; see `--help`."""

from hf_headattn.commands.train import main


if __name__ == "__main__":
    main()
