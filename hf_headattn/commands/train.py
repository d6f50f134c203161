"""`hf-headattn-train`: moved here from hf_headattn.training (in progress)."""

from ..training import main

if __name__ == "__main__":
    main()
