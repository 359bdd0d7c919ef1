"""The package's structure in figures, for a before/after of a restructuring (issue 66): modules per package, the
longest functions, files past ~400 lines, the places that spell a task name, `":" in name` tests, and what mypy
says.

    python bench/bench_structure.py [LABEL=RULES_DIR ...]   (default: this checkout's rules/)

`git archive COMMIT rules | tar -x -C X` gives another commit's RULES_DIR (X/rules). Prints one table; writes
bench/results/structure.json.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from record import save

REPO = Path(__file__).resolve().parents[1]
# a task name spelled in place: an f-string starting with a task kind and a colon
TASK_NAME = re.compile(r'f"(?:compile|validate|group|package|ops|reduce|shape|fold|quantize|freeze|upgrade|'
                       r'stage|prune|backends|cache|graph|unavailable):\{')
SUBTASK_TEST = re.compile(r'":" (?:not )?in (?:task\.)?name\b')


def figures(rules: Path) -> dict[str, object]:
    package = rules / "epbuild"
    files = sorted(package.rglob("*.py"))
    per_package: dict[str, int] = {}
    longest: list[tuple[int, str]] = []
    long_files = []
    task_names = subtask_tests = 0
    for path in files:
        relative = path.relative_to(package)
        folder = relative.parts[0] if len(relative.parts) > 1 else "(top)"
        per_package[folder] = per_package.get(folder, 0) + (path.name != "__init__.py")
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 400:
            long_files.append(f"{relative} ({text.count(chr(10))})")
        if relative.as_posix() != "manifest/builds.py":  # where Build makes its tasks' names
            task_names += len(TASK_NAME.findall(text))
        subtask_tests += len(SUBTASK_TEST.findall(text)) if relative.parts[0] == "tasks" else 0
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                longest.append((node.end_lineno - node.lineno + 1, f"{relative}:{node.name}"))
    longest.sort(reverse=True)
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           str(package)], capture_output=True, text=True, cwd=rules.parent)
    said = (mypy.stdout.strip().splitlines() or ["?"])[-1]
    return {"modules": sum(per_package.values()), "per_package": dict(sorted(per_package.items())),
            "longest_functions": [f"{name} ({lines})" for lines, name in longest[:3]],
            "files_over_400_lines": long_files, "task_names_spelled_in_place": task_names,
            "subtask_tests_in_tasks": subtask_tests, "mypy": said}


def main() -> None:
    trees = dict(arg.split("=", 1) for arg in sys.argv[1:]) or {"this checkout": str(REPO / "rules")}
    found = {label: figures(Path(path).resolve()) for label, path in trees.items()}
    rows = []
    for label, data in found.items():
        print(f"{label}:")
        for key, value in data.items():
            print(f"  {key}: {value}")
        rows.append((f"structure, {label}",
                     f"{data['modules']} modules; longest function {data['longest_functions'][0]}; "
                     f"{len(data['files_over_400_lines'])} files over 400 lines; task names spelled in place "
                     f"{data['task_names_spelled_in_place']}; ':' in name tests in tasks/ "
                     f"{data['subtask_tests_in_tasks']}; mypy: {data['mypy']}"))
    save("structure", rows, found)


if __name__ == "__main__":
    main()
