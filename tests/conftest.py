"""Shared fixtures (real tokenizers loaded offline, the demo dataset) and the two test tiers.

- ``tekken_dir``: a folder holding the Pixtral tokenizer (``tekken.json`` from mistral_common).
- ``tekken``: that tokenizer loaded (a 131k vocabulary: seconds), once per session: never change it.
- ``nemo_dir``: a folder holding Mistral-Nemo-Instruct-2407's tokenizer (mistral_common's July 2024 tekken).
- ``pixtral_template``: the text of ``examples/chat_templates/pixtral.jinja``.
- ``sample_config``: both as a :class:`~wdspack.packer.samples.SampleConfig`, 16 ``[IMG]`` tokens per image.
- ``demo_data``: ``examples/make_demo_data.py``'s dataset (150 records, seed 11), generated once per session.
- ``demo_packed``: ``demo_data`` packed once per session with ``support.demo.DEMO_PACK`` (a folder and its summary).
- ``tiny_processors``: ``examples/tiny_vlm``'s real processors, each (module, options) built once per session and
  saved once (``vlm_harness.TinyProcessors``: ``.get(module, **options)``, ``.family(name)``, ``.folder(processor)``).
- ``vlm_family``: ``get(name)`` -> the real processor, a fresh tiny model and the packed chats of a family of
  ``vlm_harness.FAMILIES`` (or ``"gemma3"``), each family built and packed once per session (its processor
  ``tiny_processors``'; Mistral 3 and its sliding-window variant, one processor, share their packed chats).
- ``video_reference``: while the session lasts, ``video_reference.run_jobs`` runs every module's jobs in one child
  (transformers, torchvision and the tokenizers loaded once); the video tests' clips are encoded once per process
  (``video_chats.clip``).
- ``tools_tiny_vlm``: the tools' copy of ``examples/tiny_vlm`` (imported as ``examples.tiny_vlm``) takes its tekken
  tokenizer from the tests' ``tiny_vlm``, loaded once per process.

Tiers: the modules in :data:`INTEGRATION` and the tests marked ``slow`` are marked ``integration``;
``make test-fast`` runs ``-m "not integration"`` (the inner loop), ``make test`` (CI) runs both.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.demo import demo_pack_config

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

#: The integration tier: test modules (paths under tests/ without ``.py``, ``*`` as in a glob; a folder ends in ``/``)
#: that start processes or servers (torchrun, Ray, moto's S3, olah and HTTP servers), build model
#: families and train them, or are slow for another reason. Chosen from ``--durations=0`` on the
#: 2-core dev machine so that the rest, the fast tier, runs in under 3 minutes there. A fast module
#: with one slow test marks that test ``@pytest.mark.slow`` instead, which puts it in this tier too.
INTEGRATION = (
    "models/test_family_*",  # the model families, exactly
    "models/test_varlen_families",  # varlen attention on every family
    "models/test_target_logits",  # the LM head on the targets, every family
    "models/test_vision_meta",  # the Qwen-VL towers' bookkeeping, real models
    "models/test_compile",  # decoder layers under torch.compile over a packed epoch, real models
    "models/test_processor_mode",  # processor mode end to end
    "models/test_load_processor",  # processors saved and loaded
    "media/test_video_plan",  # videos encoded with PyAV; transformers' video code in a process of its own
    "models/test_video_families",  # Qwen-VL videos against their real processors (a child), float64
    "models/test_audio_families",  # audio families against their real processors, float64
    "models/test_video_llava_onevision",  # LLaVA-OneVision video against its real processor (a child), float64
    "models/test_processor_folders",  # folders written by the real processors (a child), packed by the CLI
    "packer/test_video_bad_input",  # bad videos packed with a Qwen processor and streamed
    "packer/test_audio_bad_input",  # bad audio packed with Qwen2-Audio's processor and streamed
    "ops/test_audio_tools",  # audio packed by the CLI with Qwen2-Audio's processor, every tool on it
    "packer/test_video_messages",  # video jobs packed with a Qwen processor, the messages a user reads
    "packer/test_placeholder_newline",  # every family's processor, a sample with and without the newline
    "train/test_ddp",  # torchrun: examples/train_ddp.py
    "train/test_cp_exact",  # 4 gloo ranks: context parallelism against the unsplit step, two families
    "train/test_cp_recipe",  # torchrun: examples/train_cp.py, 2 CP ranks against the unsplit run
    "train/test_trainers",  # torchrun: the HF Trainer and Accelerate examples
    "loader/test_distributed",  # torchrun
    "packer/test_executors_ray",  # a Ray cluster
    "packer/test_job_remote",  # the pack job on moto's S3
    "storage/test_s3",  # the loader on moto's S3
    "storage/test_hub",  # olah, a Hub mirror
    "storage/test_http",  # HTTP servers
    "tools/test_bench_mixture_loader",  # the same, for the mixture loader bench
    "tools/test_bench_audio",  # the audio bench at toy sizes: packs with Qwen2-Audio's processor, streams in workers
    "loader/test_wds",  # olah, the example in a process, model processors
    "loader/test_elastic",  # checkpoints of real DataLoader worker processes resumed on other layouts
    "packer/test_render",  # published chat templates (Qwen2.5, Mistral-Nemo) with their tokenizers
    "packer/sources/test_toolcalls",  # the same, and the CLI on them
    "test_install",  # python -m build, the wheel in a fresh venv, the README's quick start run there
)


@pytest.fixture(scope="session")
def tekken_dir(tmp_path_factory) -> Path:
    import mistral_common

    folder = tmp_path_factory.mktemp("tekken")
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return folder


@pytest.fixture(scope="session")
def tekken(tekken_dir):
    """The Pixtral tokenizer, loaded once: ``SampleConfig(tekken, ...)`` builds on it without a load of its own."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tekken_dir))


@pytest.fixture(scope="session")
def nemo_dir(tmp_path_factory) -> Path:
    """Mistral-Nemo-Instruct-2407's tokenizer (tekken, July 2024), shipped in mistral_common."""
    import mistral_common

    folder = tmp_path_factory.mktemp("nemo")
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240718.json", folder / "tekken.json")
    # the special tokens as the model's published tokenizer_config.json names them (the template needs eos_token)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "unk_token": "<unk>"}))
    return folder


@pytest.fixture(scope="session")
def pixtral_template() -> str:
    return (ROOT / "examples" / "chat_templates" / "pixtral.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def sample_config(tekken_dir, pixtral_template):
    from wdspack.packer.samples import SampleConfig

    return SampleConfig(tokenizer=str(tekken_dir), chat_template=pixtral_template, tokens_per_image=16,
                        image_token="[IMG]")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The demo dataset (``llava.jsonl``, ``messages.jsonl``, ``images/``), shared: never write into it."""
    from tests.support.demo import generate_demo

    return generate_demo(tmp_path_factory.mktemp("demo"), records=150, seed=11)


@pytest.fixture(scope="session")
def demo_packed(tmp_path_factory, demo_data, sample_config):
    """``(folder, summary)``: ``demo_data`` packed with ``support.demo.DEMO_PACK``, shared: never write into it."""
    from tests.support.demo import demo_sources
    from wdspack.packer.job import pack_dataset

    out = tmp_path_factory.mktemp("demo-packed") / "ds"
    summary = pack_dataset(demo_sources(demo_data), out, sample_config=sample_config, config=demo_pack_config())
    return out, summary


@pytest.fixture(scope="session")
def tiny_processors(tmp_path_factory):
    """``examples/tiny_vlm``'s processors, built and saved once per session: never change them or their folders."""
    from tests.support.vlm_harness import TinyProcessors

    return TinyProcessors(tmp_path_factory.mktemp("tiny-processors"))


@pytest.fixture(scope="session")
def vlm_family(tmp_path_factory, tiny_processors):
    """``get(name) -> (processor, model, dataset)``; every call gets its own copy of the model (same weights),
    the processor and the dataset are shared: never change or write into them."""
    import copy

    from tests.support import vlm_harness as h

    built: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in built:
            processor, seq_len = tiny_processors.family(name), h.ALL_FAMILIES[name][3]
            same = [n for n in built if built[n][0] is processor and h.ALL_FAMILIES[n][3] == seq_len]
            if same:  # the same processor, chats and rows: the same packed chats (a family differing in its model)
                built[name] = processor, h.family_model(name, processor), built[same[0]][2]
            else:
                built[name] = h.build_family(name, tmp_path_factory.mktemp(name), processors=tiny_processors)
        processor, model, dataset = built[name]
        return processor, copy.deepcopy(model), dataset

    return get


@pytest.fixture(scope="session")
def video_reference():
    """``tests/support/video_reference.run_jobs`` runs its jobs in one child for the rest of the session (not a child
    per call): a module that asks for this shares the child's imports and loaded tokenizers with the others."""
    from tests.support import video_reference as ref

    with ref.shared_child():
        yield


@pytest.fixture(scope="session")
def tools_tiny_vlm():
    """The tools import ``examples/tiny_vlm`` as ``examples.tiny_vlm``, a second copy of the package beside the tests'
    ``tiny_vlm`` with its own tekken tokenizer (seconds to load) and extensions: for the session, that copy takes
    them from the tests' (the same file, the same code)."""
    import importlib

    import tiny_vlm

    tools_copy = importlib.import_module("examples.tiny_vlm")
    patch = pytest.MonkeyPatch()
    if tools_copy is not tiny_vlm:
        patch.setattr(tools_copy, "_base_tokenizer", tiny_vlm._base_tokenizer)
        patch.setattr(tools_copy, "_extended_tokenizer", tiny_vlm._extended_tokenizer)
    yield
    patch.undo()


def _in_integration(path: Path) -> bool:
    if not path.is_relative_to(TESTS):
        return False
    name = path.relative_to(TESTS).with_suffix("").as_posix()
    return any(fnmatch.fnmatchcase(name, entry + "*" if entry.endswith("/") else entry) for entry in INTEGRATION)


def pytest_configure(config):
    # A renamed or moved module would silently fall into the fast tier: name the stale entry instead.
    stale = [e for e in INTEGRATION if not (TESTS / e).is_dir() and not any(TESTS.glob(f"{e}.py"))]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py INTEGRATION names {stale}, which are not in tests/: "
                                "update the list to the modules' new paths")


def pytest_collection_modifyitems(config, items):
    """Mark the integration tier; tests marked ``gpu`` are skipped (with the reason) without a CUDA device."""
    for item in items:
        if item.get_closest_marker("slow") or _in_integration(item.path):
            item.add_marker(pytest.mark.integration)

    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (FlashAttention-2 / GPU kernels); none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``WDSPACK_TEST_DURATIONS=FILE`` (``.ci/run`` sets it), every phase of every test as a JSON line, for
    ``python -m tools.suite_durations`` (the table in docs/development.md). Written by the controller alone
    under pytest-xdist (its workers send it their reports)."""
    path = os.environ.get("WDSPACK_TEST_DURATIONS")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    line = {"test": report.nodeid, "when": report.when, "seconds": round(report.duration, 3),
            "outcome": report.outcome, "integration": "integration" in report.keywords}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
