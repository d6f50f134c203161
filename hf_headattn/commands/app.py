"""`hf-headattn-app`: moved here from hf_headattn.app (in progress)."""

from ..app import main

if __name__ == "__main__":
    main()
