"""`hf-headattn-plot`: moved here from hf_headattn.plotting (in progress)."""

from ..plotting import main

if __name__ == "__main__":
    main()
