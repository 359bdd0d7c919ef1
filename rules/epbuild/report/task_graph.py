"""The task graph as a picture: stages -> compile -> validate, ops checks and groups, as DOT (`artifacts/graph.dot`)
and SVG (`artifacts/graph.svg`), each node coloured by its task's last status in `build-report.json`.

Edges are doit's own: a task depends on another when it names it in `task_dep` or reads one of its `targets`.
The SVG is drawn by Graphviz's `dot` (Debian: `apt install graphviz`) when it is on PATH; without it the DOT file
is still written and the task says how to get the picture.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..files.layout import write_atomic

FILL = {"compiled": "#dcf5e3", "validated": "#dcf5e3", "restored": "#d6ecfb", "up-to-date": "#eef7f0",
        "failed": "#fde0df", "skipped": "#eceef2", "not built": "#fdf0d5", "interrupted": "#fdf0d5",
        "inconclusive": "#ece4fb", "structural": "#dcecf7"}  # pending (never reached): white
SHAPE = {"compile": "box", "group": "box3d", "validate": "ellipse", "ops": "diamond"}


def edges_of(tasks: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, str]]]:
    """(task names, (from, to) pairs) of doit task dicts, named subtasks only."""
    names = [f"{t['basename']}:{t['name']}" for t in tasks if t.get("name")]
    producer = {str(target): f"{t['basename']}:{t['name']}" for t in tasks if t.get("name")
                for target in t.get("targets", ())}
    edges = []
    for task in tasks:
        if not task.get("name"):
            continue
        name = f"{task['basename']}:{task['name']}"
        sources = [producer[str(dep)] for dep in task.get("file_dep", ()) if str(dep) in producer]
        sources += [dep for dep in task.get("task_dep", ()) if dep in names]
        edges += [(source, name) for source in dict.fromkeys(sources) if source != name]
    return names, edges


def dot_text(names: list[str], edges: list[tuple[str, str]], entries: Mapping[str, dict[str, Any]]) -> str:
    def escaped(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"')

    def quoted(text: str) -> str:
        return f'"{escaped(text)}"'

    lines = ["digraph epbuild {", '  rankdir="LR";', '  node [fontname="sans-serif", fontsize=10, style=filled];']
    for name in names:
        status = entries.get(name, {}).get("status", "pending")
        shape = SHAPE.get(name.split(":", 1)[0], "note")
        label = f'"{escaped(name)}\\n{escaped(status)}"'  # DOT's \n: a line break in the label
        fill = quoted(FILL.get(status, "#ffffff"))
        lines.append(f"  {quoted(name)} [label={label}, shape={shape}, fillcolor={fill}];")
    lines += [f"  {quoted(a)} -> {quoted(b)};" for a, b in edges]
    return "\n".join([*lines, "}"]) + "\n"


def write_graph(tasks: list[dict[str, Any]], entries: Mapping[str, dict[str, Any]], folder: Path,
                keep: set[str] | None = None, stem: str = "graph") -> str:
    """Write STEM.dot and, with Graphviz present, STEM.svg into `folder` (only the tasks in `keep` when given);
    what was written, for the console."""
    names, edges = edges_of(tasks)
    if keep is not None:
        names, edges = [n for n in names if n in keep], [(a, b) for a, b in edges if a in keep and b in keep]
    dot_file, svg_file = folder / f"{stem}.dot", folder / f"{stem}.svg"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(dot_file, dot_text(names, edges, entries))
    said = f"{len(names)} tasks, {len(edges)} dependencies -> {dot_file}"
    dot = shutil.which("dot")
    if dot is None:
        svg_file.unlink(missing_ok=True)  # an old picture would show an old graph
        return said + "; graph.svg not drawn: Graphviz's `dot` is not on PATH (Debian: apt install graphviz)"
    done = subprocess.run([dot, "-Tsvg", str(dot_file)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise OSError(f"dot could not draw {dot_file}: {done.stderr.strip()[-500:]}")
    write_atomic(svg_file, done.stdout)
    return said + f", {svg_file}"
