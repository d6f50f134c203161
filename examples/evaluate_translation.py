#!/usr/bin/env python
r"""Evaluate a saved model folder (either family) on a test set: a hypotheses file and a JSON of BLEU, chrF, TER,
REP, DROP and BLEU by length; the same command as `hf-headattn-evaluate` and `python -m hf_headattn.evaluation`
(see `--help`).

    python examples/evaluate_translation.py --model runs/de-en \
        --source ../shared/data/multi30k/test_2016_flickr.de --reference ../shared/data/multi30k/test_2016_flickr.en \
        --train_source ../shared/data/multi30k/train.de --train_target ../shared/data/multi30k/train.en \
        --output_dir runs/de-en/eval --num_beams 4 --device auto
"""

from hf_headattn.commands.evaluate import main


if __name__ == "__main__":
    main()
