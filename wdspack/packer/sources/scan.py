"""Find record boundaries in JSON Lines and JSON-array files without parsing any JSON.

Both scanners read fixed-size binary blocks and let numpy find the interesting bytes, so a
gigabyte file is split in seconds. They work on raw bytes: in UTF-8 no byte of a multi-byte
character is ASCII, so ``\\n``, ``"``, ``\\\\``, brackets and commas are always the real thing.

JSON Lines — a record is a line with something other than whitespace on it::

    offset  0              12             24  25
            {"id": "a"}\\n  {"id": "b"}\\n  \\n  {"id": "c"}\\n
    row     0              1              -   2

JSON arrays — a record is a top-level element, found between the opening ``[``, the commas at
depth 1 outside strings, and the closing ``]``::

    [ {"t": "a, [b]"} , {"t": "\\"]"} ]
    ^                 ^              ^      separators 0, 18, 33 → 2 elements
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

__all__ = ["ArrayLayout", "array_separators", "jsonl_boundaries", "split_array_chunk"]

BLOCK_BYTES = 8 << 20
_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\r\n"
_QUOTE, _BACKSLASH, _COMMA = 0x22, 0x5C, 0x2C
_OPEN = (0x5B, 0x7B)   # [ {
_CLOSE = (0x5D, 0x7D)  # ] }


@contextmanager
def _mapped(path: str) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, memory-mapped (an empty file cannot be mapped: it is ``b""``)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            yield b""
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm
        finally:
            with suppress(BufferError):  # numpy views of it are still alive; it closes when they go
                mm.close()


def _is_blank(line: bytes) -> bool:
    return not line.strip(_WHITESPACE)


def jsonl_boundaries(path: str, *, every: int, block_bytes: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """Byte offsets and row indices of every ``every``-th record of a JSON Lines file.

    Row indices count records (non-blank lines) from 0 at the start of the file, so they do not
    depend on ``every``. A partition runs from one boundary's offset to the next (or to EOF).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.jsonl")
        >>> _ = open(p, "wb").write(b'{"a": 1}\\n\\n{"a": 2}\\n{"a": 3}\\n')
        >>> jsonl_boundaries(p, every=2)
        [(0, 0), (19, 2)]
    """
    out: list[tuple[int, int]] = []
    count = 0
    with _mapped(path) as data:
        size = len(data)
        line_start = 0
        for off in range(0, size, block_bytes):
            block = np.frombuffer(data, np.uint8, min(block_bytes, size - off), off)
            ends = np.flatnonzero(block == 0x0A) + off
            if not len(ends):
                continue
            starts = np.concatenate(([line_start], ends[:-1] + 1))
            starts = _drop_blank(data, starts, ends)
            rows = count + np.arange(len(starts))
            picked = (rows % every) == 0
            out.extend(zip(starts[picked].tolist(), rows[picked].tolist()))
            count += len(starts)
            line_start = int(ends[-1]) + 1
        if line_start < size and not _is_blank(_without_bom(data, line_start, size)) and count % every == 0:
            out.append((line_start, count))
    return out


def _drop_blank(data: bytes | mmap.mmap, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The line starts whose line holds more than whitespace (blank lines are not records).

    Only a line that is empty, starts with whitespace, or starts the file (a BOM) can be blank;
    those few are checked one by one.
    """
    whole = np.frombuffer(data, np.uint8)
    first = whole[np.minimum(starts, len(whole) - 1)]
    maybe = np.flatnonzero((ends == starts) | _SPACE[first] | (starts == 0))
    if not len(maybe):
        return starts
    keep = np.ones(len(starts), bool)
    for i in maybe.tolist():
        keep[i] = not _is_blank(_without_bom(data, int(starts[i]), int(ends[i])))
    return starts[keep]


def _without_bom(data: bytes | mmap.mmap, start: int, stop: int) -> bytes:
    line = data[start:stop]
    return line[len(_BOM):] if start == 0 and line.startswith(_BOM) else line


@dataclass(frozen=True, slots=True)
class ArrayLayout:
    """Where the top-level elements of a JSON array are.

    ``separators`` holds the offset of the ``[``, of every top-level ``,`` and of the ``]``;
    element ``k`` is the bytes strictly between ``separators[k]`` and ``separators[k + 1]``.
    """

    separators: np.ndarray
    count: int


@dataclass(slots=True)
class _ScanState:
    depth: int = 0
    in_string: bool = False
    backslashes: int = 0  # length of the run of backslashes that ended the previous block


def array_separators(path: str, *, block_bytes: int = BLOCK_BYTES) -> ArrayLayout | str:
    """Scan a JSON array file for the separators of its top-level elements.

    Returns the layout, or a one-line reason why the file is not one JSON array (the caller
    names the file). Elements are not validated: a bad element is found, and dropped, when read.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.json")
        >>> _ = open(p, "wb").write(b'[{"t": "a,]"}, {"t": 2}]')
        >>> array_separators(p).separators.tolist()
        [0, 13, 23]
    """
    with _mapped(path) as data:
        size = len(data)
        head = 0
        while head < size and data[head:head + 3] == _BOM:
            head += 3
        state = _ScanState()
        found: list[np.ndarray] = []
        for off in range(head, size, block_bytes):
            block = np.frombuffer(data, np.uint8, min(block_bytes, size - off), off)
            found.append(_block_separators(block, off, state, top=1, with_brackets=True))
        seps = np.concatenate(found) if found else np.zeros(0, np.int64)
        return _check_array(data, head, seps, state)


def _check_array(data: bytes | mmap.mmap, head: int, seps: np.ndarray,
                 state: _ScanState) -> ArrayLayout | str:
    size = len(data)
    first = _first_non_blank(data, head)
    if first >= size or data[first] != 0x5B:
        return "it does not start with '[' (expected a JSON array of records)"
    if state.in_string:
        return "a string is not closed at the end of the file"
    if state.depth != 0 or len(seps) < 2 or data[int(seps[-1])] != 0x5D:
        return "its brackets do not balance (truncated file?)"
    inner = np.frombuffer(data, np.uint8)[seps[1:-1]]
    if seps[0] != first or not (inner == _COMMA).all() or not _is_blank(data[int(seps[-1]) + 1:size]):
        return "there is more than one top-level value, or stray brackets between the elements"
    count = len(seps) - 1
    if count == 1 and _is_blank(data[int(seps[0]) + 1:int(seps[1])]):
        count = 0
    return ArrayLayout(separators=seps, count=count)


def _first_non_blank(data: bytes | mmap.mmap, pos: int) -> int:
    while pos < len(data):
        piece = data[pos:pos + 4096]
        rest = piece.lstrip(_WHITESPACE)
        if rest:
            return pos + len(piece) - len(rest)
        pos += len(piece)
    return pos


def split_array_chunk(chunk: bytes) -> list[bytes]:
    """Split the bytes between two top-level separators of an array into its elements.

    Example:
        >>> split_array_chunk(b' {"a": [1, 2]}, "x,y" ,3')
        [b' {"a": [1, 2]}', b' "x,y" ', b'3']
    """
    block = np.frombuffer(chunk, np.uint8)
    commas = _block_separators(block, 0, _ScanState(depth=1), top=1, with_brackets=False).tolist()
    bounds = [-1, *commas, len(chunk)]
    return [chunk[a + 1:b] for a, b in pairwise(bounds)]


def _block_separators(block: np.ndarray, off: int, state: _ScanState, *, top: int,
                      with_brackets: bool) -> np.ndarray:
    """Offsets of the commas at depth ``top`` in one block (and, with ``with_brackets``, of the
    brackets that enter or leave depth ``top``), outside strings; advances ``state``."""
    quotes = _unescaped_quotes(block, state)
    structural = np.flatnonzero(_STRUCTURAL[block])
    # A structural byte is inside a string when an odd number of real quotes precede it.
    inside = (np.searchsorted(quotes, structural) + state.in_string) % 2 == 1
    structural = structural[~inside]
    chars = block[structural]
    delta = _DELTA[chars]
    after = state.depth + np.cumsum(delta)
    before = after - delta
    keep = (chars == _COMMA) & (before == top)
    if with_brackets:
        keep |= ((delta == 1) & (before == top - 1)) | ((delta == -1) & (after == top - 1))
    state.depth = int(after[-1]) if len(after) else state.depth
    state.in_string = bool((len(quotes) + state.in_string) % 2)
    return structural[keep] + off


def _unescaped_quotes(block: np.ndarray, state: _ScanState) -> np.ndarray:
    """Positions of the ``"`` in the block not escaped by an odd run of backslashes before them.

    Works on the (sparse) backslash positions only: each backslash gets the length of the run
    it ends; a quote right after a backslash takes that run's length.
    """
    quotes = np.flatnonzero(block == _QUOTE)
    slashes = np.flatnonzero(block == _BACKSLASH)
    carried, state.backslashes = state.backslashes, 0
    if not len(slashes):
        escaped_first = carried % 2 == 1 and len(quotes) and quotes[0] == 0
        return quotes[1:] if escaped_first else quotes
    starts = np.ones(len(slashes), bool)
    starts[1:] = np.diff(slashes) != 1
    run = np.cumsum(starts) - 1
    first_index = np.flatnonzero(starts)[run]
    length = np.arange(len(slashes)) - first_index + 1
    length += np.where(slashes[first_index] == 0, carried, 0)  # a run that began in an earlier block
    if slashes[-1] == len(block) - 1:
        state.backslashes = int(length[-1])
    at = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
    before = np.where(slashes[at] == quotes - 1, length[at], 0)
    before = np.where(quotes == 0, carried, before)
    return quotes[before % 2 == 0]


_SPACE = np.zeros(256, bool)
_SPACE[list(_WHITESPACE)] = True
_STRUCTURAL = np.zeros(256, bool)
_STRUCTURAL[[_COMMA, *_OPEN, *_CLOSE]] = True
_DELTA = np.zeros(256, np.int64)
_DELTA[list(_OPEN)] = 1
_DELTA[list(_CLOSE)] = -1
