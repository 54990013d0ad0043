"""The documentation's promises that a test can hold it to: the examples of the maps guide run,
and links and quoted sections ("docs/maps.md, "Expiry"") lead somewhere.

docs/ itself is also built with ``mkdocs build --strict`` by scripts/test, which checks the
links between its pages and the API reference; this module covers what mkdocs does not see:
the README, and references to docs written as text in the sources.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

from kafkakv import functions

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _pycon_blocks(text: str) -> str:
    """The ```pycon blocks of a markdown text, in order, as one doctest text."""
    return "\n".join(re.findall(r"^```pycon\n(.*?)^```$", text, flags=re.S | re.M))


def test_the_maps_guide_examples_run_as_one_session() -> None:
    text = _pycon_blocks((DOCS / "maps.md").read_text())
    assert text.count(">>>") > 50
    globs: dict[str, object] = {}
    test = doctest.DocTestParser().get_doctest(text, globs, "docs/maps.md", "docs/maps.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    try:
        runner.run(test)
    finally:
        db = globs.get("db")
        if db is not None:
            db.close()  # type: ignore[attr-defined]
        if "guide.add" in functions.registered():
            functions.unregister("guide.add")
    assert runner.failures == 0


def _anchors(path: Path) -> set[str]:
    """The anchors of a markdown page's headings, as mkdocs and GitHub make them."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")
        anchors.add(slug)
    return anchors


def _labels(path: Path) -> set[str]:
    """What a text reference may quote: headings and the bold labels of paragraphs."""
    text = path.read_text()
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    bold = re.findall(r"^\*\*([^*]+?)\.?\*\*", text, flags=re.M)
    return {re.sub(r"[`*]", "", label).strip().rstrip(".").lower() for label in headings + bold}


def _has_section(page: Path, section: str) -> bool:
    """Whether a heading or bold label of ``page`` starts with ``section`` (headings often
    go on: "Durability" names "Durability: the fsync policy")."""
    quoted = section.replace("`", "").strip().rstrip(".,").lower()
    return any(label.startswith(quoted) for label in _labels(page))


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_relative_links_lead_to_a_file_and_heading(page: str) -> None:
    path = ROOT / page if page == "README.md" else DOCS / page
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{page} links to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page} links to {target}: no such heading"


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *DOCS.glob("*.md")]
    for folder in ("src", "tests", "benchmarks", "examples"):
        files += (ROOT / folder).rglob("*.py")
    return files


def test_references_to_docs_name_pages_and_sections_that_exist() -> None:
    # docs/maps.md, "Expiry" / docs/maps.md ("Clocks and skew") / (docs/benchmarks.md, "...")
    pattern = re.compile(r"docs/([\w.-]+\.md)(?:[,:]?\s+\(?\"([^\"]+)\")?")
    problems = []
    for path in _sources():
        if path == Path(__file__).resolve():
            continue
        text = re.sub(r"\s+", " ", path.read_text())
        for page, section in pattern.findall(text):
            where = path.relative_to(ROOT)
            if not (DOCS / page).exists():
                problems.append(f"{where}: docs/{page} does not exist")
            elif re.search(r"[A-Za-z]", section) and not _has_section(DOCS / page, section):
                problems.append(f"{where}: docs/{page} has no section {section!r}")
    assert not problems, "\n".join(problems)
