"""The store conformance suite: what every ``anabranch.store.Store`` backend must pass.

Every test here takes the ``backend`` fixture (or the ``store`` fixture opened from it),
parametrized over ``BACKENDS`` in ``conftest.py``, and talks to the store only through the
``Store`` protocol. Backend-specific knowledge (where the database lives, how to count its
committed transactions, how to make a database at an older schema) sits in one
``Backend`` object per implementation.

Adding a backend is one line: write a factory ``async with factory(tmp_path) as backend``
yielding a ``Backend`` (see ``sqlite_backend`` in ``conftest.py``; put yours in its own
module, e.g. ``tests/store_conformance/_postgres.py``) and append
``pytest.param(factory, id="<name>")`` to ``BACKENDS``. Nothing else changes: the tests
run unchanged on every backend, on asyncio and trio.

What is covered:
- ``test_write_ahead``: a write is durable when it returns (another connection sees it);
  a call's messages and row are committed before the request is sent; in-flight calls
  are closed as interrupted; a call's outcome, assistant message and tool events commit
  together.
- ``test_append_only``: history is never overwritten (a duplicate seq fails and leaves the
  first row); a failing write leaves none of its rows; statuses are appended.
- ``test_group_commit``: concurrent writes share transactions (counted by the backend,
  not by the store's own bookkeeping), yet each stays atomic and isolated, and a
  cancelled writer's write is committed whole.
- ``test_leases``: one live owner at a time, renewal, release, take-over after expiry.
- ``test_history_search``: full-text search over one run's messages and spills.
- ``test_context_limits``: limits a channel taught, by (model, channel); each run's limit.
- ``test_migrations``: a new database is at the current schema; an older one is migrated
  keeping its rows; a newer or foreign one is refused without being written.
"""
