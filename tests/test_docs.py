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


# -- counts in docs/architecture.md, read from the code ----------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}


def test_the_step_table_size_is_the_window_step_columns() -> None:
    # The diagram's step table has one row per STEP_COLUMNS entry (it said 7 x K at 16).
    from laggard.detectors.window import STEP_COLUMNS

    said = re.findall(r"step table \((\d+) x K\)", ARCHITECTURE.read_text())
    assert said, "docs/architecture.md no longer says the step table's size"
    assert {int(n) for n in said} == {len(STEP_COLUMNS)}


def test_the_import_contracts_counted_and_tabled_are_those_of_importlinter() -> None:
    sections = re.findall(r"^\[importlinter:contract:[^\]]+\]", (ROOT / ".importlinter")
                          .read_text(), flags=re.MULTILINE)
    names = re.findall(r"^name\s*=\s*(.+?)\s*$", (ROOT / ".importlinter").read_text(),
                       flags=re.MULTILINE)
    text = ARCHITECTURE.read_text()
    word = re.search(r"`\.importlinter` writes this as (\w+) contracts", text)
    assert word, "docs/architecture.md no longer says how many import contracts there are"
    assert _NUMBER_WORDS.get(word.group(1), word.group(1)) == len(sections)
    tabled = re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)
    assert set(names) <= set(tabled), f"not in the table: {sorted(set(names) - set(tabled))}"


def test_the_docs_name_one_transport() -> None:
    # The job's datagrams go to the agent's socket (a Unix datagram socket); UDP on loopback is
    # an option, never the name of the path: no "UDP intake" or "non-blocking UDP" as if it were.
    for page in (ARCHITECTURE, ROOT / "docs" / "README.md", README):
        text = " ".join(prose_lines(page.read_text()))
        assert "non-blocking UDP" not in text and "the UDP intake" not in text, page.name
    diagram = ARCHITECTURE.read_text().split("## Data flow", 1)[1].split("```")[1]
    assert "UDP" not in diagram and "socket" in diagram


# -- benchmarks/RESULTS.md: one table of current figures on top, the history below ---------------

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def current_figures() -> list[list[str]]:
    """The rows of RESULTS.md's "Current figures" table, as cells."""
    text = RESULTS.read_text().split("## Current figures", 1)[1].split("\n# ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[2:]]


def test_results_open_with_one_table_of_current_figures() -> None:
    text = RESULTS.read_text()
    assert text.index("## Current figures") < text.index("# History, newest first")
    header = text.split("## Current figures", 1)[1].split("\n|", 1)[1].split("\n", 1)[0]
    assert header.strip(" |").split(" | ") == ["claim", "figure", "command", "date (UTC)", "load"]
    rows = current_figures()
    assert len(rows) >= 20
    for row in rows:
        assert len(row) == 5 and all(row), row


def test_the_readme_detection_figures_are_in_the_current_table() -> None:
    # README's long-run table and peer-group sentence quote these; the table must carry them.
    figures = " ".join(cell for row in current_figures() for cell in row)
    readme = README.read_text()
    for quoted in ("10 of 10", "6 of 7", "7 of 7", "5 of 5", "1.7e8"):
        assert quoted in readme and quoted in figures, quoted
