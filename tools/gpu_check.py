"""The GPU checks in one command (``make gpu-check``; not in CI): the ``gpu``-marked tests and a
``bench_train --device cuda`` run at the size of issue 24, then a short summary.

    python3 tools/gpu_check.py                         # both, ~12 min on one H100
    python3 tools/gpu_check.py --skip-bench            # the tests only (~4 min)
    python3 tools/gpu_check.py --attention sdpa        # the bench's packed run on SDPA instead of varlen

On a machine without a virtual environment (docs/guides/train.md#on-a-gpu) run it with ``python3`` and
``PYTHONPATH`` set to the checkout (and the wheels' folder). The summary, for example::

    gpu tests: 30 passed, 0 failed, 4 skipped (pytest -m gpu tests)
    bench_train (varlen, NVIDIA H100 80GB HBM3): packed 60,000 tokens/s, pad-to-longest 21,000: 2.86x;
      fill bound 2.86x (packed 99.4 %, pad-to-longest 34.8 %): 1.00 of it (goal >= 0.90); packed MFU 18.0 %

Exit status: 0 when every test passed (skips allowed) and the bench ran, 1 otherwise, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: bench_train's arguments at the size of issue 24 (``--attention`` is added from this tool's own).
BENCH_ARGS = ("--device", "cuda", "--records", "2000", "--seq-len", "4096", "--hidden", "1024", "--layers", "8",
              "--rounds", "3")

#: packed / pad-to-longest must reach this share of the fill ratio (issue 24).
GOAL = 0.9


def run_tests(python: str, env: dict[str, str], work: Path, extra: list[str]) -> dict[str, int]:
    """``pytest -m gpu tests -rA``; the counts from its JUnit XML."""
    xml = work / "gpu-tests.xml"
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests", "-rA",
           f"--junitxml={xml}", *extra]
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if not xml.is_file():
        return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "exit": code}
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    total, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": total - failed - errors - skipped, "failed": failed, "errors": errors, "skipped": skipped,
            "exit": code}


def run_bench(python: str, env: dict[str, str], work: Path, attention: str, extra: list[str]) -> dict | None:
    """``bench_train`` at the issue's size; its JSON record (``None`` when it failed)."""
    out = work / "bench_train.json"
    cmd = [python, str(ROOT / "tools" / "bench_train.py"), *BENCH_ARGS, "--attention", attention,
           "--json", str(out), *extra]
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.call(cmd, cwd=ROOT, env=env) != 0 or not out.is_file():
        return None
    return json.loads(out.read_text())


def summary_lines(tests: dict[str, int] | None, bench: dict | None, *, attention: str,
                  skipped_bench: bool = False) -> list[str]:
    """The closing summary (see the module docstring)."""
    lines = []
    if tests is not None:
        lines.append(f"gpu tests: {tests['passed']} passed, {tests['failed'] + tests['errors']} failed, "
                     f"{tests['skipped']} skipped (pytest -m gpu tests)")
    if bench is not None:
        modes, cfg = bench["modes"], bench["config"]
        packed, padded = modes["packed"], modes["pad_to_longest"]
        r, bound = bench["ratios"]["packed_vs_pad_to_longest"]["median"], bench["fill_bound"]
        mfu = "" if packed.get("mfu") is None else f"; packed MFU {packed['mfu']:.1%}"
        lines.append(f"bench_train ({attention}, {cfg.get('device_name', cfg['device'])}): packed "
                     f"{packed['tokens_per_s']:,.0f} tokens/s, pad-to-longest {padded['tokens_per_s']:,.0f}: {r:.2f}x;")
        lines.append(f"  fill bound {bound:.2f}x (packed {packed['fill']:.1%}, pad-to-longest {padded['fill']:.1%}): "
                     f"{r / bound:.2f} of it (goal >= {GOAL:.2f}){mfu}")
    elif not skipped_bench:
        lines.append("bench_train: FAILED (its output is above)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the interpreter for pytest and the bench")
    ap.add_argument("--attention", choices=("varlen", "sdpa", "flex"), default="varlen",
                    help="the bench's packed attention (default varlen)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--bench-args", default="", help="more bench_train arguments, one string (e.g. '--rounds 1')")
    ap.add_argument("--pytest-args", default="", help="more pytest arguments, one string (e.g. '-x')")
    ap.add_argument("--json", help="write the counts and the bench record here")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check needs a CUDA device; torch {torch.__version__} sees none here. Run it on a GPU machine "
              "(docs/guides/train.md#on-a-gpu).", file=sys.stderr)
        return 2
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        tests = None if args.skip_tests else run_tests(args.python, env, work, args.pytest_args.split())
        bench = None if args.skip_bench else run_bench(args.python, env, work, args.attention,
                                                       args.bench_args.split())
    print("\n== gpu-check summary ==")
    for line in summary_lines(tests, bench, attention=args.attention, skipped_bench=args.skip_bench):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"tests": tests, "bench": bench}, indent=1) + "\n")
    ok = (tests is None or (tests["failed"] + tests["errors"] == 0 and tests["exit"] in (0, 5)))
    return 0 if ok and (args.skip_bench or bench is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
