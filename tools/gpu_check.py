"""The GPU checks in one command (``make gpu-check``; not in CI): the ``gpu``-marked tests, the loader at
the host's cores against as many raw decoders side by side, and a ``bench_train --device cuda`` run at the
size of issue 24, in that order, then a short summary.

    python -m tools.gpu_check                                  # all three: about 10 min on an H200
    python -m tools.gpu_check --out gpu-check --budget-s 540   # keep every file; stop each step in time
    python -m tools.gpu_check --skip-bench --skip-loader       # the tests only
    python -m tools.gpu_check --attention varlen,sdpa,flex     # the bench's packed mode under each
    python -m tools.gpu_check --smoke --skip-tests --out x     # every step's plumbing at toy sizes (the tests, CPU)

On a machine without a virtual environment (docs/guides/train.md#on-a-gpu) run it with ``python3`` and
``PYTHONPATH`` set to the checkout (and the wheels' folder). The summary of one H200 host's figures, in this
tool's present format: the tests, loader and one-pack bench from a run at commit 68a28bc (whose profile line
then read "GPU busy 49 ms", a double count since mended, and which also timed ``packed_sdpa``: 1.53x), the
two-pack bench from ``bench_train`` run alone with these arguments at 8957da3::

    torch 2.11.0+cu130, transformers 5.17.0, NVIDIA H200, 16 CPUs; varlen_attn: window_size
    gpu tests: 27 passed, 0 failed, 7 skipped (pytest -m 'gpu or cp' tests, 8 processes) in 133 s
    bench_train (varlen, NVIDIA H200, 1 x 4,096 tokens a step): packed 65,844 tokens/s, pad-to-longest 28,284: 2.28x;
      fill bound 2.86x (packed 99.4%, pad-to-longest 34.8%): 0.80 of it (goal >= 0.90); packed MFU 15.8%
    bench_train (varlen, NVIDIA H200, 2 x 4,096 tokens a step): packed 123,843 tokens/s, pad-to-longest 30,691: 4.00x;
      fill bound 3.54x (packed 99.4%, pad-to-longest 28.1%): 1.13 of it (goal >= 0.90); packed MFU 29.7%
      a packed step: 67 ms, the GPU busy 48 ms of it, the host's own CPU 70 ms (profiled); the host waits on
      the GPU 4.3 times a step (profile.txt)
    loader, 16 workers: float32 85.5%, uint8 90.1% of 16 raw decoders side by side (goal >= 90%)
      uint8, 16 workers, CPU per image: decoding 2.56 ms (raw decoders 2.63 ms, x0.97), the workers' own
      0.22 ms, the main process 0.05 ms; workers busy 86%; decoding's wall/CPU 1.01 (raw 1.00)

One pack of 4,096 tokens a step leaves this 395M-parameter model's H200 steps paced by the host: the GPU
was busy 25 ms of a 54 ms step while the host launched about 1,370 kernels, so a step cost the same
whatever its tokens. Two packs a step (:data:`BENCH_ARGS`) give the GPU the work to set the pace.
There the tests took 133 s, the loader about 2 min at 20,000 samples, and the two-pack bench 63 s to prepare,
56 s for its untimed pass and 37 s a round (three modes; ``packed_sdpa`` adds about a third, and
``packed_target_logits``, not yet run on a GPU, about as much as ``packed``).

Every step writes into ``--out`` as it goes (``gpu-tests.xml``, ``gpu-check.log``, ``bench_train.json``,
``profile.txt``, ``bench_loader.json``, ``summary.json``: six files), so what a step finished survives a
later one running out of time. With ``--budget-s`` each step is stopped when the steps after it would
no longer get their share (:data:`SHARES`) of what is left.

Exit status: 0 when every test passed (skips allowed) and each step that ran finished in time, 1 otherwise,
2 without CUDA (but for ``--smoke``).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: bench_train's arguments at the size of issue 24 (``--attention`` and ``--rounds`` come from this tool's own),
#: two packs a step: at one, the host's kernel launches set the pace of this model's steps on an H100/H200;
#: the packed batches again with the LM head on the target positions only (``packed_target_logits``), and
#: through the decoder layers compiled once under CUDA graphs (``packed_compiled``, issue #41; for its goal at
#: one pack a step: ``--bench-args "--batch-size 1"``).
BENCH_ARGS = ("--device", "cuda", "--records", "2000", "--seq-len", "4096", "--hidden", "1024", "--layers", "8",
              "--batch-size", "2", "--target-logits", "--compile", "reduce-overhead")

#: ``--smoke``'s bench_train arguments, in place of :data:`BENCH_ARGS`: the steps' plumbing at the smallest sizes
#: (bench_train's ``--quick`` model on half its records: two packed steps, on the CPU), the packed modes as on a
#: GPU (the varlen kernel, its reference on a CPU, with target logits; ``--peak-tflops 1`` so MFU is figured),
#: one round, nothing compiled
#: (``tests/tools/test_bench_train.py``'s quick run checks the compiled mode, ``tests/models/test_compile.py`` the
#: compile itself).
SMOKE_BENCH_ARGS = ("--quick", "--records", "6", "--device", "cpu", "--target-logits", "--peak-tflops", "1")

#: ``--smoke``'s bench_loader sizes, in place of the options' defaults: one worker, one round, 120 samples (a few
#: batches after the worker's warm-up one).
SMOKE_LOADER = {"workers": 1, "loader_samples": 120, "loader_rounds": 1}

#: bench_loader's image pass at the host's cores: N warm workers (``balance="cost"``, bench_loader's default)
#: against N raw decoders side by side.
LOADER_ARGS = ("--only", "images", "--loaders", "wdspack")

#: packed / pad-to-longest must reach this share of the fill ratio, and the loader this share of the raw
#: decoders (issue 24).
GOAL = 0.9

#: The steps in the order they run: the bench last, since it keeps every round it finished when it is
#: stopped for time (the loader's passes are all or nothing).
STEPS = ("tests", "loader", "bench")

#: With ``--budget-s``: the share of the time left that a step may use when it starts, the steps after it
#: keeping the rest; the last step to run takes all that is left.
SHARES = {"tests": 0.35, "loader": 0.3}


class Log:
    """Lines to the console and to ``gpu-check.log`` in the output folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        with self.path.open("a") as f:
            f.write(text + "\n")


def run_step(cmd: list[str], env: dict[str, str], log: Log, timeout: float | None) -> tuple[int, float]:
    """Run ``cmd`` from the checkout, its output to the console and the log as it comes; ``(exit status,
    seconds)``. Past ``timeout`` the command's process group is killed and the status is ``124``."""
    log("$ " + " ".join(cmd))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)

    def copy() -> None:
        assert proc.stdout is not None
        with log.path.open("a") as f:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                f.write(line)
                f.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = 124
    reader.join(timeout=10)
    if code == 124:
        log(f"(stopped after {timeout:.0f} s: the step's share of --budget-s)")
    return code, time.monotonic() - t0


def environment() -> dict[str, Any]:
    """What this run is on: versions, the device, the CPUs, and what the kernels take."""
    import torch
    import transformers

    env: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": sys.version.split()[0], "cpus": os.cpu_count(),
                           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                           "flash_attn": importlib.util.find_spec("flash_attn") is not None,
                           "xdist": importlib.util.find_spec("xdist") is not None}
    try:
        from torch.nn.attention.varlen import varlen_attn

        env["varlen_attn"] = sorted(inspect.signature(varlen_attn).parameters)
    except ImportError:
        env["varlen_attn"] = None
    return env


def parse_junit(xml: Path, code: int) -> dict[str, int]:
    """The counts of a pytest JUnit XML (an error when there is none)."""
    if not xml.is_file():
        return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "exit": code}
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    total, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": total - failed - errors - skipped, "failed": failed, "errors": errors, "skipped": skipped,
            "exit": code}


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The closing summary (see the module docstring) of what :func:`main` gathered."""
    lines = []
    env = results.get("environment")
    if env:
        varlen = "none" if env["varlen_attn"] is None else ", ".join(
            p for p in env["varlen_attn"] if p in ("window_size", "enable_gqa")) or "no window_size"
        lines.append(f"torch {env['torch']}, transformers {env['transformers']}, {env['device'] or 'no CUDA device'}, "
                     f"{env['cpus']} CPUs; "
                     f"varlen_attn: {varlen}")
    tests = results.get("tests")
    if tests is not None:
        procs = tests.get("processes", 1)
        where = f", {procs} processes" if procs > 1 else ""
        lines.append(f"gpu tests: {tests['passed']} passed, {tests['failed'] + tests['errors']} failed, "
                     f"{tests['skipped']} skipped (pytest -m 'gpu or cp' tests{where})"
                     + (f" in {tests['seconds']:.0f} s" if "seconds" in tests else "")
                     + (" - STOPPED for time" if tests["exit"] == 124 else ""))
    if "bench" in results:
        lines += _bench_lines(results["bench"], results.get("attention", "varlen"))
    if "loader" in results:
        lines += _loader_lines(results["loader"])
    return lines


def _bench_lines(bench: dict | None, attention: str) -> list[str]:
    if bench is None:
        return ["bench_train: FAILED or stopped (its output is in gpu-check.log)"]
    modes, cfg = bench["modes"], bench["config"]
    packed, padded = modes["packed"], modes["pad_to_longest"]
    r, bound = bench["ratios"]["packed_vs_pad_to_longest"]["median"], bench["fill_bound"]
    mfu = "" if packed.get("mfu") is None else f"; packed MFU {packed['mfu']:.1%}"
    stopped = f", stopped for time after {bench['rounds_done']} round(s)" if bench.get("stopped") else ""
    sized = "batch_size" in cfg and "seq_len" in cfg
    step = f", {cfg['batch_size']} x {cfg['seq_len']:,} tokens a step" if sized else ""
    lines = [f"bench_train ({attention.split(',')[0]}, {cfg.get('device_name', cfg['device'])}{step}{stopped}): packed "
             f"{packed['tokens_per_s']:,.0f} tokens/s, pad-to-longest {padded['tokens_per_s']:,.0f}: {r:.2f}x;",
             f"  fill bound {bound:.2f}x (packed {packed['fill']:.1%}, pad-to-longest {padded['fill']:.1%}): "
             f"{r / bound:.2f} of it (goal >= {GOAL:.2f}){mfu}"]
    for name, other in bench["ratios"].items():
        mode = name.removesuffix("_vs_pad_to_longest")
        if mode != name and mode != "packed":
            over = bench["ratios"].get(f"{mode}_vs_packed")
            line = (f"  {mode}: {other['median']:.2f}x, {other['median'] / bound:.2f} of the fill bound"
                    + ("" if over is None else f"; {over['median']:.2f}x packed"))
            compiled = cfg.get("compile") or {}
            if mode == "packed_compiled" and "compile_seconds" in compiled:
                mfu = modes[mode].get("mfu")
                line += ((f"; MFU {mfu:.1%}" if mfu is not None else "")
                         + f"; compiled in {compiled['compile_seconds']:.0f} s ({compiled['mode']}), "
                         f"{bench.get('recompiles_after_first_step', '?')} recompiles after its first step")
            lines.append(line)
    prof = cfg.get("profile")
    if prof and prof.get("step_wall_ms"):
        host = f", the host's own CPU {prof['host_cpu_ms']:.0f} ms (profiled)" if "host_cpu_ms" in prof else ""
        lines.append(f"  a packed step: {prof['step_wall_ms']:.0f} ms, the GPU busy {prof['gpu_busy_ms']:.0f} ms of "
                     f"it{host}; the host waits on the GPU {prof['host_waits_per_step']:g} times a step (profile.txt)")
    return lines


def _loader_lines(loader: dict | None) -> list[str]:
    if loader is None:
        return ["bench_loader: FAILED or stopped (its output is in gpu-check.log)"]
    rows = {r["loader"]: r for r in loader["results"] if r["loader"].startswith("summary ")}
    n = loader["args"]["workers"]
    shares = ", ".join(f"{d} {rows[f'summary {d}']['of_raw_n_median']:.1%}" for d in ("float32", "uint8")
                       if f"summary {d}" in rows)
    split = rows.get("summary uint8", {}).get("cpu_split")  # where the CPU went (bench_loader's decode clock)
    return [f"loader, {n} workers: {shares} of {n} raw decoders side by side (goal >= {GOAL:.0%})",
            *([f"  {split}"] if split else [])]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the interpreter for pytest and the benches")
    ap.add_argument("--attention", default="varlen,sdpa",
                    help="bench_train's packed attention; more, comma-separated, add modes (default varlen,sdpa)")
    ap.add_argument("--rounds", type=int, default=3, help="bench_train's rounds (default 3)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="bench_loader's workers and raw decoders (default: the host's CPUs)")
    ap.add_argument("--loader-samples", type=int, default=20000, help="bench_loader's image-bearing samples")
    ap.add_argument("--loader-rounds", type=int, default=3, help="bench_loader's rounds (default 3)")
    ap.add_argument("--test-processes", type=int, default=min(8, max(1, (os.cpu_count() or 1) // 2)),
                    help="pytest-xdist processes for the tests where it is installed (default: half the CPUs, <= 8)")
    ap.add_argument("--smoke", action="store_true",
                    help="each step's plumbing at toy sizes, the bench on the CPU (SMOKE_BENCH_ARGS, SMOKE_LOADER); "
                         "needs no CUDA")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-loader", action="store_true")
    ap.add_argument("--budget-s", type=float, help="stop each step in time for the later ones (see SHARES)")
    ap.add_argument("--bench-args", default="", help="more bench_train arguments, one string (e.g. '--profile x')")
    ap.add_argument("--pytest-args", default="", help="more pytest arguments, one string (e.g. '-x')")
    ap.add_argument("--out", help="keep the files here (default: a temporary folder)")
    ap.add_argument("--json", help="also write the summary record here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print(f"gpu-check needs a CUDA device; torch {torch.__version__} sees none here. Run it on a GPU machine "
              "(docs/guides/train.md#on-a-gpu).", file=sys.stderr)
        return 2
    env = step_env()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = run_all(args, env, out, Log(out / "gpu-check.log"))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if passed(results) else 1


def passed(results: dict[str, Any]) -> bool:
    """Every test passed (skips allowed) and each bench that ran finished in time."""
    tests = results.get("tests")
    if tests is not None and (tests["failed"] + tests["errors"] or tests["exit"] not in (0, 5)):
        return False
    return all(results[s] is not None and not results[s].get("stopped") for s in ("bench", "loader") if s in results)


def step_env() -> dict[str, str]:
    """The steps' environment: offline, this checkout first on ``PYTHONPATH``, output unbuffered."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def bench_args(step: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The bench tool and its arguments for ``step`` (``bench`` or ``loader``)."""
    smoke = args.smoke
    if step == "bench":
        return ["-m", "tools.bench_train", *(SMOKE_BENCH_ARGS if smoke else BENCH_ARGS), "--attention", args.attention,
                "--rounds", str(1 if smoke else args.rounds), "--profile", str(out / "profile.txt"),
                *args.bench_args.split()]
    sizes = SMOKE_LOADER if smoke else {k: getattr(args, k) for k in SMOKE_LOADER}
    return ["-m", "tools.bench_loader", *LOADER_ARGS, "--rounds", str(sizes["loader_rounds"]), "--workers",
            str(sizes["workers"]), "--samples", str(sizes["loader_samples"])]


def step_limit(step: str, steps: list[str], budget_s: float | None, elapsed_s: float) -> float | None:
    """Seconds ``step`` may run: its share (:data:`SHARES`) of what is left of the budget, all of it for the
    last step to run, never under 30 s; ``None`` without a budget."""
    if budget_s is None:
        return None
    share = 1.0 if step == steps[-1] else SHARES[step]
    return max(30.0, (budget_s - elapsed_s) * share)


def run_all(args: argparse.Namespace, env: dict[str, str], out: Path, log: Log) -> dict[str, Any]:
    """The steps in turn, the summary rewritten after each (``summary.json``)."""
    start = time.monotonic()
    results: dict[str, Any] = {"environment": environment(), "attention": args.attention}
    steps = [s for s in STEPS if not getattr(args, f"skip_{s}")]

    def limit(step: str) -> float | None:
        return step_limit(step, steps, args.budget_s, time.monotonic() - start)

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")

    save()
    log(summary_lines(results)[0])
    for step in steps:
        if step == "tests":
            xml = out / "gpu-tests.xml"
            procs = args.test_processes if results["environment"]["xdist"] else 1
            # -v: each test's verdict is in the log as it ends, so a run stopped for time still tells them
            # the gpu-marked tests and the CP ones (tests/train/test_cp*.py marked ``cp``: the split, both attention
            # paths, the torchrun recipe over gloo; their CUDA varlen check is gpu-marked)
            cmd = [args.python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu or cp", "tests", "-rfEs",
                   f"--junitxml={xml}", *(["-n", str(procs)] if procs > 1 else []), *args.pytest_args.split()]
            code, seconds = run_step(cmd, env, log, limit(step))
            results["tests"] = {**parse_junit(xml, code), "processes": procs, "seconds": round(seconds, 1)}
        else:
            path = out / f"bench_{'train' if step == 'bench' else 'loader'}.json"
            code, _ = run_step([args.python, *bench_args(step, args, out), "--json", str(path)], env, log, limit(step))
            # bench_train writes its record after every round: one stopped for time keeps the rounds it finished
            kept = code == 0 or (code == 124 and step == "bench")
            results[step] = json.loads(path.read_text()) if kept and path.is_file() else None
            if code == 124 and results[step] is not None:
                results[step]["stopped"] = True
        save()
    log("\n== gpu-check summary ==")
    for line in summary_lines(results):
        log(line)
    return results


if __name__ == "__main__":
    sys.exit(main())
