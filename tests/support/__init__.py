"""What the tests share, and what ``tools/`` may import too (``from tests.support import synthetic``).

Importable because pytest's ``pythonpath`` (pyproject.toml) puts the checkout's root and ``examples/``
on the path; a tool run as ``python -m tools.NAME`` from the root finds it the same way.

- ``bad_input``: one dataset with a bad record per drop reason; the CLI on a full disk.
- ``benches``: the checks a ``tools/bench_train.py`` record passes at any size.
- ``demo``: the demo dataset (``examples/make_demo_data.py``) and its sources.
- ``driver_memory``: the pack job's driver memory, measured in a child process.
- ``httpserver``: an HTTP server on loopback with faults to inject.
- ``hubserver``: olah, a Hub-compatible server, serving local git repositories on loopback.
- ``mixture``: loaders over three synthetic sources and what their batches read, pass by pass.
- ``pretrain``: caption shards and documents in the layouts pre-training sources use.
- ``progress``: a task that reports its records slowly (progress while a task runs).
- ``published``: files in other projects' published layouts, packed and read back.
- ``ranks``: torch.distributed ranks as processes on loopback.
- ``resume``: a pack job interrupted, then resumed.
- ``s3server``: moto's S3 server on loopback.
- ``synthetic``: small packed datasets whose packs say which they are.
- ``templates``: published chat templates and tool schemas.
- ``video_chats``: video chat records in LLaMA-Factory's and LLaVA-Video's layouts, clips, the one-by-one reference.
- ``video_reference``: the real transformers video processors (torchvision in a folder of its own), in a child.
- ``vlm_harness``: the proof every model family passes (tokens, pixels, exact loss and gradients).
"""

from __future__ import annotations

from pathlib import Path

#: The checkout's root folder.
ROOT = Path(__file__).resolve().parents[2]
