"""The guides' code runs: every example in ``docs/guides/*.md`` is executed, so a stale one fails CI.

The guides promise that their examples run as written from ``build/demo``, the folder ``make demo``
fills. The ``guide_workspace`` fixture builds a small copy of it once (the same layout, fewer
records): ``data/`` (``examples/make_demo_data.py``), ``tokenizer/`` and ``nemo-tokenizer/`` (the
tokenizers ``mistral_common`` ships, set up by ``examples/demo.py``'s own functions), ``packed/``
(the demo's pack command), ``qwen/processor/`` and ``qwen/packed/`` (as ``examples/train_tiny_vlm.py``
makes them), with ``examples/`` two folders up as in the repository. Each page then runs in a
fresh copy of it, block after block in page order, one test per block:

- a ```` ```python ```` block runs in one namespace per page (a later block sees an earlier one's
  names, as a reader's session would); tracebacks point at the Markdown file's own line numbers;
- a ```` ```bash ```` block runs each of its ``wdspack ...`` commands in-process through
  ``wdspack.cli.main`` (continuation lines joined, ``# comments`` dropped, ``VAR=value`` prefixes
  set in the environment) and expects exit status 0; any other command needs a no-run mark;
- a block right after ``<!-- file: NAME -->`` is written to ``NAME`` (an input later blocks read);
- a block right after ``<!-- no-run: REASON -->`` is skipped with that reason (the Hub, a GPU, a
  cluster); ```` ```text ```` blocks are output and never run.

Also checked here, without building the site: ``docs/reference/api.md`` documents exactly
``wdspack.__all__``, and the CLI reference hook renders every subcommand.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.demo import ROOT, generate_demo

GUIDES = ROOT / "docs" / "guides"
RUN_LANGS = ("python", "bash")
# Languages a guide may use; anything else (```py, ```sh, ```console) would silently not run.
KNOWN_LANGS = ("python", "bash", "text", "json", "yaml", "jinja")
DEMO_RECORDS = 200  # enough packs for several batches per rank; 6 bad records stay under the 5 % drop limit

_FENCE = re.compile(r"^(?P<fence>`{3,})(?P<lang>[\w-]*)\s*$")
_MARK = re.compile(r"^<!--\s*(?P<kind>no-run|file):\s*(?P<value>.*?)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of a guide."""

    page: str  #: file name under docs/guides
    line: int  #: 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None = None  #: "no-run" or "file"
    mark_value: str = ""  #: the reason, or the file name

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of ``text``, each with the mark on the non-blank line before its fence."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, start = opening["fence"], i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == fence), None)
        if end is None:
            raise AssertionError(f"docs/guides/{page}:{i + 1}: code fence {fence} is never closed")
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(previous.strip())
        blocks.append(Block(page, start + 1, opening["lang"], "\n".join(lines[start + 1:end]),
                            mark["kind"] if mark else None, mark["value"] if mark else ""))
        i = end + 1
    return blocks


def _all_blocks() -> list[Block]:
    return [b for page in sorted(GUIDES.glob("*.md")) for b in parse_blocks(page.name, page.read_text("utf-8"))]


def _runnable(block: Block) -> bool:
    return block.lang in RUN_LANGS or block.mark == "file"


BLOCKS = [b for b in _all_blocks() if _runnable(b)]


def _load_demo_script():
    spec = importlib.util.spec_from_file_location("wdspack_demo_script", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*argv: str) -> None:
    from wdspack.cli import main

    code = main([str(a) for a in argv])
    assert code == 0, f"wdspack {' '.join(map(str, argv))} exited {code}"


@pytest.fixture(scope="module")
def guide_workspace(tmp_path_factory) -> Path:
    """A repository-shaped folder whose ``build/demo`` holds what ``make demo`` leaves there."""
    root = tmp_path_factory.mktemp("guides") / "repo"
    demo = root / "build" / "demo"
    demo.mkdir(parents=True)
    (root / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    script = _load_demo_script()
    generate_demo(demo / "data", records=DEMO_RECORDS, seed=0)
    script.prepare_tokenizer(demo / "tokenizer")
    script.prepare_nemo_tokenizer(demo / "nemo-tokenizer")
    from tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor

    save_processor(qwen2_5_vl.processor(demo / "qwen" / "tokenizer"), demo / "qwen" / "processor")
    # The commands make demo runs, from build/demo with the guides' relative paths: the tokenizer
    # and processor a pack job loads are then the ones the guides' commands find loaded already.
    with contextlib.chdir(demo):
        _cli("pack", "data/llava.jsonl", "data/messages.jsonl", "--output", "packed", "--tokenizer", "tokenizer/",
             "--chat-template", "../../examples/chat_templates/pixtral.jinja", "--image-token", "[IMG]",
             "--tokens-per-image", "64", "--seq-len", "4096", "--max-images", "16", "--shard-size", "4MB", "--quiet")
        _cli("pack", "data/messages.jsonl", "--output", "qwen/packed", "--processor", "qwen/processor",
             "--seq-len", "1024", "--max-images", "8", "--max-drop-fraction", "0.1", "--quiet")
    return root


@dataclass
class _PageRun:
    cwd: Path
    namespace: dict
    failed: str | None = None


@pytest.fixture(scope="module")
def page_runs() -> dict[str, _PageRun]:
    return {}


def _run_bash(block: Block, monkeypatch) -> None:
    logical = re.sub(r"\\\n", " ", block.code)
    for line in logical.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        env = {}
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        assert words and words[0] == "wdspack", (
            f"docs/guides/{block.id}: `{line.strip()}` is not a wdspack command, which this test cannot run; "
            "mark the block <!-- no-run: why --> or split the other commands out")
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            from wdspack.cli import main

            code = main(words[1:])
        assert code == 0, f"docs/guides/{block.id}: `{' '.join(words)}` exited {code} (its output is above)"


def _run_python(block: Block, run: _PageRun) -> None:
    path = GUIDES / block.page
    # Pad with newlines so that a traceback names the Markdown file's own line numbers.
    code = compile("\n" * block.line + block.code + "\n", str(path), "exec")
    saved_path = list(sys.path)
    try:
        exec(code, run.namespace)
    finally:
        sys.path[:] = saved_path  # the train guide's block extends sys.path as a user would: undo it here


@pytest.mark.slow  # the integration tier: it packs, streams and trains (about 2 minutes on 2 idle cores)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_guide_block_runs(block: Block, guide_workspace: Path, page_runs: dict, monkeypatch):
    if block.mark == "no-run":
        pytest.skip(f"docs/guides/{block.id}: {block.mark_value}")
    run = page_runs.get(block.page)
    if run is None:
        copy = guide_workspace.parent / f"page-{Path(block.page).stem}"
        shutil.copytree(guide_workspace, copy, symlinks=True)
        run = page_runs[block.page] = _PageRun(copy / "build" / "demo", {"__name__": "__docs__"})
    if run.failed:
        pytest.skip(f"an earlier block of {block.page} failed ({run.failed}); this one builds on it")
    monkeypatch.chdir(run.cwd)
    try:
        if block.mark == "file":
            target = run.cwd / block.mark_value
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code + "\n", encoding="utf-8")
        elif block.lang == "bash":
            _run_bash(block, monkeypatch)
        else:
            _run_python(block, run)
    except BaseException:
        run.failed = block.id
        raise


def test_every_guide_block_is_run_or_marked():
    """No block silently escapes: languages are known, fences start in column 0, marks carry a reason,
    and every guide runs most of its code."""
    problems = []
    for page in sorted(GUIDES.glob("*.md")):
        text = page.read_text("utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            if re.match(r"^\s+`{3,}", line):
                problems.append(f"{page.name}:{number}: an indented code fence is not run by this test")
            if "<!--" in line and re.search(r"no-run|file:", line) and not _MARK.match(line.strip()):
                problems.append(
                    f"{page.name}:{number}: write the mark as <!-- no-run: REASON --> or <!-- file: NAME -->"
                )
        blocks = parse_blocks(page.name, text)
        for b in blocks:
            if b.lang not in KNOWN_LANGS:
                problems.append(f"{b.id}: code block language {b.lang or '(none)'!r}; use one of {KNOWN_LANGS} "
                                "(python and bash run, text is output)")
            if b.mark and not b.mark_value:
                problems.append(f"{b.id}: a {b.mark} mark needs a value")
        code = [b for b in blocks if b.lang in RUN_LANGS]
        skipped = [b for b in code if b.mark == "no-run"]
        if page.name != "ray.md" and len(skipped) * 2 > len(code):  # ray.md is about a cluster
            problems.append(f"{page.name}: {len(skipped)} of {len(code)} code blocks are no-run; keep such blocks few")
    assert not problems, "\n".join(problems)


def test_parse_blocks_reads_marks_and_fences():
    text = ("Intro.\n\n<!-- no-run: needs a GPU -->\n```python\nmodel.cuda()\n```\n\n"
            "<!-- file: a.json -->\n````json\n{\"a\": \"```\"}\n````\n\n```bash\nwdspack --version\n```\n")
    blocks = parse_blocks("x.md", text)
    assert [(b.line, b.lang, b.mark, b.mark_value) for b in blocks] == [
        (4, "python", "no-run", "needs a GPU"), (9, "json", "file", "a.json"), (13, "bash", None, "")]
    assert blocks[1].code == '{"a": "```"}'


def test_api_reference_documents_exactly_all():
    import wdspack

    text = (ROOT / "docs" / "reference" / "api.md").read_text("utf-8")
    documented = set(re.findall(r"^::: wdspack\.(\w+)\s*$", text, flags=re.MULTILINE))
    assert set(wdspack.__all__) - documented == set(), "add a '::: wdspack.NAME' entry to docs/reference/api.md"
    assert documented - set(wdspack.__all__) == set(), "docs/reference/api.md documents names wdspack no longer exports"


def test_cli_reference_renders_every_subcommand():
    spec = importlib.util.spec_from_file_location("cli_reference_hook", ROOT / "docs" / "hooks" / "cli_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    columns = os.environ.get("COLUMNS")
    page = hook.render_cli_reference()
    assert os.environ.get("COLUMNS") == columns  # the hook puts $COLUMNS back
    for name in ("pack", "inspect", "verify", "index", "reshard", "upload"):
        assert f"## wdspack {name}\n" in page
        assert f"usage: wdspack {name} " in page
    assert "--max-drop-fraction" in page and "--split-long-documents" in page  # options come from the parser


def _slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub) give a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-")


def test_readme_links_resolve():
    """The README is the front door: every relative link it has points at a file, and an anchor at a heading."""
    readme = (ROOT / "README.md").read_text("utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert any(link.startswith("docs/") for link in links)
    problems = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            problems.append(f"{link}: no file {path}")
        elif anchor and target.suffix == ".md":
            headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", target.read_text("utf-8"), flags=re.MULTILINE)
            if anchor not in {_slug(h) for h in headings}:
                problems.append(f"{link}: {path} has no heading #{anchor}")
    assert not problems, "\n".join(problems)


# -- the CLI reference page and the pack guide's synopsis stay complete ----------------------------

def _option_actions(parser) -> list:
    """The parser's options (not positionals, not --help), in its order."""
    return [a for a in parser._actions if a.option_strings and "--help" not in a.option_strings]


def _commands(parser) -> dict:
    """``name -> parser`` of each subcommand."""
    import argparse

    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _wdspack_help(monkeypatch, capsys, *command: str) -> str:
    """What ``wdspack COMMAND --help`` prints at the reference's 100 columns."""
    from wdspack.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    capsys.readouterr()
    assert main([*command, "--help"]) == 0
    return capsys.readouterr().out.rstrip()


def test_cli_reference_page_is_what_wdspack_help_prints(monkeypatch, capsys):
    """docs/reference/cli.md holds every command's ``--help`` verbatim (generated by ``python -m
    tools.cli_reference``), so it reads whole on GitHub and cannot drift from the CLI. argparse lays help
    out differently across Python versions: on another version than the page's, its commands and options
    are checked, not its layout."""
    from tools import cli_reference
    from wdspack.cli import _parser

    page = cli_reference.PAGE.read_text("utf-8")
    found = cli_reference.generated(page)
    assert found is not None, "docs/reference/cli.md lost its generated region: run python -m tools.cli_reference"
    version, body = found
    sections = dict(re.findall(r"^## (wdspack(?: [\w-]+)?)\n.*?^```text\n(.*?)\n^```$", body, re.M | re.S))
    parser = _parser()
    commands = _commands(parser)
    stale = "docs/reference/cli.md is stale: run python -m tools.cli_reference"
    assert list(sections) == ["wdspack", *(f"wdspack {name}" for name in commands)], stale
    for name, sub in commands.items():
        missing = [a.option_strings[-1] for a in _option_actions(sub)
                   if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", sections[f"wdspack {name}"])
                              for o in a.option_strings)]
        assert not missing, f"wdspack {name}: {missing} missing from the page; {stale}"
    if version != f"{sys.version_info.major}.{sys.version_info.minor}":
        return
    assert sections["wdspack"] == _wdspack_help(monkeypatch, capsys), stale
    for name in commands:
        assert sections[f"wdspack {name}"] == _wdspack_help(monkeypatch, capsys, name), f"wdspack {name}: {stale}"


def test_cli_reference_tool_finds_a_stale_page(tmp_path, monkeypatch, capsys):
    """``python -m tools.cli_reference --check`` answers a stale page in one line naming the fix, and a
    rewrite makes it current."""
    from tools import cli_reference

    page = tmp_path / "docs" / "reference" / "cli.md"
    page.parent.mkdir(parents=True)
    text = cli_reference.PAGE.read_text("utf-8")
    assert "## wdspack pack\n" in text
    page.write_text(text.replace("## wdspack pack\n", "## wdspack pack\n\nhand-edited\n"), "utf-8")
    monkeypatch.setattr(cli_reference, "PAGE", page)
    monkeypatch.setattr(cli_reference, "ROOT", tmp_path)
    capsys.readouterr()
    assert cli_reference.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err == "docs/reference/cli.md is stale: run python -m tools.cli_reference\n"
    assert cli_reference.main([]) == 0 and cli_reference.main(["--check"]) == 0
    assert "hand-edited" not in page.read_text("utf-8")


def test_pack_guide_synopsis_lists_every_pack_option():
    """docs/guides/pack.md's synopsis names every option ``wdspack pack --help`` has (by its long name),
    with its choices, so a new option cannot go unmentioned."""
    from wdspack.cli import _parser

    text = (GUIDES / "pack.md").read_text("utf-8")
    section = text.split("\n## What the options do\n", 1)[1]
    synopsis = next(b.code for b in parse_blocks("pack.md", section) if b.lang == "text")
    assert synopsis.startswith("wdspack pack SOURCE... ")
    problems = []
    for action in _option_actions(_commands(_parser())["pack"]):
        name = max(action.option_strings, key=len)
        shown = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])(?P<arg> [^\]\s)]+)?", synopsis)
        if shown is None:
            problems.append(f"{name} is missing")
        elif action.choices and (shown["arg"] or "").strip() != "|".join(action.choices):
            arg = (shown["arg"] or "").strip()
            problems.append(f"{name} shows {arg!r}, not its choices {'|'.join(action.choices)}")
    assert not problems, "docs/guides/pack.md, 'What the options do': " + "; ".join(problems)
