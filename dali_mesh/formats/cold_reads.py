"""What a cold read of a window of one stored array pulls from storage, computed from its metadata
only (a ``.npy`` header, a chunk index, chunk objects' sizes): what each format answers to
:meth:`ArrayFormat.advice_target <dali_mesh.formats.ArrayFormat.advice_target>` and ``dali-mesh plan --data``
reports per rank. The numbers are those the readers count in :class:`dali_mesh.io.IOStats` ``bytes_read``
for the same window (the byte ranges a read asks storage for; the kernel pulls whole pages, which adds
at most a page at each end of a range)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from dali_mesh.io._common import DataFileError
from dali_mesh.plan import WindowPlan

__all__ = ["MAX_ADVICE_CHUNKS", "ColdReads", "check_chunk_count", "chunk_ranges"]

#: ``plan --data`` looks at most this many chunks per window (a stat or an index entry each): a
#: small file may claim millions of one-cell chunks
MAX_ADVICE_CHUNKS = 1 << 20


def chunk_ranges(file_start: Sequence[int], lengths: Sequence[int], chunks: Sequence[int]) -> list[range]:
    """Per axis, the chunk indices a box of ``lengths`` cells at ``file_start`` touches."""
    return [range(s // c, (s + n - 1) // c + 1) for s, n, c in zip(file_start, lengths, chunks)]


def check_chunk_count(path: str, plan: WindowPlan, chunks: Sequence[int]) -> None:
    """:class:`DataFileError` before any chunk is looked at when a window touches more than
    :data:`MAX_ADVICE_CHUNKS` of them."""
    n = sum(math.prod(len(r) for r in chunk_ranges((0,) + tuple(fst), (1,) + tuple(ln), chunks))
            for _, fst, ln in plan.boxes())
    if n > MAX_ADVICE_CHUNKS:
        raise DataFileError(path, f"a window touches {n} chunks of {tuple(chunks)}; plan --data looks at most "
                                  f"{MAX_ADVICE_CHUNKS} per window: these chunks are far too small for the layout "
                                  "(dali-mesh convert makes chunks that follow the shards)")


class ColdReads:
    """One stored array judged for layout advice: ``format`` and ``path`` (``name``: the array in it,
    ``None`` for a format of one array per location), its first sample's ``sample_shape`` and ``dtype``
    (native byte order), its stored ``chunks`` (the leading ``prefix`` axes included; ``None``:
    contiguous). :meth:`cold_bytes` is each format's own."""

    def __init__(self, format, path: str, name: str | None, sample_shape: Sequence[int], dtype,
                 chunks: tuple[int, ...] | None, prefix: tuple[int, ...]) -> None:
        self.format = format
        self.path = path
        self.name = name
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.dtype = np.dtype(dtype)
        self.chunks = chunks
        self.prefix = prefix

    def cold_bytes(self, plan: WindowPlan) -> int:  # pragma: no cover - per format
        """The bytes a cold read of the window ``plan`` (of the first sample) asks storage for."""
        raise NotImplementedError
