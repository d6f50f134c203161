"""`hf-headattn-evaluate`: moved here from hf_headattn.evaluation (in progress)."""

from ..evaluation import main

if __name__ == "__main__":
    main()
