"""`hf-headattn-translate`: moved here from hf_headattn.translation (in progress)."""

from ..translation import main

if __name__ == "__main__":
    main()
