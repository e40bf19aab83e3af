"""tools/gpu_check.py: the closing summary from a bench record and test counts, and the refusal without CUDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"


def _tool():
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_summary_names_counts_ratio_and_share_of_the_fill_bound():
    bench = {"config": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
             "modes": {"packed": {"tokens_per_s": 60000.0, "fill": 0.994, "mfu": 0.18},
                       "pad_to_longest": {"tokens_per_s": 21000.0, "fill": 0.348, "mfu": 0.06}},
             "ratios": {"packed_vs_pad_to_longest": {"median": 2.6}}, "fill_bound": 2.856}
    tests = {"passed": 30, "failed": 1, "errors": 1, "skipped": 4, "exit": 1}
    lines = _tool().summary_lines(tests, bench, attention="varlen")
    assert lines[0] == "gpu tests: 30 passed, 2 failed, 4 skipped (pytest -m gpu tests)"
    assert "NVIDIA H100" in lines[1] and "packed 60,000 tokens/s, pad-to-longest 21,000: 2.60x" in lines[1]
    assert "fill bound 2.86x" in lines[2] and "0.91 of it (goal >= 0.90)" in lines[2] and "MFU 18.0%" in lines[2]
    assert _tool().summary_lines(None, None, attention="varlen") == ["bench_train: FAILED (its output is above)"]
    assert _tool().summary_lines(None, None, attention="varlen", skipped_bench=True) == []


def test_refuses_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _tool().main(["--skip-bench"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
