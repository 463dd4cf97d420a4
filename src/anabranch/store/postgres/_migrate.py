"""Opening a PostgreSQL store: check the ``anabranch`` schema and migrate it forward."""

from __future__ import annotations

import re

from anabranch.errors import DatabaseError
from anabranch.store.postgres._connection import Conn
from anabranch.store.postgres._schema import APP_ID, MIGRATIONS, SCHEMA, SCHEMA_VERSION

__all__ = ["migrate"]

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def migrate(conn: Conn, create: bool, where: str) -> None:
    """Check the ``anabranch`` schema and bring it to ``SCHEMA_VERSION`` (one transaction,
    serialised across processes by an advisory lock)."""
    assert _SCHEMA_NAME.match(SCHEMA)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('anabranch.migrate'))")
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone()
        version = 0
        if exists:
            has_meta = conn.execute(
                "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'meta'", (SCHEMA,)
            ).fetchone()
            meta = (
                {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM meta")}
                if has_meta
                else {}
            )
            if meta.get("app") != APP_ID:
                raise DatabaseError(f"schema {SCHEMA} in {where} is not an anabranch store")
            version = int(meta.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise DatabaseError(
                    f"{where} has anabranch schema version {version}, newer than this "
                    f"anabranch understands ({SCHEMA_VERSION}); upgrade anabranch"
                )
        elif not create:
            raise DatabaseError(f"no anabranch store in {where}")
        if version == SCHEMA_VERSION:
            return
        if not create:
            raise DatabaseError(f"{where} needs a schema migration: open it with create=True")
        if not exists:
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
        for script in MIGRATIONS[version:]:
            conn.execute(script)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('app', %s), ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (APP_ID, str(SCHEMA_VERSION)),
        )
