"""gpusim.backend.normalize_device and the launchers' argument check (gpusim/kernels/checks.py)."""

import pytest
import torch

from gpusim.backend import normalize_device
from gpusim.kernels.checks import check_tensors


def test_normalize_device_forms():
    assert normalize_device("cpu:0") == normalize_device(torch.device("cpu")) == torch.device("cpu")
    assert torch.device("cpu:0") != torch.device("cpu")  # why normalising is needed
    if torch.cuda.is_available():
        assert normalize_device("cuda") == normalize_device("cuda:0") == torch.zeros(1, device="cuda").device


def test_check_tensors_accepts_unnormalised_device_and_names_errors():
    x = torch.zeros(2, 3)
    check_tensors("f", [(x, (2, 3), torch.float32, "x")], torch.device("cpu:0"))
    with pytest.raises(ValueError, match=r"f: x has shape \(2, 3\), expected \(3, 2\)"):
        check_tensors("f", [(x, (3, 2), torch.float32, "x")], "cpu")
    with pytest.raises(ValueError, match="f: x has dtype torch.float32, expected torch.int32"):
        check_tensors("f", [(x, (2, 3), torch.int32, "x")], "cpu")
    with pytest.raises(ValueError, match="f: x must be contiguous"):
        check_tensors("f", [(x.t(), (3, 2), torch.float32, "x")], "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="f: x is on cpu, expected meta"):
            check_tensors("f", [(x, (2, 3), torch.float32, "x")], "meta")
