"""Content-addressed storage of image and document payloads.

A message (or boundary prefix, or tool event) that carries an image or a document keeps a
reference ``"blob": "sha256:<hex>"`` in place of its base64 ``data``; the payload is stored
once in ``blobs``, in the same transaction as the row that refers to it, however many
messages, requests or compacted contexts repeat it. Reading puts the payload back, so the
JSON a caller gets is the JSON it wrote (up to key order).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["BLOB_COLUMNS", "dehydrate", "hydrate_rows"]

BLOB_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "messages": ("content",),
    "boundaries": ("prefix",),
    "tool_events": ("attachments",),
    "spills": ("content",),
}
"""The JSON columns, by table, whose images and documents are stored as blobs."""
_JSON_COLUMNS = frozenset(c for columns in BLOB_COLUMNS.values() for c in columns)
_KINDS = frozenset({"image", "document"})
_REF = '"blob":"sha256:'


def _payload_blocks(value: Any) -> Iterator[dict[str, Any]]:
    """Every image or document object (at any depth) that carries inline ``data``."""
    if isinstance(value, dict):
        if value.get("type") in _KINDS and isinstance(value.get("data"), str):
            yield value
        for item in value.values():
            yield from _payload_blocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from _payload_blocks(item)


def _ref_blocks(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if value.get("type") in _KINDS and isinstance(value.get("blob"), str):
            yield value
        for item in value.values():
            yield from _ref_blocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from _ref_blocks(item)


def _decoded_size(data: str) -> int:
    """Bytes behind a base64 string (without decoding it)."""
    return len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dehydrate(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each payload moved to ``blobs`` (inside ``conn``'s transaction)."""
    columns = BLOB_COLUMNS.get(table, ())
    if table == "spills" and not str(values.get("handle", "")).endswith(".attachments"):
        return values  # a spilled text is kept exactly as written
    out = values
    for column in columns:
        text = values.get(column)
        if not isinstance(text, str) or '"data":' not in text:
            continue
        document = json.loads(text)
        blocks = list(_payload_blocks(document))
        if not blocks:
            continue
        for block in blocks:
            data = block.pop("data")
            digest = "sha256:" + hashlib.sha256(data.encode()).hexdigest()
            conn.execute(
                "INSERT OR IGNORE INTO blobs(digest, data, size, created) VALUES (?, ?, ?, ?)",
                (digest, data, _decoded_size(data), time.time()),
            )
            block["blob"] = digest
        out = {**out, column: _dumps(document)}
    return out


def hydrate_rows(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with every blob reference in a JSON column replaced by its payload."""
    wanted: list[tuple[dict[str, Any], str, Any]] = []
    for row in rows:
        for column, text in row.items():
            if column not in _JSON_COLUMNS or not isinstance(text, str) or _REF not in text:
                continue
            try:
                wanted.append((row, column, json.loads(text)))
            except ValueError:
                continue  # a text that only mentions a blob
    if not wanted:
        return rows
    refs = [(block, doc) for _, _, doc in wanted for block in _ref_blocks(doc)]
    digests = sorted({str(block["blob"]) for block, _ in refs})
    found: dict[str, str] = {}
    for start in range(0, len(digests), 500):
        chunk = digests[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT digest, data FROM blobs WHERE digest IN ({marks})"
        found.update(conn.execute(sql, chunk).fetchall())
    for block, _ in refs:
        digest = block.pop("blob")
        if digest not in found:
            raise LookupError(f"blob {digest} is missing from the store")
        block["data"] = found[digest]
    for row, column, document in wanted:
        row[column] = _dumps(document)
    return rows
