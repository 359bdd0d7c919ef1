"""Outputs a TopK, ArgMax or NonMaxSuppression decides are compared as selections: which indices both sides chose
(order aside), then the values on the rows both chose. A detector on the HTP kept 29 of the same 30 queries, 19 in
the same order: position by position it scored 7 dB and localise blamed an innocent Conv."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from conftest import build_report
from epbuild.steps.validation.comparison import DEFAULT_THRESHOLDS, compare_outputs
from epbuild.steps.validation.selection import Selected, selected_outputs
from real_models import topk_detector

TOPK = Selected("TopK", "indices", False, 30)
TOPK_INDICES = Selected("TopK", "indices", True, 30)


class Outputs:
    """The one thing compare_outputs asks of a session: its outputs' names, in order."""

    def __init__(self, *names: str):
        self.names = names

    def get_outputs(self):
        return [SimpleNamespace(name=name) for name in self.names]



def test_the_same_queries_in_another_order_pass_and_one_query_swapped_is_measured():
    rng = np.random.default_rng(0)
    want_idx = rng.permutation(60)[:30]
    boxes = rng.random((60, 4)).astype(np.float32)
    got_idx = want_idx.copy()
    got_idx[:20] = got_idx[:20][::-1]  # reordered
    got_idx[25] = next(i for i in range(60) if i not in want_idx)  # one query the reference did not keep
    expected = {"indices": want_idx.reshape(1, 30), "boxes": boxes[want_idx].reshape(1, 30, 4)}
    got = [got_idx.reshape(1, 30), boxes[got_idx].reshape(1, 30, 4)]
    selected = {"indices": TOPK_INDICES, "boxes": TOPK}
    session = Outputs("indices", "boxes")

    metrics, failures, undecided = compare_outputs(session, got, expected, DEFAULT_THRESHOLDS["fp16"], "fp16",
                                                   selected)
    assert not failures and not undecided
    assert metrics["indices"]["selection_overlap"] == pytest.approx(29 / 30)
    assert metrics["indices"]["selection"]["same_order"] < 0.5
    assert metrics["boxes"]["selection"] == {"op": "TopK", "rows_compared": 29, "rows": 30, "paired_by": "indices"}
    assert metrics["boxes"]["snr_db"] == 200.0  # the 29 both chose are the same boxes

    _, failures, _ = compare_outputs(session, got, expected, DEFAULT_THRESHOLDS["fp32"], "fp32", selected)
    assert failures == ["output 'indices': selection_overlap 0.966667 < min_selection_overlap 0.99",
                        "output 'boxes': selection_overlap 0.966667 < min_selection_overlap 0.99"]

    _, failures, _ = compare_outputs(session, got, expected, DEFAULT_THRESHOLDS["fp16"], "fp16")
    assert any("snr_db" in f for f in failures)  # position by position, as before: noise


def test_without_the_indices_rows_pair_by_nearest_values():
    rng = np.random.default_rng(1)
    boxes = rng.random((1, 30, 4)).astype(np.float32)
    shuffled = boxes[:, rng.permutation(30)] + np.float32(1e-6)
    metrics, failures, _ = compare_outputs(Outputs("boxes"), [shuffled], {"boxes": boxes},
                                           DEFAULT_THRESHOLDS["fp16"], "fp16", {"boxes": TOPK})
    assert not failures
    assert metrics["boxes"]["selection"]["paired_by"] == "nearest values"
    assert "selection_overlap" not in metrics["boxes"]  # no indices: only the values are judged


def test_nms_keeping_a_different_number_of_boxes_is_judged_by_overlap_not_shape():
    nms = {"selected": Selected("NonMaxSuppression", "selected", True, None)}
    want = np.array([[0, 0, 3], [0, 0, 7], [0, 1, 2], [0, 1, 9]], np.int64)
    got = np.array([[0, 1, 2], [0, 0, 3], [0, 0, 7], [0, 1, 9], [0, 1, 5]], np.int64)  # one more box
    metrics, failures, _ = compare_outputs(Outputs("selected"), [got], {"selected": want},
                                           {"min_selection_overlap": 0.75}, "fp16", nms)
    assert metrics["selected"]["selection_overlap"] == pytest.approx(4 / 5) and not failures
    _, failures, _ = compare_outputs(Outputs("selected"), [got], {"selected": want},
                                     {"min_selection_overlap": 0.9}, "fp16", nms)
    assert failures == ["output 'selected': selection_overlap 0.8 < min_selection_overlap 0.9"]


def test_argmax_is_judged_by_the_share_of_equal_choices():
    argmax = {"label": Selected("ArgMax", "label", True, None)}
    want = np.arange(100, dtype=np.int64) % 7
    got = want.copy()
    got[:3] = 6 - got[:3]
    metrics, failures, _ = compare_outputs(Outputs("label"), [got], {"label": want}, DEFAULT_THRESHOLDS["fp16"],
                                           "fp16", argmax)
    assert metrics["label"]["selection_overlap"] == pytest.approx(0.97) and not failures


def test_the_graph_tells_which_outputs_a_selection_decides(tmp_path):
    found = selected_outputs(onnx.load(str(topk_detector(tmp_path / "det.onnx"))))
    assert found == {"scores": TOPK, "indices": TOPK_INDICES, "boxes": TOPK}


def test_a_detector_whose_fp16_ep_reorders_its_queries_passes_on_what_it_chose(project):
    """End to end on QNN HTP: the scores of the leading queries lie within fp16's precision of one another, so the
    artifact's order is not CPU's; the same queries are kept, and their boxes match."""
    topk_detector(project.root / "models" / "det.onnx")
    project.manifest('[models.det]\npath = "models/det.onnx"\ntargets = ["cpu", "qnn-htp"]\n[targets.cpu]\n'
                     'ep = "cpu"\n[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    done = project.doit(check=False)
    entries = build_report(project)
    assert entries["validate:det@qnn-htp"]["status"] == "validated", done.stdout
    assert "100% of the selection kept" in done.stdout
    outputs = json.loads((project.artifacts / "qnn-htp" / "det" / "validation.json").read_text())["outputs"]
    assert outputs["indices"]["selection_overlap"] == 1.0
    assert outputs["indices"]["selection"]["same_order"] < 1.0  # reordered: position by position it would fail
    assert outputs["boxes"]["selection"]["paired_by"] == "indices" and outputs["boxes"]["snr_db"] > 40
