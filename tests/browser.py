"""Headless Chromium for the page tests: render a URL (or a file), dump its DOM, take a
screenshot, and decode a PNG without extra libraries."""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import zlib

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=30000",
    "--window-size=1600,1000",
]


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install chromium): screenshot skipped")
    return binary


def browse(binary: str, url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            timeout=120,
            check=False,
        )


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit, non-interlaced RGB(A)/grey PNG into (width, height, pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0, "unexpected PNG format"
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    stride = width * bpp
    raw = zlib.decompress(b"".join(chunks))
    prev = bytearray(stride)
    pixels: list[bytes] = []
    for y in range(height):
        kind_byte = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind_byte == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif kind_byte in (1, 3, 4):  # Sub, Average, Paeth
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up, corner = prev[i], (prev[i - bpp] if i >= bpp else 0)
                if kind_byte == 1:
                    pred = left
                elif kind_byte == 3:
                    pred = (left + up) >> 1
                else:
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
        if y % 4 == 0:
            pixels.extend(bytes(line[x : x + bpp]) for x in range(0, stride, bpp * 4))
        prev = line
    return width, height, pixels
