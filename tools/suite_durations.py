"""The suite's time, from a run's phase records: the table in docs/development.md.

    WDSPACK_TEST_DURATIONS=build/durations.jsonl make test     # .ci/run does this
    python -m tools.suite_durations build/durations.jsonl       # Markdown on stdout

Each record is one phase (setup, call, teardown) of one test, written by ``tests/conftest.py``. The
output: the tiers' totals (test-seconds, which pytest-xdist spreads over its processes), the slowest
tests with their set-up apart from their call, and every module's total.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def read_records(path: Path) -> dict[str, dict]:
    """``test -> {"setup": s, "call": s, "teardown": s, "integration": bool, "outcome": str}``."""
    tests: dict[str, dict] = defaultdict(lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"})
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        entry = tests[rec["test"]]
        entry[rec["when"]] += rec["seconds"]
        entry["integration"] = rec["integration"]
        if rec["outcome"] != "passed" and (rec["when"] == "call" or rec["outcome"] == "failed"):
            entry["outcome"] = rec["outcome"]
    return dict(tests)


def total(entry: dict) -> float:
    return entry["setup"] + entry["call"] + entry["teardown"]


def module_of(test: str) -> str:
    return test.split("::", 1)[0]


def markdown(tests: dict[str, dict], *, top: int = 30) -> str:
    """The three tables."""
    lines = ["| tier | tests | test-seconds | set-up | call |", "|---|---|---|---|---|"]
    for name, keep in (("fast", False), ("integration", True)):
        group = [e for e in tests.values() if e.get("integration", False) == keep]
        lines.append(f"| {name} | {len(group)} | {sum(map(total, group)):,.0f} | "
                     f"{sum(e['setup'] for e in group):,.0f} | {sum(e['call'] for e in group):,.0f} |")
    lines.append(f"| all | {len(tests)} | {sum(map(total, tests.values())):,.0f} | | |")
    lines += ["", f"The {top} slowest tests (seconds; set-up includes the fixtures a test is the first to need):", "",
              "| test | tier | set-up | call | total |", "|---|---|---|---|---|"]
    for test, entry in sorted(tests.items(), key=lambda kv: -total(kv[1]))[:top]:
        tier = "integration" if entry.get("integration") else "fast"
        lines.append(f"| `{test}` | {tier} | {entry['setup']:.1f} | {entry['call']:.1f} | {total(entry):.1f} |")
    modules: dict[str, list[dict]] = defaultdict(list)
    for test, entry in tests.items():
        modules[module_of(test)].append(entry)
    lines += ["", "Every module (seconds):", "", "| module | tests | set-up | call | total |", "|---|---|---|---|---|"]
    for module, entries in sorted(modules.items(), key=lambda kv: -sum(map(total, kv[1]))):
        lines.append(f"| `{module}` | {len(entries)} | {sum(e['setup'] for e in entries):.1f} | "
                     f"{sum(e['call'] for e in entries):.1f} | {sum(map(total, entries)):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path, help="the JSON lines WDSPACK_TEST_DURATIONS named")
    ap.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list (default 30)")
    args = ap.parse_args(argv)
    if not args.records.is_file():
        print(f"error: {args.records} does not exist: run the suite with WDSPACK_TEST_DURATIONS={args.records}",
              file=sys.stderr)
        return 2
    sys.stdout.write(markdown(read_records(args.records), top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
