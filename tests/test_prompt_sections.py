"""System-prompt assembly: ordered sections, the boundary line, bootstrap files."""

from __future__ import annotations

import pytest

from anabranch.context._prompt import (
    DYNAMIC_BOUNDARY,
    BootstrapText,
    SubagentInfo,
    assemble_system,
    bootstrap_tag,
    render_bootstrap,
    split_instructions,
    system_sections,
)


def test_static_sections_come_before_dynamic_ones() -> None:
    sections = system_sections(
        instructions=f"Be precise.\n{DYNAMIC_BOUNDARY}\nProject: apollo",
        tool_guidance=["Use recall to read spilled output."],
        subagents=[SubagentInfo("worker", "does work", 500)],
        report_cap_tokens=500,
        bootstrap=[BootstrapText("AGENTS.md", "Run tests with make.")],
        date="2026-11-30",
        cwd="/srv/app",
    )
    names = [s.name for s in sections]
    assert names == [
        "instructions",
        "tool_guidance",
        "subagents",
        "report_cap",
        "instructions_dynamic",
        "bootstrap:AGENTS.md",
        "date",
        "cwd",
    ]
    dynamic = [s.dynamic for s in sections]
    assert dynamic == sorted(dynamic), "every static section precedes every dynamic one"


def test_boundary_must_be_a_line_of_its_own() -> None:
    inline = f"Mention {DYNAMIC_BOUNDARY} in prose."
    assert split_instructions(inline) == (inline, "")
    static, dynamic = split_instructions(f"A\n  {DYNAMIC_BOUNDARY}  \nB\n{DYNAMIC_BOUNDARY}\nC")
    assert static == "A\n"
    assert dynamic.strip() == f"B\n{DYNAMIC_BOUNDARY}\nC"


def test_assemble_gives_a_static_and_a_dynamic_block() -> None:
    blocks = assemble_system(
        instructions=f"Static part.\n{DYNAMIC_BOUNDARY}\nUser dynamic part.",
        date="2026-11-30",
        cache_ttl="1h",
    )
    assert [b.text for b in blocks] == [
        "Static part.",
        "User dynamic part.\n\nCurrent date: 2026-11-30",
    ]
    assert all(b.cache == "1h" for b in blocks)
    assert assemble_system(instructions="Only static.", cache_ttl=None)[0].cache is None


def test_assembly_is_deterministic() -> None:
    def build() -> object:
        return assemble_system(
            instructions="x",
            subagents=[SubagentInfo("b", "", 10), SubagentInfo("a", "first", 10)],
            bootstrap=[BootstrapText("USER.md", "likes tea")],
        )

    assert build() == build()
    text = build()[0].text  # type: ignore[index]
    assert text.index("- a: first") < text.index("- b: (no description)")


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("AGENTS.md", "agents"),
        ("MEMORY.md", "memory"),
        ("docs/User Profile.txt", "user_profile"),
        (".env", "env"),
        ("2024.md", "file_2024"),
    ],
)
def test_bootstrap_tag(name: str, tag: str) -> None:
    assert bootstrap_tag(name) == tag


def test_bootstrap_file_is_wrapped_in_its_tag() -> None:
    rendered = render_bootstrap(BootstrapText("MEMORY.md", "- fact one\n"), max_chars=100)
    assert rendered == '<memory path="MEMORY.md">\n- fact one\n</memory>'


def test_long_bootstrap_file_is_cut_with_a_visible_marker() -> None:
    text = "x" * 50 + "TAIL"
    rendered = render_bootstrap(BootstrapText("AGENTS.md", text), max_chars=50)
    assert rendered is not None
    assert "TAIL" not in rendered
    assert "x" * 50 in rendered
    assert "truncated: only the first 50 characters of AGENTS.md are shown" in rendered
    assert rendered.endswith("</agents>")


def test_reader_cut_is_marked_even_when_text_fits() -> None:
    rendered = render_bootstrap(BootstrapText("A.md", "abc", truncated=True), max_chars=3)
    assert rendered is not None and "truncated" in rendered


def test_missing_bootstrap_file_is_skipped_or_marked() -> None:
    missing = BootstrapText("USER.md", None)
    assert render_bootstrap(missing, max_chars=10) is None
    assert render_bootstrap(missing, max_chars=10, missing="mark") == (
        '<user path="USER.md" missing="true"></user>'
    )
    sections = system_sections(instructions="x", bootstrap=[missing])
    assert [s.name for s in sections] == ["instructions"]
