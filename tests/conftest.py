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


@pytest.fixture(autouse=True)
def _restore_threads():
    """Every test leaves torch's intra-op thread count as it found it (the trainer and the
    evaluator set it from ``--num-threads``)."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tracked_files() -> list[str]:
    """Paths (relative to the repository root, POSIX) of the files git tracks (``git ls-files``).

    Skips the test when there is no list to check: no ``git`` executable, or a tree that is not a
    git checkout (an unpacked sdist).
    """
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed: no list of tracked files")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.decode(errors='replace').strip()}")
    return [p for p in proc.stdout.decode().split("\0") if p]


@pytest.fixture(scope="session")
def sample_dir() -> pathlib.Path:
    """Directory of the real WOMD scenarios shipped with the project."""
    return SAMPLE_DIR


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Device of the Triton side of tests (``synthetic.KERNEL_DEVICE``): cuda with a GPU, else cpu."""
    return KERNEL_DEVICE
