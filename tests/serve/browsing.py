"""Helpers of the web console's browser tests (their fixtures: :mod:`tests.serve._browser`): a
real ``kafkakv serve`` process on an embedded log, other processes writing to that log, a
browser tab that records what it did, and a PNG decoder for screenshots.

Nothing here is a stand-in: the server is the ``kafkakv serve`` command, the writers are
separate Python processes using the public API, and the browser is the system's chromium
(``apt-get install chromium``; ``scripts/test`` installs it as root). Without it the tests
fail, saying so: they are never skipped.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

import kafkakv
from tests.serve.conftest import ServerProcess, start_server

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "ConsolePage",
    "ServeProcess",
    "png_pixels",
    "start_serve",
    "write_map",
    "write_topic",
]

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's chromium: the browser the console is tested in (Playwright downloads nothing)."""

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

SRC = Path(kafkakv.__file__).resolve().parents[1]
"""The ``src`` directory of the kafkakv under test: the processes started here import it too."""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- the server --------------------------------------------------------------------------------


@dataclass
class ServeProcess:
    """``python -m kafkakv serve`` on the embedded log in ``logdir``, started by
    :func:`tests.serve.conftest.start_server`; ``url`` ends with ``/``."""

    process: ServerProcess
    logdir: Path

    @property
    def url(self) -> str:
        return self.process.url + "/"

    def stop(self) -> None:
        """SIGTERM: the server drains and exits."""
        self.process.stop()


def start_serve(logdir: Path, *args: str, port: int = 0) -> ServeProcess:
    """Serve ``logdir`` (more ``kafkakv serve`` options in ``args``) on 127.0.0.1, on a free
    port unless ``port`` is given."""
    return ServeProcess(start_server(str(logdir), *args, port=port), logdir)


# --- other processes that write -----------------------------------------------------------------

_WRITER = """
import json, sys
import kafkakv
logdir, name, partitions, items, removed = sys.argv[1:]
with kafkakv.connect(logdir) as db:
    m = db.map(name, partitions=int(partitions))
    for key, value in json.loads(items):
        m[key] = value
    for key in json.loads(removed):
        del m[key]
"""


def write_map(
    logdir: Path,
    name: str,
    items: dict[str, Any],
    *,
    removed: tuple[str, ...] = (),
    partitions: int = 1,
) -> None:
    """Write ``items`` to map ``name`` (created with ``partitions`` if new) and remove
    ``removed``, from a separate Python process using ``kafkakv.connect(logdir).map(name)``
    (str keys, JSON values: the server's default codecs). Returns once every write is
    acknowledged: it is in the log."""
    _run_python(
        _WRITER,
        str(logdir),
        name,
        str(partitions),
        json.dumps(list(items.items())),
        json.dumps(list(removed)),
    )


_TOPIC_WRITER = """
import json, sys
import kafkakv
from kafkakv.log import Record
logdir, topic, records = sys.argv[1:]
with kafkakv.connect(logdir) as db:
    db.log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    db.log.append(topic, 0, [Record(k.encode(), bytes.fromhex(v)) for k, v in json.loads(records)])
"""


def write_topic(logdir: Path, topic: str, records: dict[str, bytes]) -> None:
    """Create the compacted topic ``topic`` (one partition) and append ``records`` to it as
    they are, from a separate process: a table fed by another program, which the server
    serves as a directory."""
    encoded = json.dumps([[k, v.hex()] for k, v in records.items()])
    _run_python(_TOPIC_WRITER, str(logdir), topic, encoded)


def _run_python(code: str, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=_child_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"the writer process failed ({result.returncode}):\n{result.stderr.decode()}")


# --- the browser --------------------------------------------------------------------------------


@dataclass
class ConsolePage:
    """A fresh browser tab (its own session storage) that records what the page did wrong
    (uncaught errors, console errors) and every URL it requested."""

    page: Page
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def open(self, server: ServeProcess, fragment: str = "") -> Page:
        """Open the console of ``server`` (at ``#map/NAME`` with ``fragment="map/NAME"``)."""
        self.page.goto(server.url + (f"#{fragment}" if fragment else ""))
        return self.page

    def check_clean(self, server: ServeProcess) -> None:
        """The page raised nothing and asked nothing of any other origin than ``server``."""
        assert self.errors == [], f"the page reported errors: {self.errors}"
        elsewhere = [u for u in self.requests if not u.startswith((server.url, "data:"))]
        assert elsewhere == [], f"the page fetched from outside the server: {elsewhere}"


# --- screenshots ----------------------------------------------------------------------------------


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB or RGBA PNG (what chromium's screenshots are): its width, height
    and rows of pixels, 4 bytes per pixel (RGB gets an opaque alpha). Fails on anything else,
    rather than guessing. Pure Python: ``zlib`` and ``struct``."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos = 8
    header = b""
    idat = bytearray()
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 4 if colour == 6 else 3
    stride = width * bpp
    raw = zlib.decompress(bytes(idat))
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(kind, line, previous, bpp)
        rows.append(bytes(line) if bpp == 4 else _with_alpha(line))
        previous = line
    return width, height, rows


def _unfilter(kind: int, line: bytearray, previous: bytearray, bpp: int) -> None:
    """Undo one scanline's PNG filter in place (types 0-4 of the PNG specification)."""
    n = len(line)
    if kind == 0:
        return
    if kind == 1:  # Sub
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:  # Up
        for i in range(n):
            line[i] = (line[i] + previous[i]) & 0xFF
    elif kind == 3:  # Average
        for i in range(n):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
    elif kind == 4:  # Paeth
        for i in range(n):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    else:
        raise AssertionError(f"unknown PNG filter type {kind}")


def _with_alpha(line: bytearray) -> bytes:
    out = bytearray()
    for i in range(0, len(line), 3):
        out += line[i : i + 3] + b"\xff"
    return bytes(out)
