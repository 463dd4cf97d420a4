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
from itertools import chain
from operator import call
from typing import Any, Generic, TypeVar

__all__ = ["IdentityMemo"]

V = TypeVar("V")

_Key = tuple[int, ...]


class IdentityMemo(Generic[V]):
    """``compute()`` once per combination of live objects (at most ``limit`` entries).

    The objects must be immutable in what ``compute`` reads (frozen models) and support
    weak references.
    """

    def __init__(self, limit: int = 8192) -> None:
        self._entries: dict[_Key, tuple[tuple[weakref.ref[object], ...], V]] = {}
        self._limit = limit

    def get(self, groups: Sequence[Sequence[Any]], compute: Callable[..., V]) -> V:
        """The value for ``groups`` (sequences of objects; their order and lengths count):
        ``compute(*groups)`` once while they live."""
        objects = [*chain.from_iterable(groups)]
        key: _Key = (*map(len, groups), *map(id, objects))
        entry = self._entries.get(key)
        # an entry goes with the first of its objects to die, so a live entry's objects are
        # these very ones (equal ids of live objects); checked all the same, cheaply
        if entry is not None and list(map(call, entry[0])) == objects:
            return entry[1]
        value = compute(*groups)
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
