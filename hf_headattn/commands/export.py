"""`hf-headattn-export`: moved here from hf_headattn.export (in progress)."""

from ..export import main

if __name__ == "__main__":
    main()
