"""`hf-headattn-average`: moved here from hf_headattn.averaging (in progress)."""

from ..averaging import main

if __name__ == "__main__":
    main()
