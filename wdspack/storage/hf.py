"""The Hugging Face Hub as a place to read from: ``hf://`` URLs, pinned and resolved.

``hf://datasets/ORG/NAME[@REV]/path`` is always read at a named revision (``@main`` when none is
given) and, for streaming, at the commit that revision points to when resolved, so every worker
and rank reads the same snapshot. The bytes then travel over HTTP(S) (:mod:`.http`) from the
commit's ``resolve`` URL; the token goes in a header and never into a URL, a log or an error.
"""

from __future__ import annotations

import glob

from ..errors import ConfigError, SourceError

__all__ = ["resolve_hub_urls", "with_hub_revision"]


def with_hub_revision(url: str) -> str:
    """``hf://datasets/ORG/NAME/x`` → ``hf://datasets/ORG/NAME@main/x`` (other URLs unchanged).

    A revision is always asked for by name, as the loader does: the same snapshot every time
    (and mirrors such as olah answer revision-less lookups by asking the real Hub).

    Example:
        >>> with_hub_revision("hf://datasets/org/name/data/a.jsonl")
        'hf://datasets/org/name@main/data/a.jsonl'
    """
    if not url.startswith("hf://"):
        return url
    parts = url[len("hf://"):].split("/")
    typed = parts[0] in ("datasets", "spaces", "models")
    repo = 2 if typed else 1
    if len(parts) > repo and "@" not in parts[repo]:
        parts[repo] += "@main"
    return "hf://" + "/".join(parts)


def resolve_hub_urls(urls: list[str], options: dict, headers: dict, *, folder_file: str
                     ) -> tuple[list[str], dict[str, str]]:
    """``hf://datasets/ORG/NAME@REV/path`` → ``resolve`` URLs at the pinned commit, and the auth headers.

    A URL naming the repo (or a folder) itself resolves to the folder's URL, ending in ``/``: the
    resolve URL of ``folder_file`` in it, cut before the name (``manifest.json`` for a dataset root).

    HfFileSystem parses the paths, checks repo and revision and supplies endpoint and token (one
    request per repo); ``repo_info`` pins the revision to its commit (one more). No listing.
    The file system is a fresh instance, not fsspec's per-process cached one: that one remembers
    "repository not found" for the life of the process, so a repo created after a failed attempt
    (an upload still running) would never be found again, and it would make no request to say so.
    """
    from huggingface_hub import HfFileSystem
    from huggingface_hub.utils import build_hf_headers

    fs = HfFileSystem(**{**options, "skip_instance_cache": True})
    commits: dict[tuple[str, str, str], str] = {}
    out = [_hf_resolve_url(fs, url, commits, folder_file) for url in urls]
    return out, {**headers, **build_hf_headers(token=fs.token)}


def _hf_resolve_url(fs, url: str, commits: dict[tuple[str, str, str], str], folder_file: str) -> str:
    """One ``hf://`` URL → its ``resolve`` URL at the commit its revision points to (``commits`` caches the pins)."""
    from huggingface_hub import HfApi, hf_hub_url

    if glob.has_magic(url):
        raise ConfigError(f"{url}: globs are not expanded on the Hub (folders are never listed); use a brace "
                          "pattern like train-{000000..000009}.tar or the dataset root")
    try:
        # A revision-less source reads @main, asked for by name: mirrors (olah) can only answer an
        # unnamed revision by asking huggingface.co, and the Hub's default branch is main anyway.
        resolved = fs.resolve_path(with_hub_revision(url))
        key = (resolved.repo_type, resolved.repo_id, resolved.revision)
        if key not in commits:
            info = HfApi(endpoint=fs.endpoint, token=fs.token).repo_info(
                resolved.repo_id, repo_type=resolved.repo_type, revision=resolved.revision)
            commits[key] = info.sha or resolved.revision
    except FileNotFoundError as e:
        raise SourceError(f"{url}: {e.args[0] if e.args else 'not found'}; check the repo name and the revision "
                          "(and that you are logged in for a private repo)") from None
    except (ConfigError, SourceError):
        raise
    except Exception as e:  # offline mode, network down, ...; the text never holds the token
        raise SourceError(f"{url}: cannot resolve the Hub repository: {type(e).__name__}: {e}") from None
    path = resolved.path_in_repo.strip("/")
    http = hf_hub_url(resolved.repo_id, path or folder_file, repo_type=resolved.repo_type,
                      revision=commits[key], endpoint=fs.endpoint)
    return http if path else http[: -len(folder_file)]
