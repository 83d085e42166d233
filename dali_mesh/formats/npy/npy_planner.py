"""Plan the native reads of one sample per ``.npy`` file: one read plan per distinct header, the
window's byte ranges merged as :func:`~dali_mesh.formats.npy.npy_reader.read_npy_window` merges them;
what :class:`~dali_mesh.formats.npy.npy_format.NpyFormat` ``plan_files`` returns."""
from __future__ import annotations

from typing import Sequence

from dali_mesh.formats.npy.npy_reader import (NpyHeader, _io_error, _open, _read_header_and_bytes,
                                              read_npy_header_bytes)
from dali_mesh.io._common import DataFileError, IOStats, ShapeMismatchError, check_frame, sample_shape as shape_of_sample
from dali_mesh.plan.window import plan_window
from dali_mesh.plan import NotNativeError, PlanFile, PlanSet, ReadPlan, native_dtype_of, native_store
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP, count_npy_units, plan_npy_units
from dali_mesh.storage import store_of

__all__ = ["MAX_NATIVE_UNITS", "plan_npy_files"]


def _npy_headers(files: Sequence[str], first: NpyHeader, first_check: bytes):
    """Every file's ``(header, header bytes, version)``, the bytes always those the header was parsed
    from, read from one opening of the file at ``version`` (an object store's reads at its ETag). A
    file whose header bytes and size equal those of a header already parsed shares it (one small read,
    no parse); any other is parsed. Read on a few threads when there are many, or when they are in an
    object store (each read a round trip), since storage answers many small reads at once faster than
    one after another (:attr:`~dali_mesh.storage.ByteStore.round_trip`)."""
    known = {first_check: first}  # header bytes -> parsed header (size checked per file)

    def one(path):
        try:
            with _open(path) as obj:
                head, size = obj.pread(4096, 0), obj.size
                # the header's length from its prefix (as numpy writes it: magic, version, length)
                if len(head) >= 10 and head[6] in (1, 2, 3):
                    n = 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else \
                        12 + int.from_bytes(head[8:12], "little")
                    h = known.get(head[:n])
                    if h is not None and size == h.file_size:
                        return h, head[:n], obj.version
                h, check = _read_header_and_bytes(obj, path, IOStats())
                known.setdefault(check, h)
                return h, check, obj.version
        except OSError as e:
            raise _io_error(path, e) from None

    each_a_round_trip = store_of(files[0])[0].round_trip[0] > 0
    if len(files) <= 1024 and not each_a_round_trip:
        return [one(f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    # a few long slices, not a task per file (a task costs more than a warm read)
    step = -(-len(files) // 8)
    with ThreadPoolExecutor(8) as ex:
        parts = list(ex.map(lambda i: [one(f) for f in files[i:i + step]], range(0, len(files), step)))
    return [h for part in parts for h in part]


#: the most byte ranges (units) one native .npy plan holds: 24 bytes each in the plan, so about
#: 400 MB at the limit (an innermost-axis split of a long, narrow array makes one range per row)
MAX_NATIVE_UNITS = 1 << 24


def plan_npy_files(files: Sequence[str], *, region_of, index_maps=None, sample_shape=None, dtype=None,
                   sample_ndim: int, merge_gap: int = DEFAULT_MERGE_GAP):
    """The native plan of one sample per ``.npy`` file (a :class:`~dali_mesh.plan.PlanSet`,
    one item per file).

    One plan per distinct header (its bytes: shape, dtype with its byte order, C or Fortran order,
    header length), so files that differ only in byte order or order are read natively, each by its
    own plan, as the Python readers read them. Every header is read once here (one small read per
    file); at every read the operator checks the file still holds the header planned for it.

    Args:
        region_of: the window of a sample of a given shape (``Layout.region``).
        index_maps: channel subsets, as for :func:`read_npy_window`.
        sample_shape, dtype: what every file must hold (after ``index_maps``), or ``None``: per-sample
            shapes (a region per distinct header).
        sample_ndim: the samples' number of axes.
    """
    first, first_check = read_npy_header_bytes(files[0])
    native = native_dtype_of(first.dtype, files[0])
    if sample_shape is not None:
        shape = shape_of_sample(files[0], first.shape, index_maps=index_maps)
        if shape != sample_shape or native != dtype:
            raise ShapeMismatchError(
                files[0], f"shape {shape} {native} differs from the {sample_shape} {dtype} "
                "the source was made with: the file changed; make the source again")
    plans = PlanSet(native, sample_ndim)
    plan_of_header: dict = {}
    items = []
    headers = _npy_headers(files, first, first_check)
    stores = [native_store(f) for f in files]
    # every file an object an S3 ETag pins, its header read at that ETag as every read of it will be:
    # the reader need not read the headers again (a request per sample)
    pinned = all(s.pins(v) and v.size == h.file_size for (s, _), (h, _, v) in zip(stores, headers))
    if headers[0][1] != first_check:  # read twice, and replaced in between: which is the sample?
        raise DataFileError(files[0], "changed while the plan was made (its header now differs from the one "
                            "read first); define the pipeline again")
    for i, (h, check, version) in enumerate(headers):
        if h.native_dtype != native:
            raise ShapeMismatchError(h.path, f"dtype {h.native_dtype} differs from the first file's ({files[0]}) {native}")
        if check not in plan_of_header:
            check_frame(h.shape, h.path)
            shape = shape_of_sample(h.path, h.shape, index_maps=index_maps)
            if sample_shape is not None and shape != sample_shape:
                raise ShapeMismatchError(
                    h.path, f"shape {shape} differs from the first file's ({files[0]}) {sample_shape}; "
                    "make every file the same, or pass per_sample_shapes=True")
            wplan = plan_window(region_of(shape), index_maps)
            units = count_npy_units(h, wplan, (), merge_gap)
            if units > MAX_NATIVE_UNITS:
                raise NotNativeError(f"{h.path}: the window is {units} separate byte ranges, more than the native "
                                     f"reader plans (dali_mesh.formats.npy.MAX_NATIVE_UNITS = {MAX_NATIVE_UNITS}); "
                                     "a chunked copy (dali-mesh convert) reads it in a few ranges")
            u = plan_npy_units(h, wplan, (), merge_gap)
            plan_of_header[check] = plans.add_plan(ReadPlan.from_units(
                wplan, h.dtype, h.fortran_order, u.file_off, u.dst_off, u.unit_bytes, u.groups,
                b"" if pinned else check, repeat=u.repeat))
        k = plan_of_header[check]
        store, key = stores[i]
        # one entry per file: item i reads file i. A local file is checked by its size and header at
        # each read; an object also by its ETag, the version its header was read at (every read sends
        # If-Match: no HEAD request per read)
        tag = version.tag.encode() if version.size == h.file_size else b""  # a local file has none
        plans.files.append(PlanFile(key, h.file_size, store=store.spec, tag=tag))
        items.append((k, [(i, k, 0, 0)]))
    plans.items = items
    return plans
