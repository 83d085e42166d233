"""Fingerprints: plain data that says what a loader reads, compared field by field (a checkpoint
against the loader that resumes it; the members of a read group against each other)."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["diff_fields"]


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
