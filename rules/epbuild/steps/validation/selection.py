"""Outputs a model selects (TopK, ArgMax/ArgMin, NonMaxSuppression), compared as selections: which indices were
chosen, then the values on the ones both sides chose. An EP whose scores differ in the last bits picks the same
detections in another order; compared position by position that reads as noise (a detector keeping 29 of the same
30 queries, 19 in the same order, scored 7 dB) and sends localise after an innocent node. Runs in the validating
child (NumPy arrays)."""

from __future__ import annotations

from collections import deque
from typing import Any

from ...records import record
from ..graph import attributes

SELECTING = {"TopK": 1, "ArgMax": 0, "ArgMin": 0, "NonMaxSuppression": 0}  # op -> its output of chosen indices
MATCH_LIMIT = 4096  # rows matched by distance beyond this are compared position by position (n^2 distances)


@record
class Selected:
    """A graph output that a selecting node decides: the node's index output itself (`direct`), or values picked
    by it (TopK's values, boxes gathered at its indices) along the axis of length `k`."""

    op: str
    index_output: str
    direct: bool
    k: int | None


def _constant_k(graph: Any, node: Any) -> int | None:
    """TopK's K when an initializer or a Constant node holds it."""
    from onnx import numpy_helper

    if node.op_type != "TopK" or len(node.input) < 2:
        return None
    name = node.input[1]
    for tensor in graph.initializer:
        if tensor.name == name:
            return int(numpy_helper.to_array(tensor).ravel()[0])
    for other in graph.node:
        if other.op_type == "Constant" and name in other.output:
            value = attributes(other).get("value")
            return int(numpy_helper.to_array(value).ravel()[0]) if value is not None else None
    return None


def selected_outputs(model: Any) -> dict[str, Selected]:
    """Each graph output decided by a selecting node: the nearest one found walking back from the output."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    found = {}
    for output in graph.output:
        queue, seen = deque([output.name]), {output.name}
        while queue:
            name = queue.popleft()
            node = producer.get(name)
            if node is None:
                continue
            if node.op_type in SELECTING:
                index = node.output[SELECTING[node.op_type]]
                found[output.name] = Selected(node.op_type, index, name == index and output.name == index,
                                              _constant_k(graph, node))
                break
            for source in node.input:
                if source and source not in seen:
                    seen.add(source)
                    queue.append(source)
    # ArgMax/ArgMin keep positions: only their index output itself is judged as a selection
    return {name: s for name, s in found.items() if s.direct or s.op == "TopK"}


def _rows(array: Any, axis: int) -> Any:
    """(batch, n, rest): the axes before the selection axis are batches, those after it one row."""
    import numpy as np

    lead = int(np.prod(array.shape[:axis])) if axis else 1
    return array.reshape(lead, array.shape[axis], -1)


def _axis(shape: tuple[int, ...], k: int | None) -> int | None:
    """The last axis of length k: TopK's values [1, 300], boxes gathered at its indices [1, 300, 4]."""
    if not k:
        return None
    axes = [i for i, size in enumerate(shape) if size == k]
    return axes[-1] if axes else None


def compare_indices(selected: Selected, got: Any, want: Any) -> dict[str, Any]:
    """The chosen indices themselves: the share both sides chose (order aside) and the share in the same place."""
    import numpy as np

    if selected.op == "NonMaxSuppression":  # [N, 3] (batch, class, box) rows; N differs between sides
        a, r = {tuple(row) for row in got.reshape(-1, 3).tolist()}, {tuple(row) for row in want.reshape(-1, 3).tolist()}
        both = len(a & r)
        return {"selection_overlap": both / max(len(a | r), 1), "selected": len(a), "reference_selected": len(r),
                "same_order": float(np.array_equal(got, want))}
    if got.shape != want.shape:
        return {}
    if selected.op != "TopK":  # ArgMax/ArgMin: one choice per position
        same = float(np.mean(got == want)) if want.size else 1.0
        return {"selection_overlap": same, "same_order": same}
    axis = _axis(want.shape, selected.k) if selected.k else want.ndim - 1
    axis = want.ndim - 1 if axis is None else axis
    a, r = _rows(np.moveaxis(got, axis, -1), got.ndim - 1), _rows(np.moveaxis(want, axis, -1), want.ndim - 1)
    a, r = a.reshape(-1, a.shape[1]), r.reshape(-1, r.shape[1])
    kept = [len(set(x.tolist()) & set(y.tolist())) / max(len(y), 1) for x, y in zip(a, r, strict=True)]
    return {"selection_overlap": float(np.mean(kept)) if kept else 1.0, "same_order": float(np.mean(a == r))}


def match_rows(got: Any, want: Any, selected: Selected, got_index: Any = None, want_index: Any = None) -> Any:
    """`got` with its rows along the selection axis reordered to meet `want`'s, and a mask of the rows both sides
    chose; None where no such axis is known. Rows pair by the chosen indices when the index output is an output too,
    else by nearest values (greedy on distance: every row paired, a different choice shows as error)."""
    import numpy as np

    if got.shape != want.shape:
        return None
    axis = _axis(want.shape, selected.k)
    if axis is None or want.shape[axis] > MATCH_LIMIT:
        return None
    a, r = _rows(got, axis), _rows(want, axis)
    order = np.tile(np.arange(r.shape[1]), (r.shape[0], 1))
    chosen = np.ones(r.shape[:2], dtype=bool)
    by_index = (got_index is not None and want_index is not None and got_index.shape == want_index.shape
                and got_index.size == r.shape[0] * r.shape[1])
    for b in range(r.shape[0]):
        if by_index:
            gi, wi = got_index.reshape(r.shape[0], -1)[b], want_index.reshape(r.shape[0], -1)[b]
            where = {int(v): i for i, v in enumerate(gi.tolist())}
            for j, v in enumerate(wi.tolist()):
                if int(v) in where:
                    order[b, j] = where[int(v)]
                else:
                    chosen[b, j] = False
            free = [i for i in range(len(gi)) if i not in set(order[b, chosen[b]].tolist())]
            order[b, ~chosen[b]] = free[: int((~chosen[b]).sum())]
        else:
            x, y = a[b].astype(np.float64), r[b].astype(np.float64)
            distance = ((y[:, None, :] - x[None, :, :]) ** 2).sum(-1)
            taken_a, taken_r = np.zeros(len(x), bool), np.zeros(len(y), bool)
            for flat in np.argsort(distance, axis=None, kind="stable"):
                j, i = divmod(int(flat), len(x))
                if not taken_r[j] and not taken_a[i]:
                    order[b, j], taken_r[j], taken_a[i] = i, True, True
                    if taken_r.all():
                        break
    matched = np.stack([a[b][order[b]] for b in range(a.shape[0])]).reshape(got.shape)
    return matched, chosen.reshape(want.shape[: axis + 1])
