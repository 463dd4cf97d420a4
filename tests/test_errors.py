"""The error tree drawn in ``anabranch.errors``'s docstring is the real one, and exported."""

from __future__ import annotations

import re

import anabranch
import anabranch.errors as errors


def _drawn_tree() -> dict[str, str | None]:
    """Each class named in the docstring's tree, with the class drawn as its parent."""
    doc = errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│ ]   |[├└]── )*)([A-Z]\w+)(?:\s|$)", line)
        if not match or not match.group(2).endswith(("Error", "Exceeded")):
            continue
        depth = len(match.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, match.group(2)))
    return parents


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn = _drawn_tree()
    assert drawn, "no tree found in the errors docstring"
    assert sorted(drawn) == sorted(errors.__all__)
    for name, parent in drawn.items():
        cls = getattr(errors, name)
        direct = [base.__name__ for base in cls.__bases__]
        assert direct == [parent or "Exception"], f"{name} derives from {direct}, drawn {parent}"


def test_the_facade_exports_the_whole_tree() -> None:
    for name in errors.__all__:
        assert getattr(anabranch, name) is getattr(errors, name)
        assert name in anabranch.__all__


def test_session_errors_are_not_user_errors() -> None:
    for cls in (errors.SessionBusyError, errors.LeaseLostError):
        assert issubclass(cls, errors.SessionError)
        assert not issubclass(cls, errors.UserError)
