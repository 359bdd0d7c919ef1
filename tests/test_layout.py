"""The package's shape, kept: the layout table of docs/architecture.md in the order of the declared layers, no import
circles between its modules (lazy imports inside functions count; type-only ones do not), no folder named like build
output, and no module far past the size the style allows."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import SOURCE

PACKAGE = SOURCE / "epbuild"
FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
TYPE_ONLY = re.compile(r"if TYPE_CHECKING:\n(?:[ \t]+[^\n]*\n)+")


def _module(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for dots, module, names in FROM.findall(TYPE_ONLY.sub("", path.read_text())):
            if dots:
                parts = package.split(".")[:len(package.split(".")) - (len(dots) - 1)]
                base = ".".join([*parts, *([module] if module else [])])
            elif module.startswith("epbuild"):
                base = module
            else:
                continue
            words = [w.split()[0] for w in re.sub(r"#[^\n]*", "", names).strip("()").split(",") if w.split()]
            graph[name] |= {c for c in (base, *(f"{base}.{w}" for w in words)) if c in modules and c != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circles():
    graph = _imports()
    assert graph["epbuild.tasks.definitions"] >= {"epbuild.tasks.project", "epbuild.tasks.actions"}  # it sees imports
    assert _cycles(graph) == []


def test_no_folder_is_named_like_build_output_and_modules_stay_small():
    folders = {path.name for path in PACKAGE.rglob("*") if path.is_dir() and path.name != "__pycache__"}
    assert not folders & {"build", "dist", "out", "target", "bin", "lib"}
    sizes = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {name: size for name, size in sizes.items() if size > 600} == {}  # ~400 is the aim; the few above say why


def _layers() -> list[list[str]]:
    """The layers contract of pyproject.toml, top to bottom, each as its modules' names under `epbuild`."""
    import tomllib

    contracts = tomllib.loads((SOURCE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [[name.strip().removeprefix("epbuild.") for name in layer.split("|")] for layer in layers]


def test_the_docs_layout_lists_every_module_in_the_order_of_the_layers():
    """The docs' layout table is the layers contract read aloud: its packages in the contract's order, and every
    module of the package named in it (a new module gets its row)."""
    readme = (SOURCE.parent / "docs" / "architecture.md").read_text()
    section = readme[readme.index("# Layout\n"):]
    section = section[:section.index("\n## ") if "\n## " in section else len(section)]
    declared = [name for layer in _layers() for name in layer]
    folders = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    assert sorted(set(declared) & set(folders)) == folders  # every package folder is in a layer
    tops = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in ("__init__", "__main__"))
    assert sorted(set(declared) - set(folders)) == tops  # and every top-level module
    listed = re.findall(r"^\| \*\*`(\w+)/`\*\*", section, re.M)
    assert listed == [name for name in declared if name in folders]
    rows = section.split("\n| **`")
    for row in rows[1:]:
        package = row.split("/`", 1)[0]
        modules = {path.name for path in (PACKAGE / package).glob("*.py") if path.name != "__init__.py"}
        named = set(re.findall(r"`(\w+\.py)`", row))
        assert modules - named == set(), f"{package}/: modules without a row in docs/architecture.md"
    everything = set(re.findall(r"`(\w+\.py)`", section))
    assert {f"{name}.py" for name in tops} <= everything
