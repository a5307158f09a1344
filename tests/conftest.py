"""Test setup: without a CUDA device, Triton kernels run through Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is defined, hence before
gpusim is imported (DESIGN.md section 2).
"""

import os
import pathlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# Tests run many small tensor ops; one intra-op thread avoids thread wake-up overhead that
# dominates them on a 2-core machine (and keeps parallel test processes from oversubscribing).
torch.set_num_threads(1)

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "womd_sample"


@pytest.fixture(scope="session")
def sample_dir() -> pathlib.Path:
    """Directory of the real WOMD scenarios shipped with the project."""
    return SAMPLE_DIR
