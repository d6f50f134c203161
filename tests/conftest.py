import os
import tempfile

import pytest
import torch

# Tests must never reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Nor write DROP's aligner cache into the home folder: one fresh cache per test session.
os.environ.setdefault("HF_HEADATTN_CACHE", tempfile.mkdtemp(prefix="hf_headattn_test_cache_"))
# Without CUDA, Triton's kernels run only in its interpreter, which triton reads as it is imported (Transformers
# imports it with the models): set before any test imports it (tests/test_triton_kernels.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The test models are tiny: one torch thread is as fast, and spares the suite from OpenMP threads
    spin-waiting when other processes share the cores (two threads made test files 5x slower on a loaded 2-core
    machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def one_thread_each_test():
    """Back to one thread before every test: a test that runs an example's main with --threads leaves torch at that
    count, and some results depend on it (the demo's toy model reaches BLEU 99 with one thread and 83.6 with two
    on an Intel Xeon, one hypothesis looping)."""
    torch.set_num_threads(1)
