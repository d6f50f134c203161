"""`hf-headattn-demo`: moved here from hf_headattn.demo (in progress)."""

from ..demo import main

if __name__ == "__main__":
    main()
