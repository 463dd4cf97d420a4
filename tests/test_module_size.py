"""Small modules with one job: none of the package's modules grows past 600 lines."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "anabranch"
LIMIT = 600


def test_no_module_is_over_the_limit() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 50  # the walk found the package
    over = {name: lines for name, lines in sizes.items() if lines > LIMIT}
    assert over == {}, f"split these along their seams (limit {LIMIT} lines): {over}"
