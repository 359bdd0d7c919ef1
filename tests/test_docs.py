"""The documentation kept true: a short README whose links resolve, a site whose generated parts are current, and
docstrings that say why without timings (figures belong in `bench/results/` and the generated performance page).
`.ci/run` builds the site itself with `mkdocs build --strict` (broken links, pages missing from the nav, snippets)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys

from conftest import REPO, SOURCE

# A figure of elapsed time: "0.3 s", "~5 ms", "14 seconds" (not "2 s" inside a name such as "timeout_s").
TIMING = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?\s?(?:ms|µs|us|s|seconds|minutes)\b(?![\w-])")


def test_the_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README points to the docs"
    missing = [link for link in links if "://" not in link and not (REPO / link).is_file()]
    assert missing == []


def test_the_performance_page_is_generated_from_the_bench_results():
    spec = importlib.util.spec_from_file_location("performance_table", REPO / "bench" / "performance_table.py")
    sys.path.insert(0, str(REPO / "bench"))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    text = (REPO / "docs" / "performance.md").read_text()
    start, end = text.index(module.START) + len(module.START), text.index(module.END)
    assert text[start:end].strip() == module.table(), "run `python bench/performance_table.py`"


def test_every_docs_page_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {str(path.relative_to(REPO / "docs")) for path in (REPO / "docs").rglob("*.md")}
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.M))
    assert pages == listed


def test_docstrings_carry_no_timings():
    found = []
    for path in sorted((SOURCE / "epbuild").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                found += [f"{path.relative_to(SOURCE)}:{getattr(node, 'lineno', 1)}: {match.group()}"
                          for match in TIMING.finditer(doc)]
    assert found == []
