"""Every file a user doc points to exists: relative links (Markdown and HTML, with their #anchors) and repository paths
written in backticks, in the README, docs/, examples/README.md, benchmarks/README.md and demo/README.md; every
`ni_hf.` name they write in backticks can be imported; the README stays a landing page of at most 250 lines, and
docs/index.md lists every doc."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "examples" / "README.md",
        ROOT / "benchmarks" / "README.md",
        ROOT / "demo" / "README.md",
    }
)
# Files that are known to point at files the repository does not hold, and why; each is a strict xfail, so the mark
# has to go once the file is mended.
KNOWN_BROKEN: dict[str, str] = {}

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
MARKDOWN_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)([^`]+?)\1")
# A backticked repository path: a top-level folder of the repository, then a path without globs or placeholders.
REPOSITORY_PATH = re.compile(r"(?:docs|examples|benchmarks|src|tests|demo|model_cards|\.ci)/[\w.\-/]*")
PACKAGE_NAME = re.compile(r"\bni_hf(?:\.[A-Za-z_]\w*)+")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\b[^>]*\b(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)


def prose(text: str) -> str:
    """The text without fenced code blocks and HTML comments: commands and notes name files that a run writes."""
    return COMMENT.sub("", FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its visible text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The #fragments that lead somewhere in a Markdown file (repeated headings get -1, -2, ... as on GitHub)."""
    text = prose(path.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_references(path: Path, root: Path = ROOT) -> list[str]:
    """What `path` points to that does not exist, one line per reference."""
    root = root.resolve()
    text = prose(path.read_text(encoding="utf-8"))
    broken = []
    for target in [*MARKDOWN_LINK.findall(text), *HTML_LINK.findall(text)]:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            shown = resolved.relative_to(root) if resolved.is_relative_to(root) else resolved
            broken.append(f"link {target}: no file {shown}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"link {target}: no heading '#{fragment}' in {resolved.relative_to(root)}")
    for _, span in CODE_SPAN.findall(text):
        span = span.strip()
        if REPOSITORY_PATH.fullmatch(span) and not (root / span).exists():
            broken.append(f"path `{span}`: no such file in the repository")
    return broken


def missing_names(path: Path) -> list[str]:
    """The `ni_hf.` names written in backticks in `path` that are neither a module nor an attribute of one."""
    missing = []
    for _, span in CODE_SPAN.findall(prose(path.read_text(encoding="utf-8"))):
        for name in PACKAGE_NAME.findall(span):
            parts = name.split(".")
            for split in range(len(parts), 0, -1):
                module = ".".join(parts[:split])
                try:
                    found: object = importlib.import_module(module)
                    break
                except (
                    ModuleNotFoundError
                ) as error:  # a missing dependency of a module that exists is an error
                    if error.name is None or not f"{module}.".startswith(f"{error.name}."):
                        raise
            for attribute in parts[split:]:
                found = getattr(found, attribute, None)
            if found is None:
                missing.append(name)
    return missing


def doc_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(
            path, id=doc_id(path), marks=pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[doc_id(path)])
        )
        if doc_id(path) in KNOWN_BROKEN
        else pytest.param(path, id=doc_id(path))
        for path in DOCS
    ],
)
def test_every_file_a_doc_points_to_exists(doc: Path) -> None:
    broken = broken_references(doc)
    assert not broken, f"{doc_id(doc)} points to what does not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", [pytest.param(path, id=doc_id(path)) for path in DOCS])
def test_every_package_name_a_doc_writes_can_be_imported(doc: Path) -> None:
    missing = missing_names(doc)
    assert not missing, f"{doc_id(doc)} names what ni_hf does not have: {', '.join(sorted(set(missing)))}"


def test_the_readme_is_a_landing_page_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move reference and records into docs/ (docs/index.md)"


def test_the_docs_index_lists_every_doc() -> None:
    index = ROOT / "docs" / "index.md"
    linked = {
        (index.parent / target.partition("#")[0]).resolve()
        for target in MARKDOWN_LINK.findall(index.read_text())
    }
    missing = [
        doc_id(path)
        for path in (ROOT / "docs").rglob("*.md")
        if path != index and path.resolve() not in linked
    ]
    assert not missing, f"docs/index.md does not list: {', '.join(sorted(missing))}"


def test_the_check_finds_missing_files_anchors_and_paths(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section: `code`, and more\n")
    doc = tmp_path / "docs" / "doc.md"
    doc.write_text(
        "# Doc\n\n[ok](other.md#a-section-code-and-more) [self](#doc) [web](https://example.org/x)\n"
        '[gone](missing.md) [bad anchor](other.md#nowhere) <img src="../docs/none.png">\n'
        "`docs/other.md` `docs/runs/result.json` `runs/mine` `docs/*.md`\n"
        "```bash\npython examples/absent.py  # [in code](absent.md)\n```\n<!-- [in a comment](absent.md) -->\n"
    )
    assert broken_references(doc, root=tmp_path) == [
        "link missing.md: no file docs/missing.md",
        "link other.md#nowhere: no heading '#nowhere' in docs/other.md",
        "link ../docs/none.png: no file docs/none.png",
        "path `docs/runs/result.json`: no such file in the repository",
    ]


def test_the_check_finds_package_names_that_do_not_exist(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        '`ni_hf.NeuralInterpreterConfig.from_paper("digits")` `ni_hf.data.augmentation.BatchRandAugment`\n'
        "`ni_hf.training.no_such_module` `ni_hf.NeuralInterpreterConfig.no_such_method` `import ni_hf`\n"
        "```python\nni_hf.in_a_code_block\n```\n"
    )
    assert missing_names(doc) == [
        "ni_hf.training.no_such_module",
        "ni_hf.NeuralInterpreterConfig.no_such_method",
    ]
