"""The PostgreSQL backend (``pip install 'anabranch[postgres]'``): psycopg 3."""

from anabranch.store.postgres._store import PostgresStore as PostgresStore
from anabranch.store.postgres._workers import Pulse as Pulse
from anabranch.store.postgres._workers import WorkerRegistry as WorkerRegistry

__all__ = ["PostgresStore", "Pulse", "WorkerRegistry"]
