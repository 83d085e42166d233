"""Layout advice for a ``.npy`` file: a cold read of a window reads the header and the window's byte
ranges, merged as :func:`~dali_mesh.formats.npy.read_npy_window` merges them (one ``preadv`` per group
of merged ranges reads from its first byte to its last, gaps included)."""
from __future__ import annotations

from dali_mesh.formats.cold_reads import MAX_ADVICE_CHUNKS, ColdReads
from dali_mesh.formats.npy.npy_reader import read_npy_header
from dali_mesh.io._common import DataFileError
from dali_mesh.plan import WindowPlan
from dali_mesh.plan.ranges import count_npy_units, plan_npy_units

__all__ = ["NpyColdReads"]


class NpyColdReads(ColdReads):
    def __init__(self, format, path: str) -> None:
        self.header = read_npy_header(path)
        super().__init__(format, path, None, self.header.shape, self.header.native_dtype, None, ())
        # the reader reads the first 512 bytes, then the rest of the header if it is longer
        self.header_bytes = max(min(512, self.header.file_size), self.header.data_offset)

    def cold_bytes(self, plan: WindowPlan) -> int:
        units = count_npy_units(self.header, plan)
        if units > MAX_ADVICE_CHUNKS:
            raise DataFileError(self.path, f"a window is {units} separate byte ranges; plan --data plans at most "
                                           f"{MAX_ADVICE_CHUNKS}: split another axis, or convert the file "
                                           "(dali-mesh convert)")
        u = plan_npy_units(self.header, plan)
        fo_l, end_l = u.file_off.tolist(), (u.file_off + u.spans).tolist()
        spans = sum(end_l[g1 - 1] - fo_l[g0] for g0, g1 in u.groups)
        return self.header_bytes + spans
