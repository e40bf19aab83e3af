"""Checks of a ``tools/bench_train.py`` record that hold at any size: shared by its own quick run
(``tests/tools/test_bench_train.py``, SDPA) and gpu_check's whole run on a CPU (``tests/tools/test_gpu_check.py``,
the varlen kernel, the packed SDPA and target-logits modes beside it), so one bench run proves each configuration.
"""

from __future__ import annotations

import pytest

__all__ = ["MODES", "check_bench_train_record"]

MODES = ("packed", "pad_to_longest", "on_the_fly")


def check_bench_train_record(res: dict, attention: str) -> None:
    """The same samples trained three ways see the same real tokens, targets and summed loss, whatever the
    timings; ``varlen`` runs came with ``--peak-tflops 1 --target-logits``."""
    modes = res["modes"]
    assert set(MODES) <= set(modes)
    packed = modes["packed"]
    assert packed["samples"] > 1 and packed["real_tokens"] > 0
    for name in MODES:
        m = modes[name]
        assert m["real_tokens"] == packed["real_tokens"], f"{name} trained other tokens than packed"
        assert m["samples"] == packed["samples"] and m["targets"] == packed["targets"] > 0
        assert m["loss_sum"] == pytest.approx(packed["loss_sum"], rel=1e-4), f"{name}: another loss, other work"
        assert m["tokens_per_s"] > 0 and m["samples_per_s"] > 0 and all(s > 0 for s in m["seconds"])
        assert 0 < m["fill"] <= 1 and m["computed_tokens"] >= m["real_tokens"]
        assert m["tokens_per_s"] == pytest.approx(m["real_tokens"] / min(m["seconds"]), rel=0.01)
    assert modes["pad_to_longest"]["fill"] < 1, "padding to the longest pads"
    if attention == "varlen":  # --target-logits: the same packed batches, the head on the targets only
        kept = modes["packed_target_logits"]
        assert (kept["real_tokens"], kept["targets"]) == (packed["real_tokens"], packed["targets"])
        assert kept["loss_sum"] == pytest.approx(packed["loss_sum"], rel=1e-5)
        assert "packed_target_logits_vs_packed" in res["ratios"] and res["config"]["target_logits"] is True
    if "packed_compiled" in modes:  # --compile: the same batches through the compiled layers, compiled once
        compiled = modes["packed_compiled"]
        assert (compiled["real_tokens"], compiled["targets"]) == (packed["real_tokens"], packed["targets"])
        assert compiled["loss_sum"] == pytest.approx(packed["loss_sum"], rel=1e-4)
        # compiled in its first step and never again; the compile's seconds (that step less an eager one) are a
        # difference of two noisy timings, near 0 for a tiny model under aot_eager (CI once printed
        # "compiled in -0.0 s")
        timed = res["config"]["compile"]
        assert res["recompiles_after_first_step"] == 0 and timed["graphs_after_first_step"] > 0
        assert timed["first_step_seconds"] > 0 and isinstance(timed["compile_seconds"], float)
        assert "packed_compiled_vs_packed" in res["ratios"]
    assert res["config"]["attention"].startswith(attention)
    assert res["fill_bound"] == pytest.approx(packed["fill"] / modes["pad_to_longest"]["fill"], rel=1e-3)
    params = res["config"]["model"]["params"]
    for m in modes.values():
        if attention == "varlen":  # --peak-tflops 1: 6 · N · tokens / seconds / 1e12
            assert m["mfu"] == pytest.approx(6 * params * m["real_tokens"] / min(m["seconds"]) / 1e12, rel=0.01)
        else:
            assert m["mfu"] is None, "no peak known for a CPU"
    for r in res["ratios"].values():
        assert 0.1 < r["min"] <= r["median"] <= r["max"] < 10
    assert res["config"]["model"]["class"] == "Qwen2_5_VLForConditionalGeneration"
    assert res["config"]["model"]["vocab"] % 128 == 0 and res["config"]["warmup_passes"] == 0, "aligned; no pass on CPU"
