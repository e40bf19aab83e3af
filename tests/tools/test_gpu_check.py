"""tools/gpu_check.py: the summary from the steps' records, the steps' plumbing (JUnit counts of a real
pytest run, output kept in the log, a step stopped at its share of the budget), and the refusal without CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from tests.support.benches import check_bench_train_record


def _tool():
    return importlib.import_module("tools.gpu_check")


BENCH = {"config": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
         "modes": {"packed": {"tokens_per_s": 60000.0, "fill": 0.994, "mfu": 0.18},
                   "pad_to_longest": {"tokens_per_s": 21000.0, "fill": 0.348, "mfu": 0.06}},
         "ratios": {"packed_vs_pad_to_longest": {"median": 2.6}, "packed_vs_on_the_fly": {"median": 1.1},
                    "packed_sdpa_vs_pad_to_longest": {"median": 1.82}},
         "fill_bound": 2.856}
LOADER = {"args": {"workers": 16},
          "results": [{"loader": "wdspack float32", "of_raw_n": 0.8},
                      {"loader": "summary float32", "of_raw_n_median": 0.85},
                      {"loader": "summary uint8", "of_raw_n_median": 0.93, "cpu_split": "uint8, 16 workers, CPU"}]}
ENV = {"torch": "2.11.0+cu130", "transformers": "5.17.0", "device": "NVIDIA H100 80GB HBM3", "cpus": 16,
       "varlen_attn": ["cu_seq_k", "scale", "window_size"]}


def test_summary_names_counts_ratios_shares_and_the_loader():
    tests = {"passed": 30, "failed": 1, "errors": 1, "skipped": 4, "exit": 1, "processes": 8, "seconds": 95.2}
    lines = _tool().summary_lines({"environment": ENV, "tests": tests, "bench": BENCH, "loader": LOADER,
                                   "attention": "varlen,sdpa"})
    assert lines[0] == ("torch 2.11.0+cu130, transformers 5.17.0, NVIDIA H100 80GB HBM3, 16 CPUs; "
                        "varlen_attn: window_size")
    assert lines[1] == "gpu tests: 30 passed, 2 failed, 4 skipped (pytest -m 'gpu or cp' tests, 8 processes) in 95 s"
    assert "(varlen, NVIDIA H100" in lines[2] and "packed 60,000 tokens/s, pad-to-longest 21,000: 2.60x" in lines[2]
    assert "fill bound 2.86x" in lines[3] and "0.91 of it (goal >= 0.90)" in lines[3] and "MFU 18.0%" in lines[3]
    assert lines[4] == "  packed_sdpa: 1.82x, 0.64 of the fill bound"
    assert lines[5] == "loader, 16 workers: float32 85.0%, uint8 93.0% of 16 raw decoders side by side (goal >= 90%)"
    assert lines[6] == "  uint8, 16 workers, CPU", "where the uint8 workers' CPU went"
    assert len(lines) == 7
    compiled = {**BENCH, "modes": {**BENCH["modes"], "packed_compiled": {"tokens_per_s": 66000.0, "mfu": 0.198}},
                "ratios": {**BENCH["ratios"], "packed_compiled_vs_pad_to_longest": {"median": 3.14},
                           "packed_compiled_vs_packed": {"median": 1.1}},
                "config": {**BENCH["config"], "compile": {"mode": "reduce-overhead", "compile_seconds": 41.6}},
                "recompiles_after_first_step": 0}
    assert _tool().summary_lines({"bench": compiled})[3] == (
        "  packed_compiled: 3.14x, 1.10 of the fill bound; 1.10x packed; MFU 19.8%; compiled in 42 s "
        "(reduce-overhead), 0 recompiles after its first step")
    profiled = {**BENCH, "config": {**BENCH["config"], "profile": {"step_wall_ms": 184.2, "gpu_busy_ms": 61.4,
                                                                     "host_waits_per_step": 2.0}}}
    lines = _tool().summary_lines({"bench": profiled, "attention": "varlen,sdpa"})
    assert lines[-1] == "  a packed step: 184 ms, the GPU busy 61 ms of it; the host waits on the GPU 2 times a step " \
                        "(profile.txt)"
    profiled["config"]["profile"]["host_cpu_ms"] = 170.4
    lines = _tool().summary_lines({"bench": profiled, "attention": "varlen,sdpa"})
    assert lines[-1] == ("  a packed step: 184 ms, the GPU busy 61 ms of it, the host's own CPU 170 ms (profiled); "
                         "the host waits on the GPU 2 times a step (profile.txt)")


def test_summary_of_failed_stopped_and_skipped_steps():
    tool = _tool()
    stopped = {"passed": 3, "failed": 0, "errors": 0, "skipped": 0, "exit": 124}
    assert tool.summary_lines({"tests": stopped})[0].endswith("- STOPPED for time")
    assert tool.summary_lines({"bench": None, "loader": None}) == [
        "bench_train: FAILED or stopped (its output is in gpu-check.log)",
        "bench_loader: FAILED or stopped (its output is in gpu-check.log)"]
    assert tool.summary_lines({}) == []
    sized = {**BENCH, "config": {**BENCH["config"], "batch_size": 2, "seq_len": 4096}}
    assert "(varlen, NVIDIA H100 80GB HBM3, 2 x 4,096 tokens a step): packed 60,000" in tool.summary_lines(
        {"bench": sized})[0]
    partial = tool.summary_lines({"bench": {**BENCH, "stopped": True, "rounds_done": 1}})
    assert "(varlen, NVIDIA H100 80GB HBM3, stopped for time after 1 round(s)): packed 60,000" in partial[0]
    assert tool.summary_lines({"environment": {**ENV, "varlen_attn": None}})[0].endswith("varlen_attn: none")


def test_exit_status_needs_every_test_passed_and_each_bench_finished_in_time():
    ok = _tool().passed
    green = {"passed": 31, "failed": 0, "errors": 0, "skipped": 0, "exit": 0}
    assert ok({"tests": green, "bench": BENCH, "loader": LOADER}) and ok({}) and ok({"bench": BENCH})
    assert ok({"tests": {**green, "exit": 5}}), "no gpu test selected is no failure"
    assert not ok({"tests": {**green, "failed": 1, "exit": 1}})
    assert not ok({"tests": {**green, "exit": 124}}), "stopped for time"
    assert not ok({"tests": green, "bench": None})
    assert not ok({"bench": {**BENCH, "stopped": True, "rounds_done": 1}}), "a partial bench is reported, not passed"


def test_junit_counts_of_a_real_pytest_run(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "import pytest\n\ndef test_ok():\n    assert 1\n\ndef test_bad():\n    assert 0\n\n"
        "@pytest.mark.skip(reason='x')\ndef test_skipped():\n    pass\n")
    tool, xml = _tool(), tmp_path / "out.xml"
    log = tool.Log(tmp_path / "log.txt")
    code, seconds = tool.run_step([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
                                   f"--junitxml={xml}"], dict(os.environ), log, timeout=120)
    assert code == 1 and seconds > 0
    assert tool.parse_junit(xml, code) == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1, "exit": 1}
    assert "1 failed, 1 passed, 1 skipped" in (tmp_path / "log.txt").read_text(), "the step's output is in the log"
    assert tool.parse_junit(tmp_path / "none.xml", 4)["errors"] == 1, "no XML: counted as an error"


def test_a_step_past_its_time_is_stopped(tmp_path):
    tool = _tool()
    log = tool.Log(tmp_path / "log.txt")
    code, seconds = tool.run_step([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                                  dict(os.environ), log, timeout=2)
    assert code == 124 and seconds < 30
    text = (tmp_path / "log.txt").read_text()
    assert "started" in text and "stopped after 2 s" in text


def test_each_step_gets_its_share_of_the_budget_and_the_last_all_that_is_left():
    limit = _tool().step_limit
    steps = list(_tool().STEPS)
    assert steps == ["tests", "loader", "bench"], "the bench last: it keeps its finished rounds when stopped"
    assert limit("tests", steps, None, 0.0) is None
    assert limit("tests", steps, 540, 0.0) == pytest.approx(0.35 * 540)
    assert limit("loader", steps, 540, 140.0) == pytest.approx(0.3 * 400)
    assert limit("bench", steps, 540, 260.0) == pytest.approx(280.0), "bench is last: all of it"
    assert limit("loader", ["tests", "loader"], 540, 140.0) == pytest.approx(400.0), "last: all of it"
    assert limit("loader", steps, 540, 530.0) == 30.0, "never under 30 s"


def test_environment_reads_versions_and_the_kernel_signature():
    import torch

    env = _tool().environment()
    assert env["torch"] == torch.__version__ and env["cpus"] == os.cpu_count()
    assert env["varlen_attn"] is None or "window_size" in env["varlen_attn"]


def test_refuses_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _tool().main(["--skip-bench"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_a_whole_run_on_cpu_keeps_each_steps_files_and_sums_them_up(tmp_path):
    """run_all's bench and loader steps for real at ``--smoke`` sizes on this CPU (the reference varlen kernel);
    the compiled mode's record is bench_train's own quick run's, its summary line the first test's."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the run would be the real one")
    tool = _tool()
    args = tool.parser().parse_args(["--smoke", "--skip-tests", "--out", str(tmp_path)])
    assert tool.bench_args("loader", args, tmp_path)[-4:] == ["--workers", "1", "--samples", "120"]
    results = tool.run_all(args, tool.step_env(), tmp_path, tool.Log(tmp_path / "gpu-check.log"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_loader.json", "bench_train.json", "gpu-check.log",
                                                        "profile.txt", "summary.json"]
    bench, loader = results["bench"], results["loader"]
    assert bench["config"]["attention"].startswith("varlen") and bench["config"]["other_attention"] == ["sdpa"]
    assert set(bench["modes"]) == {"packed", "pad_to_longest", "on_the_fly", "packed_sdpa", "packed_target_logits"}
    assert bench["rounds_done"] == 1 and "stopped" not in bench
    check_bench_train_record(bench, "varlen")  # bench_train's quick-run checks, for gpu_check's configuration
    assert bench["modes"]["packed_sdpa"]["real_tokens"] == bench["modes"]["packed"]["real_tokens"]
    assert bench["modes"]["packed_sdpa"]["loss_sum"] == pytest.approx(bench["modes"]["packed"]["loss_sum"], rel=1e-4)
    assert loader["args"]["workers"] == 1 and loader["args"]["rounds"] == 1
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(results))
    text = (tmp_path / "gpu-check.log").read_text()
    summary = text[text.index("== gpu-check summary =="):].splitlines()[1:]
    assert summary == tool.summary_lines(results) and len(summary) == 8, summary
    assert summary[0].startswith(f"torch {torch.__version__}, ") and "no CUDA device" in summary[0]
    assert summary[3].startswith("  packed_sdpa: ") and summary[6].startswith("loader, 1 workers: float32 ")
    assert summary[4].startswith("  packed_target_logits: ") and summary[4].endswith("x packed")
    assert summary[5].startswith("  a packed step: ") and "the GPU busy 0 ms" in summary[5]
    assert summary[7].startswith("  uint8, 1 workers, CPU per image: decoding ")
    assert bench["config"]["profile"]["step_wall_ms"] > 0
