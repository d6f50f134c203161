import os

# Tests must never reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
