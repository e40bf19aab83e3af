"""MkDocs hook: the generated parts of the site.

- ``reference/cli.md``: :func:`render_cli_reference` gives ``wdspack --help`` and ``wdspack COMMAND
  --help`` of every subcommand the parser has (``wdspack.cli``); ``python -m tools.cli_reference``
  writes it into the page (checked in, so it reads whole on GitHub) and ``tests/test_docs.py`` fails
  when the page differs from the CLI. A page holding the bare ``<!-- cli-reference -->`` marker
  still gets it at build time.
- ``reference/api.md``: its ``::: wdspack.NAME`` entries must be exactly ``wdspack.__all__``; a
  name missing (or one no longer exported) is a warning, which ``mkdocs build --strict`` (``make
  docs``) turns into a failed build.

Registered in ``mkdocs.yml`` under ``hooks:``; ``exclude_docs`` keeps this file out of the site.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
from typing import Any

# Under the "mkdocs" logger, so that --strict counts these warnings.
log = logging.getLogger("mkdocs.hooks.wdspack")

CLI_MARKER = "<!-- cli-reference -->"
HELP_COLUMNS = "100"  # argparse wraps to $COLUMNS: a fixed width keeps the page the same on every machine


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, one-line help, parser)`` of each subcommand, in the parser's order."""
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _help_text(parser: argparse.ArgumentParser) -> str:
    """What ``--help`` prints for ``parser``."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            parser.print_help()
        return out.getvalue().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def render_cli_reference() -> str:
    """Markdown for every command: a heading, its one-line summary, its ``--help`` verbatim."""
    from wdspack import cli

    parser = cli._parser()
    commands = _subcommands(parser)
    if not commands:
        log.warning("wdspack.cli's parser has no subcommands: the CLI reference would be empty")
    parts = ["## wdspack", "", "```text", _help_text(parser), "```", ""]
    for name, summary, sub in commands:
        parts += [f"## wdspack {name}", "", f"{summary[:1].upper()}{summary[1:]}." if summary else "",
                  "", "```text", _help_text(sub), "```", ""]
    return "\n".join(parts)


def check_api_reference(markdown: str) -> None:
    """Warn for each name of ``wdspack.__all__`` without a ``::: wdspack.NAME`` entry, and back."""
    import wdspack

    documented = set(re.findall(r"^::: wdspack\.(\w+)\s*$", markdown, flags=re.MULTILINE))
    exported = set(wdspack.__all__)
    for name in sorted(exported - documented):
        log.warning(f"reference/api.md: wdspack.{name} is in wdspack.__all__ but has no '::: wdspack.{name}' entry")
    for name in sorted(documented - exported):
        log.warning(f"reference/api.md: '::: wdspack.{name}' documents a name that wdspack.__all__ does not export")


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    path = page.file.src_uri
    if path == "reference/api.md":
        check_api_reference(markdown)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, render_cli_reference())
    return markdown
