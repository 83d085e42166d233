"""A window of one sample read box by box by the array's own library (h5py, zarr-python): the signature and
the work around the reads that the HDF5 and Zarr Python readers share, written once. Each reader says what
differs, how a box is read and what the reads are counted as, in an :class:`ArrayBoxes`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from dali_mesh.io._common import IOStats, _account, fill_window, sample_shape
from dali_mesh.partition import Region

__all__ = ["ArrayBoxes", "read_array_window"]


@dataclass(frozen=True)
class ArrayBoxes:
    """An array whose library reads any box of it, as :func:`read_array_window` reads it.

    ``path``: the file or store as errors name it; ``shape``: the whole array's; ``dtype``: the window's
    (native byte order); ``what``: the array and its shape as an error names them. ``read_box(buffer,
    window index, array index, counters)`` reads one box; ``counted(counters, plan, prefix)``, when given,
    adds what the library knows it read once the reads are done (``plan`` ``None``: they failed, or the
    window is empty). ``label`` starts a mismatch's message, ``unit`` names what a reader reads (``"file"``
    or ``"store"``), ``contiguous``: the library reads into C-contiguous buffers only."""

    path: str
    shape: tuple
    dtype: np.dtype
    what: str
    read_box: Callable[[np.ndarray, tuple, tuple, IOStats], None]
    counted: Callable[[IOStats, object, tuple], None] | None = None
    label: str = ""
    unit: str = "file"
    contiguous: bool = False


def read_array_window(
    boxes: ArrayBoxes,
    region: Region,
    out: np.ndarray | None = None,
    *,
    prefix: Sequence[int] = (),
    index_maps: Mapping[int, Sequence[int]] | None = None,
    expected_shape: Sequence[int] | None = None,
    expected_dtype=None,
    stats: IOStats | None = None,
) -> np.ndarray:
    """Fill ``out`` with the window ``region`` of the sample ``array[prefix]`` of ``boxes``' array, one read
    of its library per box of the read plan; arguments as :func:`dali_mesh.io.read_npy_window`. Returns
    ``out``; the reads are added to ``stats`` and to the process's counters, also when they fail."""
    local = IOStats()
    plan = None
    try:
        shape = sample_shape(boxes.path, tuple(boxes.shape), prefix, index_maps, boxes.what)
        out, plan = fill_window(boxes.path, region, out, boxes.dtype, shape,
                                lambda buf, dst, src: boxes.read_box(buf, dst, src, local), local, prefix=prefix,
                                index_maps=index_maps, expected_shape=expected_shape, expected_dtype=expected_dtype,
                                label=boxes.label, unit=boxes.unit, contiguous=boxes.contiguous)
        return out
    finally:
        try:
            if boxes.counted is not None:
                boxes.counted(local, plan, tuple(int(p) for p in prefix))
        finally:
            _account(stats, local)
