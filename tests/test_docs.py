"""README.md stays short, and every relative link in it and in docs/ leads somewhere.

A link is checked when it is relative (no scheme, not ``mailto:``): its file must exist, and an
``#anchor`` into a Markdown page must match one of that page's headings as GitHub slugs them.
Links and headings inside fenced code blocks are not Markdown and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, a repeated one suffixed -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text (external and mail links left out)."""
    targets = []
    for line in prose_lines(text):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
                continue
            targets.append(target)
    return targets


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or heading does not exist."""
    broken = []
    for target in relative_links(page.read_text()):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            shown = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest.name
            broken.append(f"{target}: no heading #{anchor} in {shown}")
    return broken


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_keeps_the_two_commands() -> None:
    """CI (.ci/run) runs the test command the README gives a newcomer: they must agree."""
    readme = README.read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_names_the_fast_target_the_makefile_has() -> None:
    """`make test-fast` is named in the README with a duration beside `make test`'s."""
    readme = README.read_text()
    assert "make test-fast" in readme
    assert re.search(r"^test-fast:", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert re.search(r"make test-fast`.{0,200}?\d+ s\b", readme, re.DOTALL)


def test_every_data_folder_of_a_package_is_listed_as_a_package() -> None:
    """A folder of package data that is not in `packages` makes setuptools warn on every
    install (its BuildBackendWarning, once per file: ~95 lines during `make demo`)."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    for name, folder in config["package-dir"].items():
        for sub in sorted(p for p in (ROOT / folder).iterdir()
                          if p.is_dir() and p.name != "__pycache__"):
            if any(f.is_file() and f.suffix != ".pyc" for f in sub.iterdir()):
                assert f"{name}.{sub.name}" in packages, f"{name}.{sub.name} not in packages"
                # its files travel as package data of that package
                if not (sub / "__init__.py").exists():
                    assert f"{name}.{sub.name}" in config["package-data"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert not broken_links(page), broken_links(page)


def test_every_docs_page_is_in_the_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {target.partition("#")[0] for target in relative_links(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, f"docs/README.md does not list {sorted(pages - linked)}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    assert slug("Run report: `laggard report`") == "run-report-laggard-report"
    assert slug("Who waited for whom, and slow links") == "who-waited-for-whom-and-slow-links"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    (tmp_path / "other.md").write_text("# Other page\n\n## Its section\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#its-section) [web](https://example.com/x.md)\n"
                    "[gone](missing.md) [bad anchor](other.md#nowhere) [self](#page)\n"
                    "```\n[in code](ignored.md)\n```\n# Page\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nowhere: no heading #nowhere in other.md"]
