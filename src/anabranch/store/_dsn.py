"""PostgreSQL connection strings: recognise them and hide their passwords.

A DSN's password never leaves this process in text: everything that prints, logs or
stores a DSN goes through ``redact_dsn`` first. TLS settings (``sslmode``,
``sslrootcert``, ...) are ordinary DSN parameters and reach libpq unchanged.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["is_postgres_url", "redact_dsn", "resumable_db"]

_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def is_postgres_url(db: object) -> bool:
    """Whether ``db`` names a PostgreSQL database (a ``postgresql://`` URL)."""
    return isinstance(db, str) and db.strip().lower().startswith(_SCHEMES)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password (in the authority or as a ``password`` parameter)
    replaced by ``***``."""
    if "://" not in dsn:  # libpq keyword form: host=... password=...
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    try:
        parts = urllib.parse.urlsplit(dsn)
    except ValueError:
        return "postgresql://***"
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(key.lower() == "password" for key, _ in query):
        cleaned = [(k, "***" if k.lower() == "password" else v) for k, v in query]
        parts = parts._replace(query=urllib.parse.urlencode(cleaned, safe="*/"))
    return urllib.parse.urlunsplit(parts)


def resumable_db(db: str) -> str:
    """``db`` as it may go into a command for the user to run: a DSN loses its password
    altogether (libpq then reads it from ``PGPASSWORD`` or ``~/.pgpass``)."""
    if not is_postgres_url(db) or "://" not in db:
        return db
    try:
        parts = urllib.parse.urlsplit(db)
    except ValueError:
        return redact_dsn(db)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k.lower() != "password"]
    if len(kept) != len(query):
        parts = parts._replace(query=urllib.parse.urlencode(kept, safe="/"))
    return urllib.parse.urlunsplit(parts)
