"""Test setup: without a CUDA device, Triton kernels run through Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is defined, hence before
gpusim is imported (docs/design.md section 3). With a GPU, tests that force the Triton backend run it on
CUDA tensors: ``synthetic.KERNEL_DEVICE`` (also the ``kernel_device`` fixture) names that device.
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

from synthetic import KERNEL_DEVICE  # noqa: E402  (tests/ is on sys.path for conftest and tests)

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "womd_sample"


@pytest.fixture(scope="session")
def sample_dir() -> pathlib.Path:
    """Directory of the real WOMD scenarios shipped with the project."""
    return SAMPLE_DIR


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Device of the Triton side of tests (``synthetic.KERNEL_DEVICE``): cuda with a GPU, else cpu."""
    return KERNEL_DEVICE
