"""The declared manifest schema: the docs' key table (docs/manifest.md) is generated from it, and the parser
refuses what it does not declare."""

from __future__ import annotations

import pytest

from conftest import REPO
from epbuild.errors import UserError
from epbuild.manifest.parse import TableReader
from epbuild.manifest.schema import KEYS, SCOPES, key_table, keys


def test_the_docs_key_table_is_the_schema():
    text = (REPO / "docs" / "manifest.md").read_text()
    start, end = text.index("<!-- keys:start -->\n"), text.index("<!-- keys:end -->")
    assert text[start + len("<!-- keys:start -->\n"):end].strip() == key_table(), (
        "docs/manifest.md's key table differs from rules/epbuild/manifest/schema.py: paste `python -m "
        "epbuild.manifest.schema` between the markers")


def test_every_key_has_a_known_scope_and_a_doc():
    for key in KEYS:
        assert key.doc and set(key.scopes) <= set(SCOPES), key.name


@pytest.mark.parametrize("table, message", [
    ({"embedd": True}, "targets.t.embedd: unknown key (did you mean 'embed'?)"),
    ({"compiler": "ortt"}, "targets.t.compiler: 'ortt' is not valid (did you mean 'ort'?); valid: ort, ort_session"),
    ({"timeout_s": 0}, "targets.t.timeout_s: must be a positive number up to 1e+12, found 0"),
    ({"timeout_s": float("inf")}, "targets.t.timeout_s: must be a positive number up to 1e+12, found inf"),
    ({"max_memory_gb": float("nan")}, "targets.t.max_memory_gb: must be a positive number up to 1e+12, found nan"),
    ({"min_offload": 1.5}, "targets.t.min_offload: must be a fraction between 0 and 1"),
    ({"embed": "yes"}, "targets.t.embed: must be a boolean, found a string 'yes'"),
    ({"timeout_s": True}, "targets.t.timeout_s: must be a number, found a boolean True"),
    ({"embed": "a\nb" * 50}, "targets.t.embed: must be a boolean, found a string 'a\\nba\\nb"),
])
def test_reader_checks_each_key_as_declared(table, message):
    with pytest.raises(UserError) as raised:
        TableReader(REPO / "models.toml", "targets.t", table).read("target")
    assert f"models.toml: {message}" in str(raised.value)


def test_defaults_come_from_the_schema():
    values = TableReader(REPO / "models.toml", "targets.t", {}).read("target")
    assert {name: values[name] for name in ("compiler", "embed", "validate", "options")} == {
        name: keys("target")[name].default for name in ("compiler", "embed", "validate", "options")}
    assert values["compiler"] == "ort" and values["validate"] is True
