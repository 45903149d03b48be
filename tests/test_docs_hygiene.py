"""The user-facing pages cite no internal issue numbers and use Markdown, not reST, inline code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "issue 16", "issues 13 and 14", "(#17)", "#17" at a word start; an upstream project's own tracker
# (pytorch#74907, astra-sim #292) names that project just before it and is allowed
INTERNAL = re.compile(r"\bissues?\s+#?\d+|(?<![\w-])(?<![\w-] )#\d+\b", re.IGNORECASE)
UPSTREAM = re.compile(r"(pytorch|astra-sim|grace|deepspeed|transformers|ray|gloo|nccl)\s*#\d+", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_internal_issue_numbers(page: Path) -> None:
    bad = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in INTERNAL.finditer(line):
            if not UPSTREAM.search(line[max(0, m.start() - 20) : m.end()]):
                bad.append(f"{page.name}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_rest_double_backticks(page: Path) -> None:
    bad = [
        f"{page.name}:{n}: {line.strip()[:100]!r}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if "``" in line.replace("```", "")
    ]
    assert not bad, "\n".join(bad)
