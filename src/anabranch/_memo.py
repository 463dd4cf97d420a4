"""``IdentityMemo``: values derived from immutable objects, reused while the very same
objects are asked about again, without keeping any of them alive.

A run sends its snapshot's system blocks and tool list with every call, and with a
thousand runs interleaved a small "last few tuples" cache never hits. Keyed by the objects'
identities instead, every live run finds its entry; an entry goes away with the first of
its objects to die (a weak reference's callback), so nothing stale stays behind and no id
can be reused by a different object while its entry exists.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["IdentityMemo"]

V = TypeVar("V")

_Key = tuple[int, ...]


def _same(refs: tuple[weakref.ref[object], ...], objects: list[object]) -> bool:
    for ref, item in zip(refs, objects, strict=True):
        if ref() is not item:
            return False
    return True


class IdentityMemo(Generic[V]):
    """``compute()`` once per combination of live objects (at most ``limit`` entries).

    The objects must be immutable in what ``compute`` reads (frozen models) and support
    weak references.
    """

    def __init__(self, limit: int = 8192) -> None:
        self._entries: dict[_Key, tuple[tuple[weakref.ref[object], ...], V]] = {}
        self._limit = limit

    def get(self, groups: Sequence[Sequence[object]], compute: Callable[[], V]) -> V:
        """The value for ``groups`` (sequences of objects; their order and lengths count)."""
        key: _Key = tuple(len(g) for g in groups)
        for group in groups:
            key += tuple(map(id, group))
        entry = self._entries.get(key)
        objects = [item for group in groups for item in group]
        if entry is not None and _same(entry[0], objects):
            return entry[1]
        value = compute()
        entries = self._entries

        def forget(_ref: weakref.ref[object]) -> None:
            entries.pop(key, None)

        entries[key] = (tuple(weakref.ref(item, forget) for item in objects), value)
        while len(entries) > self._limit:
            del entries[next(iter(entries))]
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
