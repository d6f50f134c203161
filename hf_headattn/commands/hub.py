"""`hf-headattn-hub`: moved here from hf_headattn.hub (in progress)."""

from ..hub import main

if __name__ == "__main__":
    main()
