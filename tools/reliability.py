"""Long-running reliability checks that do not belong in ``make test`` (issue 5).

    python -m tools.reliability [--kills 24] [--epochs 120] [--seed 0] [--no-tests]

1. **SIGKILL**: the ``wdspack pack`` CLI killed at ≥ 20 random points (at random times, on the
   first shard appearing, on ``dropped.jsonl`` appearing — i.e. while measuring, writing and in
   the manifest step), re-run with ``--resume`` each time. After every kill nothing partial may be
   visible under a final name; the final output must be byte-identical to an uninterrupted run.
2. **Soak**: the loader over a small synthetic dataset for many epochs with 2 persistent workers;
   RSS of the main process and of each worker sampled per epoch (first vs last), and every epoch
   must yield exactly the expected packs.
3. **Disk full / unwritable output**: the CLI in a child whose files cannot grow past N bytes
   (``RLIMIT_FSIZE``, SIGXFSZ ignored so writes fail with EFBIG), at several N; a read-only
   folder (``chmod 0o500``, which does not bite when run as root: then reported as such).
   Each must end in a one-line error, no manifest, no shard under a final name that fails to
   decode; then ``--resume`` with room again must give the reference bytes.
4. The fast tests that cover the rest of the matrix (``tests/packer/test_bad_input.py``,
   ``tests/format/test_fuzz.py``, ``test_security.py`` and the existing reliability tests) are run once and
   their outcomes listed.

Writes ``docs/benchmarks/data/reliability.json`` (everything measured) and
``docs/benchmarks/data/reliability.md`` (a table of every case tried and its outcome). Each check prints a
one-line outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"  # where the results of the tools go, beside the benchmark pages
TEMPLATE = ROOT / "examples" / "chat_templates" / "pixtral.jinja"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _tekken(work: Path) -> Path:
    import mistral_common

    folder = work / "tekken"
    folder.mkdir(exist_ok=True)
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return folder


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def _complete_shards_only(out: Path) -> str | None:
    """None when every ``*.tar`` under a final name decodes completely, else what is wrong."""
    from wdspack.format.pack import decode_pack

    for shard in sorted(out.glob("*.tar")) if out.exists() else []:
        try:
            with tarfile.open(shard) as tar:
                for m in tar.getmembers():
                    decode_pack(tar.extractfile(m).read())
        except Exception as e:  # any failure is the finding
            return f"{shard.name}: {type(e).__name__}: {e}"
    manifest = out / "manifest.json"
    if manifest.exists():
        try:
            json.loads(manifest.read_text())
        except ValueError as e:
            return f"manifest.json: {e}"
    return None


# -- 1. SIGKILL ----------------------------------------------------------------------------------------


def _phase(out: Path, partitions: int) -> str:
    if (out / "manifest.json").exists():
        return "cleanup (manifest written, work folder still there)" if (out / ".wdspack-work").exists() \
            else "after completion"
    spool = out / ".wdspack-work" / "spool"
    if not spool.exists():
        return "startup"
    metas = len(list(spool.glob("*.meta")))
    if metas < partitions:
        return f"measuring ({metas}/{partitions} partitions spooled)"
    shards = len(list(out.glob("*.tar")))
    if (out / "dropped.jsonl").exists():
        return f"manifest step ({shards} shards written)"
    return f"writing ({shards} shards written)"


def _wait_for(proc: subprocess.Popen, cond, jitter: float, limit: float) -> None:
    t0 = time.monotonic()
    while proc.poll() is None and not cond() and time.monotonic() - t0 < limit:
        time.sleep(0.005)
    time.sleep(jitter)


def check_sigkill(work: Path, tekken: Path, *, kills: int, seed: int) -> dict:
    demo = work / "demo"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_demo_data.py"), str(demo), "--records", "240",
                    "--seed", "3"], check=True, capture_output=True)
    sources = [str(demo / "llava.jsonl"), str(demo / "messages.jsonl")]
    partitions = 2  # the CLI's 1000 records per partition: one per file here

    def argv(out: Path) -> list[str]:
        return [sys.executable, "-m", "wdspack.cli", "pack", *sources, "--output", str(out), "--tokenizer",
                str(tekken), "--chat-template", str(TEMPLATE), "--image-token", "[IMG]", "--tokens-per-image", "16",
                "--seq-len", "2048", "--max-images", "6", "--shard-size", "30000", "--quiet"]

    reference = work / "reference"
    t0 = time.monotonic()
    subprocess.run(argv(reference), env=ENV, check=True, capture_output=True)
    ref_seconds = time.monotonic() - t0
    expected = _files(reference)
    rng = np.random.default_rng(seed)
    events, rounds, problems = [], [], []
    n_round = 0
    strategies = ("random time", "on first shard", "on dropped.jsonl")
    def interrupted() -> int:  # kills that landed before the job had finished
        return sum(e["phase"] not in ("after completion", "exited before the kill") for e in events)

    while interrupted() < kills:
        n_round += 1
        out = work / f"killed-{n_round}"
        started = False
        for k in range(8):  # up to 8 kills per output folder, then finish it
            if interrupted() >= kills:
                break
            strategy = strategies[len(events) % 3]
            proc = subprocess.Popen(argv(out) + (["--resume"] if started else []), env=ENV,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started = True
            if strategy == "random time":
                _wait_for(proc, lambda: False, 0.0, float(rng.uniform(1.0, ref_seconds)))
            elif strategy == "on first shard":
                _wait_for(proc, lambda out=out: any(out.glob("*.tar")), float(rng.uniform(0, 0.08)), ref_seconds * 2)
            else:
                _wait_for(proc, lambda out=out: (out / "dropped.jsonl").exists(), float(rng.uniform(0, 0.02)),
                          ref_seconds * 2)
            finished = proc.poll() is not None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            phase = "exited before the kill" if finished else _phase(out, partitions)
            bad = _complete_shards_only(out)
            events.append({"round": n_round, "strategy": strategy, "phase": phase, "partial_visible": bad})
            if bad:
                problems.append(f"round {n_round} kill {k}: {bad}")
            if (out / "manifest.json").exists():
                break
        done = subprocess.run(argv(out) + ["--resume"], env=ENV, capture_output=True, text=True)
        same = done.returncode == 0 and _files(out) == expected
        rounds.append({"round": n_round, "kills": sum(e["round"] == n_round for e in events),
                       "resume_rc": done.returncode, "identical": same})
        if not same:
            problems.append(f"round {n_round}: final output differs from the reference (rc {done.returncode}: "
                            f"{done.stderr.strip()[-300:]})")
        shutil.rmtree(out, ignore_errors=True)
    phases: dict[str, int] = {}
    for e in events:
        key = e["phase"].split(" (")[0]
        phases[key] = phases.get(key, 0) + 1
    ok = not problems and all(r["identical"] for r in rounds)
    line = (f"sigkill: {'PASS' if ok else 'FAIL'}: {len(events)} kills ({interrupted()} before the job finished) "
            f"in {len(rounds)} output folders "
            f"({', '.join(f'{k} {v}' for k, v in sorted(phases.items()))}); every resumed output byte-identical "
            f"to the reference: {all(r['identical'] for r in rounds)}; partial shard visible after a kill: "
            f"{sum(bool(e['partial_visible']) for e in events)}")
    print(line, flush=True)
    return {"ok": ok, "summary": line, "reference_seconds": round(ref_seconds, 1), "kills": events,
            "rounds": rounds, "phases": phases, "problems": problems}


# -- 2. soak --------------------------------------------------------------------------------------------


def check_soak(work: Path, *, epochs: int) -> dict:
    import psutil
    import torch

    from tests.support.synthetic import pack_numbers, write_dataset
    from wdspack.loader import make_loader

    root = work / "soak"
    write_dataset(root, shards=4, packs_per_shard=[6, 5, 7, 6], seq_len=64, max_images=2)
    expected = list(range(24))
    loader = make_loader(str(root), batch_size=4, num_workers=2, persistent_workers=True, shuffle=True, seed=1)
    me = psutil.Process()
    samples, wrong = [], []
    t0 = time.monotonic()
    for epoch in range(epochs):
        got = []
        for batch in loader:
            got.extend(pack_numbers(batch["input_ids"]))
            if len(got) >= len(expected):
                break
        if sorted(got) != expected:
            wrong.append({"epoch": epoch, "got": sorted(got)})
        workers = sorted(me.children(recursive=True), key=lambda p: p.pid)
        samples.append({"epoch": epoch, "main_mb": me.memory_info().rss / 2**20,
                        "workers_mb": [w.memory_info().rss / 2**20 for w in workers],
                        "worker_pids": [w.pid for w in workers]})
    seconds = time.monotonic() - t0
    del loader
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    settle = min(5, max(1, epochs // 10))  # the first epochs warm caches and allocators up
    first, last = samples[settle], samples[-1]
    growth_main = last["main_mb"] - first["main_mb"]
    growth_workers = [b - a for a, b in zip(first["workers_mb"], last["workers_mb"])]
    same_workers = first["worker_pids"] == last["worker_pids"]
    flat = growth_main < 20 and all(g < 20 for g in growth_workers)
    ok = not wrong and flat and same_workers
    line = (f"soak: {'PASS' if ok else 'FAIL'}: {epochs} epochs x 24 packs, 2 persistent workers, {seconds:.0f} s; "
            f"every epoch exactly the 24 packs: {not wrong}; "
            f"RSS main {first['main_mb']:.0f} -> {last['main_mb']:.0f} MB, "
            f"workers {', '.join(f'{a:.0f} -> {b:.0f}' for a, b in zip(first['workers_mb'], last['workers_mb']))} MB "
            f"(epoch {settle} vs {epochs - 1})")
    print(line, flush=True)
    return {"ok": ok, "summary": line, "epochs": epochs, "seconds": round(seconds, 1), "wrong_epochs": wrong,
            "rss": samples, "growth_main_mb": round(growth_main, 1),
            "growth_workers_mb": [round(g, 1) for g in growth_workers]}


# -- 3. disk full / unwritable ---------------------------------------------------------------------------


def check_disk_full(work: Path, tekken: Path) -> dict:
    from tests.support.bad_input import build_bad_dataset, pack_argv, run_with_file_size_limit
    from wdspack import cli

    path, images, *_ = build_bad_dataset(work / "diskfull")
    reference = work / "diskfull-reference"
    with open(os.devnull, "w") as null:
        stdout, sys.stdout = sys.stdout, null
        try:
            assert cli.main(pack_argv([str(path)], reference, tekken, images)) == 0
        finally:
            sys.stdout = stdout
    expected = _files(reference)
    sizes = sorted(p.stat().st_size for p in reference.iterdir())
    cases = []
    for limit in (512, 3000, sizes[len(sizes) // 2], sizes[-1] - 1):
        out = work / f"full-{limit}"
        done = run_with_file_size_limit(limit, pack_argv([str(path)], out, tekken, images))
        lines = done.stderr.strip().splitlines()
        bad = _complete_shards_only(out)
        manifest = (out / "manifest.json").exists()
        resumed = subprocess.run([sys.executable, "-m", "wdspack.cli", *pack_argv([str(path)], out, tekken, images),
                                  "--resume"], env=ENV, capture_output=True, text=True)
        identical = resumed.returncode == 0 and _files(out) == expected
        ok = (done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr and not bad
              and not manifest and identical)
        cases.append({"case": f"RLIMIT_FSIZE {limit} B", "ok": ok, "rc": done.returncode,
                      "message": lines[-1] if lines else "", "stderr_lines": len(lines), "manifest": manifest,
                      "partial_visible": bad, "resume_identical": identical})
        shutil.rmtree(out, ignore_errors=True)
    # read-only folder: chmod 0o500 (root ignores it)
    ro = work / "readonly"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = ro / ".probe"
        probe.write_text("x")
        probe.unlink()
        bites = False
    except OSError:
        bites = True
    if bites:
        done = subprocess.run([sys.executable, "-m", "wdspack.cli", *pack_argv([str(path)], ro / "ds", tekken, images)],
                              env=ENV, capture_output=True, text=True)
        lines = done.stderr.strip().splitlines()
        ok = done.returncode == 1 and len(lines) == 1 and not (ro / "ds" / "manifest.json").exists()
        cases.append({"case": "read-only output folder (chmod 0o500)", "ok": ok, "rc": done.returncode,
                      "message": lines[-1] if lines else ""})
    else:
        cases.append({"case": "read-only output folder (chmod 0o500)", "ok": None, "rc": None,
                      "message": "not run: running as root, chmod 0o500 does not stop writes (RLIMIT_FSIZE "
                                 "cases above stand in; a file in place of the output folder is "
                                 "tests/packer/test_bad_input.py::test_unwritable_output_is_a_clear_error)"})
    ro.chmod(stat.S_IRWXU)
    ok = all(c["ok"] is not False for c in cases)
    line = (f"disk full: {'PASS' if ok else 'FAIL'}: " + "; ".join(
        f"{c['case']}: {'ok' if c['ok'] else ('skipped' if c['ok'] is None else 'FAILED')}" for c in cases))
    print(line, flush=True)
    return {"ok": ok, "summary": line, "cases": cases}


# -- 4. the fast tests ------------------------------------------------------------------------------------

EXISTING = [
    "tests/packer/test_job.py::test_sigkill_at_random_points_then_resume",
    "tests/packer/test_job.py::test_resume_after_a_crash_while_writing",
    "tests/packer/test_job.py::test_resume_after_a_crash_while_measuring",
    "tests/packer/test_job.py::test_every_record_is_packed_or_dropped_once",
    "tests/loader/test_dataloader.py::test_corrupt_pack_is_skipped_counted_and_logged",
    "tests/loader/test_dataloader.py::test_truncated_shard_is_skipped_counted_and_raised_on_request",
    "tests/loader/test_dataloader.py::test_non_pack_members_are_ignored_and_counted",
    "tests/loader/test_dataloader.py::test_unknown_pack_format_is_refused_naming_both_versions",
    "tests/loader/batch/test_images.py::test_decompression_bomb_refused_before_decoding",
    "tests/loader/batch/test_images.py::test_corrupt_and_refused_bytes",
    "tests/packer/test_samples.py::test_decompression_bomb_refused_before_decoding",
    "tests/packer/test_samples.py::test_bad_images",
    "tests/packer/sources/test_readers.py::test_bad_records_are_dropped_with_their_reason",
    "tests/packer/sources/test_readers.py::test_image_path_escape",
    "tests/packer/sources/test_readers.py::test_malformed_lines_in_the_middle_lose_nothing_around_them",
]
NEW = ["tests/packer/test_bad_input.py", "tests/format/test_fuzz.py", "tests/test_security.py"]


def run_tests(work: Path) -> dict:
    report = work / "junit.xml"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    *NEW, *EXISTING], cwd=ROOT, env=ENV, capture_output=True, text=True)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}".replace("tests/", "tests/", 1)
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcomes[name] = "FAIL" if failed else ("skip" if skipped else "pass")
    ok = all(v != "FAIL" for v in outcomes.values())
    line = (f"tests: {'PASS' if ok else 'FAIL'}: {sum(v == 'pass' for v in outcomes.values())} passed, "
            f"{sum(v == 'FAIL' for v in outcomes.values())} failed in {time.monotonic() - t0:.0f} s")
    print(line, flush=True)
    return {"ok": ok, "summary": line, "outcomes": outcomes}


# -- report ------------------------------------------------------------------------------------------------

_BAD_INPUT = [
    ("missing image file", "missing_image"), ("corrupt image bytes", "unreadable_image"),
    ("truncated image", "unreadable_image"), ("decompression bomb (PNG header 30000x30000)", "image_too_large"),
    ("image path `../outside.png`", "image_path_escape"), ("absolute image path outside the root", "image_path_escape"),
    ("symlink in the root pointing outside", "packed: confined as written, as hub-cache snapshots need"),
    ("a video file that does not exist", "missing_video"), ("a video path out of the root", "video_path_escape"),
    ("an empty video file", "unreadable_video"), ("an audio record (`audios` field)", "unsupported_media"),
    ("malformed JSON line", "malformed_record"),
    ("wrong field types (conversations a string, value an int, image an int, id a float)", "malformed_record"),
    ("a JSON line that is not an object", "malformed_record"), ("unknown role", "unknown_role"),
    ("empty conversation", "empty_conversation"), ("no assistant turn", "no_assistant_turn"),
    ("more `<image>` placeholders than images", "placeholder_mismatch"),
    ("more images than placeholders", "placeholder_mismatch"), ("non-UTF-8 bytes in a JSONL line", "malformed_record"),
    ("sample over seq_len", "too_long"), ("more images than max_images", "too_many_images"),
    ("duplicate id (the first is kept)", "duplicate_id"),
]

_TEST_CASES = [
    ("bad input", "every bad record dropped with its reason, good ones packed once, manifest counts add up",
     "tests/packer/test_bad_input.py::test_every_bad_record_is_dropped_with_its_reason"),
    ("bad input", "duplicate ids: the first occurrence is the one packed",
     "tests/packer/test_bad_input.py::test_the_first_duplicate_is_kept"),
    ("bad input", "`--on-error raise` stops at the first bad record, naming it",
     "tests/packer/test_bad_input.py::test_on_error_raise_names_the_first_bad_record"),
    ("bad input", "`--on-error raise` for too long / duplicate / non-UTF-8",
     "tests/packer/test_bad_input.py::test_on_error_raise_for_budget_and_duplicate_drops"),
    ("bad input", "CLI `--on-error raise`: exit 1, one line naming the record",
     "tests/packer/test_bad_input.py::test_cli_on_error_raise_is_one_line_exit_1"),
    ("output", "full disk (RLIMIT_FSIZE 3000 B): one-line error, nothing half-written, resume identical",
     "tests/packer/test_bad_input.py::test_full_disk_is_a_clear_error_and_leaves_nothing_half_written"),
    ("output", "output path under a regular file: one-line error",
     "tests/packer/test_bad_input.py::test_unwritable_output_is_a_clear_error"),
    ("codec fuzz", "random bytes → only FormatError", "tests/format/test_fuzz.py::test_decode_random_bytes"),
    ("codec fuzz", "every truncation of a valid pack → FormatError",
     "tests/format/test_fuzz.py::test_decode_truncated_pack"),
    ("codec fuzz", "byte flips in a valid pack → only FormatError",
     "tests/format/test_fuzz.py::test_decode_flipped_bytes"),
    ("codec fuzz", "valid msgpack with any value in any field → only FormatError",
     "tests/format/test_fuzz.py::test_decode_well_formed_msgpack_of_the_wrong_shape"),
    ("codec fuzz", "4 GiB bin / str / array / map claims, ext types, deep nesting: refused, < 128 MB",
     "tests/format/test_fuzz.py::test_a_huge_claim_is_refused_without_allocating_it"),
    ("tar fuzz", "truncated shard → ShardError (or all packs, when cut after the last)",
     "tests/format/test_fuzz.py::test_truncated_shard"),
    ("tar fuzz", "byte flips in a shard → packs, counted skips or ShardError",
     "tests/format/test_fuzz.py::test_flipped_bytes_in_a_shard"),
    ("tar fuzz", "random bytes as a shard", "tests/format/test_fuzz.py::test_random_bytes_as_a_shard"),
    ("tar fuzz", "a header claiming any size up to 2^88 bytes: never allocated (< 64 MB)",
     "tests/format/test_fuzz.py::test_a_header_with_any_size_never_allocates_it"),
    ("tar fuzz", "8 GiB / 2^80 / negative / non-octal sizes → ShardError",
     "tests/format/test_fuzz.py::test_garbled_sizes_are_shard_errors"),
    ("tar fuzz", "PackedDataset over a truncated / flipped / random / re-sized shard: full epoch or FormatError",
     "tests/format/test_fuzz.py::test_packed_dataset_over_a_mutated_shard"),
    ("tar fuzz", "no readable pack at all: an error, not a hang",
     "tests/format/test_fuzz.py::test_a_shard_that_reads_nothing_at_all_is_an_error_not_a_hang"),
    ("security", "no pickle/torch.load/allow_pickle/marshal/yaml.load/eval/exec in wdspack/",
     "tests/test_security.py::test_no_code_path_unpickles_or_evals"),
    ("security", "malicious .pyd/.pth/.pickle/.pkl members: loader ignores and counts them, marker never created",
     "tests/test_security.py::test_pickle_members_are_never_unpickled_by_the_loader"),
    ("security", "same shard through `wdspack verify` (reported as not a pack) and `inspect --deep`",
     "tests/test_security.py::test_pickle_members_are_never_unpickled_by_verify_and_inspect"),
    ("security", "`wdspack upload` with HF_TOKEN / --token and a client that echoes the token: absent from "
     "stdout, stderr, logs, written files", "tests/test_security.py::test_upload_never_prints_or_logs_the_token"),
    ("security", "upload exception text and traceback hold no token",
     "tests/test_security.py::test_upload_exception_and_traceback_hold_no_token"),
    ("security", "`upload --help` advises HF_TOKEN over --token",
     "tests/test_security.py::test_cli_help_advises_hf_token_over_the_token_flag"),
    ("security", "loader with storage_options token on missing local / hf:// paths: no token in errors or logs",
     "tests/test_security.py::test_loader_errors_hold_no_token"),
    ("security", "loader repr / state_dict hold no header value",
     "tests/test_security.py::test_loader_repr_holds_no_token"),
    ("security", "bomb refused by pixel count before decoding: packer",
     "tests/test_security.py::test_packer_refuses_bombs_by_pixel_count"),
    ("security", "bomb refused by pixel count before decoding: loader",
     "tests/test_security.py::test_loader_refuses_bombs_by_pixel_count"),
    ("security", "a bomb inside a pack: its sample dropped from the pack and counted, never decoded",
     "tests/test_security.py::test_a_bomb_inside_a_pack_is_a_counted_skip"),
]


def write_report(results: dict, md: Path) -> None:
    out = results.get("tests", {}).get("outcomes", {})

    def outcome(test: str) -> str:
        hits = [v for k, v in out.items() if k.split("[")[0] == test.split("[")[0] or k.startswith(test + "[")]
        if not hits:
            return "not run"
        return "FAIL" if "FAIL" in hits else "pass" + (f" ({len(hits)} cases)" if len(hits) > 1 else "")

    rows = ["| area | case | where | outcome |", "|---|---|---|---|"]
    for case, reason in _BAD_INPUT:
        test = "tests/packer/test_bad_input.py::test_every_bad_record_is_dropped_with_its_reason"
        rows.append(f"| bad input | {case} → `{reason}` | `{test}` | {outcome(test)} |")
    for area, case, test in _TEST_CASES:
        rows.append(f"| {area} | {case} | `{test}` | {outcome(test)} |")
    for test in EXISTING:
        rows.append(f"| existing | {test.split('::')[1].replace('_', ' ')} | `{test}` | {outcome(test)} |")
    if "sigkill" in results:
        s = results["sigkill"]
        for e in s["kills"]:
            seen = (f"partial shard visible: {e['partial_visible']}" if e["partial_visible"]
                    else "nothing partial visible")
            rows.append(f"| SIGKILL | run {e['round']}, kill {e['strategy']}, during {e['phase']} | "
                        f"`tools/reliability.py` | {seen} |")
        for r in s["rounds"]:
            same = "byte-identical to the uninterrupted run" if r["identical"] else f"DIFFERS (rc {r['resume_rc']})"
            rows.append(f"| SIGKILL | run {r['round']}: {r['kills']} kills, then `--resume` | `tools/reliability.py` | "
                        f"{same} |")
    if "soak" in results:
        s = results["soak"]
        rows.append(f"| soak | {s['epochs']} epochs, 2 persistent workers | `tools/reliability.py` | "
                    f"{'PASS' if s['ok'] else 'FAIL'}: {s['summary'].split(': ', 2)[2]} |")
    if "disk_full" in results:
        for c in results["disk_full"]["cases"]:
            verdict = "skipped" if c["ok"] is None else ("PASS" if c["ok"] else "FAIL")
            rows.append(f"| disk full | {c['case']} | `tools/reliability.py` | {verdict}: "
                        f"{c['message'].replace('|', '/')} |")
    summary = [f"- {v['summary']}" for k, v in results.items() if isinstance(v, dict) and "summary" in v]
    md.write_text("# Reliability checks\n\nWritten by `python -m tools.reliability` (numbers in "
                  "`docs/benchmarks/data/reliability.json`).\n\n" + "\n".join(summary) + "\n\n"
                  + "\n".join(rows) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=24)
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-tests", action="store_true", help="skip running the fast tests")
    p.add_argument("--only", choices=("sigkill", "soak", "disk_full", "tests"), action="append")
    args = p.parse_args(argv)
    chosen = args.only or ["tests", "disk_full", "soak", "sigkill"]
    if args.no_tests and "tests" in chosen:
        chosen.remove("tests")
    results: dict = {}
    previous = DATA / "reliability.json"
    if args.only and previous.exists():  # a partial run updates the checks it ran
        results = json.loads(previous.read_text())
    with tempfile.TemporaryDirectory(prefix="wdspack-reliability-") as tmp:
        work = Path(tmp)
        tekken = _tekken(work)
        if "tests" in chosen:
            results["tests"] = run_tests(work)
        if "disk_full" in chosen:
            results["disk_full"] = check_disk_full(work, tekken)
        if "soak" in chosen:
            results["soak"] = check_soak(work, epochs=args.epochs)
        if "sigkill" in chosen:
            results["sigkill"] = check_sigkill(work, tekken, kills=args.kills, seed=args.seed)
    (DATA / "reliability.json").write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    write_report(results, DATA / "reliability.md")
    return 0 if all(v.get("ok") for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
