"""Memory files on disk: typed frontmatter with provenance, the index, safety, concurrency."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from pathlib import Path

import pytest

from anabranch.memory import MemoryFolder, MemoryWriteError, Provenance
from anabranch.memory._files import INDEX_FILE, sanitize_name
from anabranch.memory._index import capped_index
from anabranch.memory._secrets import find_secret


def _write(folder: MemoryFolder, name: str, **extra: str) -> None:
    folder.write(
        name=name,
        description=extra.get("description", f"about {name}"),
        type="project",
        content=extra.get("content", f"content of {name}"),
    )


def test_a_memory_file_is_typed_and_stamped_with_where_it_came_from(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path)
    memory, created = folder.write(
        name="Prefers Metric Units",
        description="The user wants metric units",
        type="user",
        content="Asked twice for kilometres.",
        source=Provenance(session_id="sess-1", run_id="run-1", message_seq=7),
    )
    assert created and memory.name == "prefers-metric-units"
    text = (tmp_path / "prefers-metric-units.md").read_text()
    assert text.startswith("---\nname: prefers-metric-units\n")
    for line in ("type: user", "source_session: sess-1", "source_run: run-1", "source_message: 7"):
        assert line in text
    again = folder.read("prefers-metric-units")
    assert again is not None and again.source.message_seq == 7 and again.type == "user"
    index = (tmp_path / INDEX_FILE).read_text()
    assert "- [prefers-metric-units](prefers-metric-units.md): The user wants metric units" in index

    updated, created = folder.write(
        name="prefers-metric-units", description="Metric, always", type="user", content="km"
    )
    assert not created and updated.created == memory.created
    assert "Metric, always" in (tmp_path / INDEX_FILE).read_text()
    assert folder.forget("prefers-metric-units")
    assert not (tmp_path / "prefers-metric-units.md").exists()
    assert "prefers-metric-units" not in (tmp_path / INDEX_FILE).read_text()
    assert not folder.forget("prefers-metric-units")


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("../../etc/passwd", "etc-passwd"),
        (".hidden", "hidden"),
        ("a/b\\c", "a-b-c"),
        ("X Y", "x-y"),
    ],
)
def test_names_cannot_escape_the_folder_or_hide(tmp_path: Path, name: str, stem: str) -> None:
    assert sanitize_name(name) == stem
    folder = MemoryFolder(tmp_path / "mem")
    _write(folder, name)
    assert (tmp_path / "mem" / f"{stem}.md").is_file()
    assert sorted(p.name for p in (tmp_path / "mem").iterdir() if not p.name.startswith(".")) == [
        INDEX_FILE,
        f"{stem}.md",
    ]


@pytest.mark.parametrize("name", ["", "...", "///", "memory", "MEMORY"])
def test_unusable_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(MemoryWriteError):
        _write(MemoryFolder(tmp_path), name)


def test_caps_on_content_and_count(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path, max_file_chars=100, max_memories=2)
    with pytest.raises(MemoryWriteError, match="100"):
        _write(folder, "big", content="x" * 101)
    _write(folder, "one")
    _write(folder, "two")
    with pytest.raises(MemoryWriteError, match="limit"):
        _write(folder, "three")
    _write(folder, "two", content="an update is still allowed")


@pytest.mark.parametrize(
    "secret",
    [
        "sk-ant-api03-" + "a" * 40,
        "AKIA" + "ABCDEFGHIJKLMNOP",
        "-----BEGIN RSA PRIVATE KEY-----",
        "Authorization: Bearer " + "abcdefghij" * 3,
        "postgresql://admin:hunter22@db.internal/prod",
        "password = correct-horse-battery",
        "ghp_" + "x" * 36,
    ],
)
def test_credentials_are_recognised(secret: str) -> None:
    assert find_secret("note:", f"the value is {secret} ok") is not None


def test_ordinary_text_is_not_a_secret() -> None:
    assert find_secret("The user prefers metric units and works on the billing service.") is None
    assert find_secret("See https://example.com/docs for the password policy.") is None


def test_a_malformed_or_non_utf8_file_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = MemoryFolder(tmp_path)
    _write(folder, "good")
    (tmp_path / "latin1.md").write_bytes(b"---\nname: caf\xe9\n---\n")
    (tmp_path / "nofront.md").write_text("just text")
    (tmp_path / "badtype.md").write_text("---\nname: x\ndescription: y\ntype: gossip\n---\nz\n")
    with caplog.at_level(logging.WARNING):
        names = [m.name for m in folder.all()]
    assert names == ["good"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    for bad in ("latin1.md", "nofront.md", "badtype.md"):
        assert bad in warned


def test_the_index_is_capped_with_a_visible_marker() -> None:
    index = "\n".join(f"- [m{i}](m{i}.md): memory number {i}" for i in range(300))
    view = capped_index(index, max_lines=200, max_bytes=25_000)
    assert view.over_cap and view.lines == 300
    shown = view.text.splitlines()
    assert len(shown) == 201 and "100 of 300 lines not shown" in shown[-1]
    by_bytes = capped_index(index, max_lines=200, max_bytes=1_000)
    assert len(by_bytes.text.encode()) < 1_300 and "not shown" in by_bytes.text
    small = capped_index("- [a](a.md): b", max_lines=200, max_bytes=25_000)
    assert not small.over_cap and small.text == "- [a](a.md): b"


def test_parallel_writers_in_threads_never_lose_an_entry(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path)
    barrier = threading.Barrier(16, timeout=30)

    def writer(i: int) -> None:
        barrier.wait()
        for j in range(5):
            _write(folder, f"t{i}-{j}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    index = (tmp_path / INDEX_FILE).read_text().splitlines()
    assert len([line for line in index if line.startswith("- [")]) == 80
    assert len(folder.all()) == 80
    assert not list(tmp_path.glob(".*.tmp"))


def _process_writer(root: str, i: int) -> None:
    folder = MemoryFolder(Path(root))
    for j in range(10):
        _write(folder, f"p{i}-{j}", content=f"written by process {i}")


def test_several_processes_writing_at_once_keep_files_and_index_whole(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_process_writer, args=(str(tmp_path), i)) for i in range(4)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
        assert p.exitcode == 0
    folder = MemoryFolder(tmp_path)
    memories = folder.all()
    assert len(memories) == 40
    lines = [
        line for line in (tmp_path / INDEX_FILE).read_text().splitlines() if line.startswith("- [")
    ]
    assert sorted(lines) == sorted(m.index_line for m in memories)
