"""tools/bench_train.py: the on-the-fly planner's invariants, and a ``--quick`` run end to end.

The run trains the same samples three ways (packed loader, pad-to-longest through the processor,
on-the-fly packing); with fixed weights all three must see the same real tokens, the same
targets and the same summed loss, whatever the timings.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import ROOT
from tests.support.benches import check_bench_train_record


@functools.cache
def _tool():
    return importlib.import_module("tools.bench_train")


@pytest.mark.parametrize("open_rows", [1, 2, 5])
def test_on_the_fly_plan_keeps_every_item_once_within_budgets(open_rows):
    rng = np.random.default_rng(open_rows)
    tokens = rng.integers(1, 300, 400).tolist()
    images = rng.integers(0, 3, 400).tolist()
    plan = _tool().plan_on_the_fly(tokens, images, seq_len=512, max_images=4, open_rows=open_rows)
    assert sorted(i for row in plan for i in row) == list(range(400))
    assert all(sum(tokens[i] for i in row) <= 512 and sum(images[i] for i in row) <= 4 for row in plan)
    assert all(row == sorted(row) for row in plan), "arrival order kept within a row"


def test_on_the_fly_plan_next_fit_and_first_fit():
    plan = _tool().plan_on_the_fly
    assert plan([6, 5, 3, 4], [0, 0, 0, 0], seq_len=10, max_images=1, open_rows=1) == [[0], [1, 2], [3]]
    assert plan([6, 5, 3, 4], [0, 0, 0, 0], seq_len=10, max_images=1, open_rows=2) == [[0, 2], [1, 3]]
    assert plan([2, 2, 2], [1, 1, 0], seq_len=10, max_images=1, open_rows=1) == [[0], [1, 2]]


def test_peak_and_mfu_figures():
    import torch

    tool = _tool()
    assert tool.default_peak(torch.device("cpu")) is None
    assert next(peak for key, peak in tool.PEAK_TFLOPS if key in "NVIDIA H100 80GB HBM3") == 989.0


def test_warm_up_passes_run_every_step_untimed():
    """One step of every mode, then ``warmup_passes`` whole passes, then the timed rounds; ``warm`` runs
    between (the profile: steady state), and the rounds hold only their own steps' losses."""
    import dataclasses

    import torch

    tool = _tool()
    calls: list[str] = []

    class Model(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name, self.w = name, torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            calls.append(self.name)
            return type("Out", (), {"loss": self.w * x})()

    def step(x):
        fields = {f.name: 1 for f in dataclasses.fields(tool.Step)}
        return tool.Step(**{**fields, "kwargs": {"x": torch.tensor(float(x))}, "targets": 2})

    modes = {"a": (Model("a"), [step(1), step(2), step(3)]), "b": (Model("b"), [step(5)])}
    marks: list[int] = []
    out = tool.run_rounds(modes, rounds=2, sync=False, warmup_passes=1, warm=lambda: marks.append(len(calls)))
    assert calls.count("a") == 1 + 3 * 3 and calls.count("b") == 1 + 1 * 3
    assert marks == [2 + 4], "warm runs after the first steps and the warm-up pass, before the rounds"
    assert out["a"]["loss_sum"] == [12.0, 12.0] and out["b"]["loss_sum"] == [10.0, 10.0]
    assert len(out["a"]["seconds"]) == 2


def test_profile_heads_its_tables_with_where_a_step_goes(tmp_path):
    """The profile: a step's unprofiled wall, the GPU's busy time (none on a CPU) and the host's waits for it,
    then a table by device time and one by the host's own time."""
    import dataclasses

    import torch

    tool = _tool()
    model = torch.nn.Linear(64, 64)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return type("Out", (), {"loss": self.inner(x).square().mean()})()

    fields = {f.name: 1 for f in dataclasses.fields(tool.Step)}
    steps = [tool.Step(**{**fields, "kwargs": {"x": torch.randn(256, 64)}}) for _ in range(4)]
    figures = tool.profile_packed(Model(), steps, tmp_path / "profile.txt", sync=False)
    assert figures["step_wall_ms"] > 0 and figures["gpu_busy_ms"] == 0 and figures["host_waits_per_step"] == 0
    assert figures["host_cpu_ms"] > 0 and figures["kernel_launches_per_step"] == 0
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith(f"packed step: {figures['step_wall_ms']:.1f} ms wall (unprofiled), GPU busy 0.0 ms")
    by_device, by_host = text.split("by device time:")[1].split("by the host's own time:")
    assert "aten::addmm" in by_device and "aten::addmm" in by_host


def test_gpu_busy_counts_the_kernels_once_and_waits_count_synchronisations():
    """An operator's row carries its kernels' device time again: the GPU's busy time is the device rows
    alone. A ``cudaMemcpyAsync`` is no wait (``.item()`` waits in the ``cudaStreamSynchronize`` after it)."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    tool = _tool()

    def row(key, device_type, device_us, count=1):
        return NS(key=key, device_type=device_type, self_device_time_total=device_us, count=count)

    events = [row("aten::mm", DeviceType.CPU, 470.0, 10), row("nvjet_sm90_tst_256x128", DeviceType.CUDA, 470.0, 10),
              row("aten::copy_", DeviceType.CPU, 30.0, 2), row("Memcpy HtoD", DeviceType.CUDA, 30.0),
              row("cudaMemcpyAsync", DeviceType.CPU, 0.0, 34), row("cudaStreamSynchronize", DeviceType.CPU, 0.0, 6),
              row("cudaDeviceSynchronize", DeviceType.CPU, 0.0, 3), row("cudaMemcpy", DeviceType.CPU, 0.0, 1)]
    assert tool.gpu_busy_us(events) == 500.0
    assert tool.host_waits(events) == 10


def test_target_logits_need_one_row_batches():
    with pytest.raises(SystemExit, match=r"one-row batches.*not 2 rows under sdpa"):
        _tool().main(["--quick", "--target-logits", "--attention", "sdpa"])


@pytest.mark.slow
def test_cp_figures_split_each_step_as_cp_layout_does():
    """Two packs of ``seq_len`` 16, one a step: the tokens each of 2 CP ranks holds and the padding, by hand."""
    from wdspack.format.pack import Pack

    packs = [Pack(np.arange(13), np.ones(13), (5, 8), ("a", "b")), Pack(np.arange(16), np.ones(16), (16,), ("c",))]
    f = _tool().cp_figures(packs, seq_len=16, batch_size=1, cp=2)
    # pack 0: 5 → 8, 8, tail 3 → 4: 20 padded, 10 a rank; pack 1: 16, 8 a rank
    assert f["steps"] == 2 and f["padding_tokens"] == 4 and f["padding_share"] == round(4 / 36, 4)
    assert f["rank_tokens"] == {"max": 10, "mean": 9.0}
    planned = _tool().cp_figures(packs[1:], seq_len=16, batch_size=1, cp=2, planned=True)
    assert planned["padding_tokens"] == 0 and planned["rank_real_tokens"] == {"max": 8, "mean": 8.0}


@pytest.mark.slow
def test_quick_run_trains_the_same_tokens_three_ways(tmp_path):
    """SDPA, the CPU's default, and ``--compile`` (the decoder layers compiled once; ``aot_eager``, which
    decides graphs and recompiles as Inductor does, without its minute of code generation here); the varlen
    kernel (the reference kernel on a CPU, padding-free batches) with target logits is gpu_check's
    configuration, checked the same way by its whole run on a CPU (tests/tools/test_gpu_check.py). Half the
    quick run's records: two packed steps, the compiled mode's first step and one after it."""
    out = tmp_path / "bench_train.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "tools.bench_train", "--quick", "--records", "6", "--json", str(out),
                           "--attention", "sdpa", "--compile", "--compile-backend", "aot_eager", "--cp", "2"],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    check_bench_train_record(record, "sdpa")
    assert "packed_compiled" in record["modes"] and record["config"]["compile"]["backend"] == "aot_eager"
    cp = record["config"]["cp"]  # the same data packed with --cp 2: no padding left for the load
    assert cp["planned"]["padding_tokens"] == 0 and cp["planned"]["padding_in_plan"] > 0
    assert cp["load_time"]["padding_tokens"] > 0 and cp["load_time"]["steps"] == record["modes"]["packed"]["steps"]
