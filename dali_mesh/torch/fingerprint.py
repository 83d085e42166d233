"""Fingerprints: plain data that says what a loader reads (:func:`loader_fingerprint`), compared field
by field (:func:`diff_fields`: a checkpoint against the loader that resumes it, :func:`checkpoint_of`;
the members of a read group against each other)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

__all__ = ["diff_fields", "loader_fingerprint", "checkpoint_of"]

log = logging.getLogger(__name__)


def loader_fingerprint(layout, batch_size: int, output_map: Sequence[str], sources: Sequence, *,
                       coordinate: bool = True) -> dict[str, Any]:
    """What a checkpoint of a loader is only valid for: its layout, batch size and output names, and
    the ``sources`` registered on its pipeline (each one's own ``fingerprint()``, else its class name).
    ``coordinate=False``: the layouts by their rules, without this rank's coordinate, as every member
    of a read group must have them (members differ along the shared dims)."""
    def describe(layout):
        return repr(layout) if coordinate or not hasattr(layout, "describe_rules") else layout.describe_rules()

    fp: dict[str, Any] = {"layout": describe(layout), "batch_size": int(batch_size), "output_map": list(output_map)}
    described = []
    for src in sources:
        s = src.fingerprint() if hasattr(src, "fingerprint") else type(src).__name__
        if not coordinate and isinstance(s, dict) and getattr(src, "layout", None) is not None:
            s["layout"] = describe(src.layout)
            if "rows_table" in s:  # a read group's members each read their own rows of the group's table
                s.pop("rows", None)
                s.pop("sample_shape", None)
        described.append(s)
    if described:
        fp["sources"] = described
    return fp


def checkpoint_of(state, fingerprint: Callable[[], Mapping[str, Any]]) -> Any:
    """The DALI checkpoint in ``state`` (from ``MeshLoader.state_dict()``), refused (``ValueError``
    naming what differs) when ``state`` is not such a dict or its fingerprint is not ``fingerprint()``
    (the resuming loader's): it would resume at another position. A state without a fingerprint (an
    older dali_mesh's) is taken, with a warning."""
    if not isinstance(state, Mapping) or "dali_checkpoints" not in state:
        got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"load_state_dict(state): state must be a dict from MeshLoader.state_dict() with "
                         f"'dali_checkpoints', got {got}")
    checkpoints = state["dali_checkpoints"]
    if not isinstance(checkpoints, (list, tuple)) or len(checkpoints) != 1:
        raise ValueError(f"load_state_dict(state): expected one DALI checkpoint in state['dali_checkpoints'], "
                         f"got {checkpoints!r:.200}")
    saved = state.get("fingerprint")
    if saved is None:
        log.warning("load_state_dict: the checkpoint carries no fingerprint (saved by an older dali_mesh); "
                    "its source, layout and batch size cannot be checked")
        return checkpoints[0]
    diffs: list[str] = []
    diff_fields(saved, fingerprint(), "", diffs)
    if diffs:
        raise ValueError("load_state_dict(state): the checkpoint was taken by a loader with another "
                         "source, layout or batch size, so it would resume at another position: "
                         + "; ".join(diffs[:5]) + ("; ..." if len(diffs) > 5 else ""))
    return checkpoints[0]


def diff_fields(old: Any, new: Any, path: str, out: list[str], names=("checkpoint", "this loader")) -> None:
    """Where two fingerprints differ, as ``path: checkpoint X, this loader Y`` lines (short values;
    ``names``: what the two are called)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in sorted(set(old) | set(new), key=str):
            diff_fields(old.get(k, "<missing>"), new.get(k, "<missing>"), f"{path}.{k}" if path else str(k), out,
                        names)
        return
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                diff_fields(a, b, f"{path}[{i}]", out, names)
                if len(old) > 3:
                    return  # a long list (files): its first difference is enough to act on
        return
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and max(len(old), len(new)) > 3:
        out.append(f"{path}: {names[0]} {len(old)} entries, {names[1]} {len(new)}")
        return
    if old != new:
        def short(v):
            r = repr(v)
            return r if len(r) <= 200 else r[:197] + "..."
        out.append(f"{path}: {names[0]} {short(old)}, {names[1]} {short(new)}")
