"""The real-model corpus without torch (bench/corpus: old IR, -1 dims, If on a configuration input, Loop, QDQ,
QOperator, fp16, constant-computed weights, partial offload, token ids, odd names) built for cpu and qnn-htp:
every model compiles and validates on cpu; on qnn-htp each either passes or fails with one explained line; no doit
crash and no bare exception. The whole corpus, torch models included, is `python bench/corpus/run.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench" / "corpus"))

from generate import generate  # noqa: E402
from run import RAW, build, matrix  # noqa: E402


@pytest.mark.corpus
def test_the_corpus_without_torch_builds_and_every_failure_is_explained(tmp_path):
    entries = generate(tmp_path, with_torch=False)
    assert len(entries) >= 12
    done, _ = build(tmp_path, jobs=2)
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr  # 1: a task failed, 2: its dependents unmet
    text = done.stdout + done.stderr
    assert not [line for line in text.splitlines() if any(raw in line for raw in RAW)]
    rows = matrix(tmp_path, [e.name for e in entries])
    for row in rows:
        if row["target"] == "cpu":
            assert row["compile"] in ("compiled", "restored") and row["validation"] == "passed", row
        elif row["validation"] != "passed":
            assert row["reason"] and "\n" not in row["reason"], row
