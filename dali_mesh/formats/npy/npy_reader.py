"""Read a window of a ``.npy`` file, reading only the bytes the window needs.

- Own header parser (format 1.0, 2.0, 3.0): the header dict is parsed with ``ast.literal_eval``
  (literals only, nothing is ever unpickled); object, structured and string dtypes are refused.
- The window's boxes (see :mod:`dali_mesh.plan.window`) become byte ranges; ranges whose gap is at most
  ``merge_gap`` bytes, or whose gap holds no page they do not touch anyway, are merged into one read
  (the gap lands in a scratch buffer). Each read is one ``os.preadv`` whose buffers are the
  destination's own memory, so bytes go straight from the page cache (or the disk) into the window:
  no staging copy for C-order files and C-contiguous outputs.
- The default method is ``preadv``: a file truncated or rewritten while it is read gives a
  :class:`TruncatedFileError` naming it. ``method="mmap"`` (only when asked: it is never chosen
  automatically) copies out of a ``MADV_RANDOM`` mapping, which reads the same pages with fewer
  copies for innermost-axis splits, but a file truncated under the mapping kills the process with
  SIGBUS.
- The file is opened read-only and non-blocking (a FIFO never blocks the open), anything but a
  regular file is refused, and ``POSIX_FADV_RANDOM`` is set, so that kernel readahead pulls no bytes
  that were not asked for. ``direct=True`` switches the descriptor to ``O_DIRECT`` (page cache
  bypassed; reads are widened to 4 KiB alignment through an aligned bounce buffer).
- The header is checked as strictly as numpy checks it (versions 1.0, 2.0, 3.0; at most 64 axes;
  the data size must equal the file's), and dtypes the pipeline cannot carry (complex, datetime64,
  timedelta64, long double, structured, strings, objects) are refused at header time.
- Fortran-order files are read as the C-order array of reversed shape (then transposed); big-endian
  data is byte-swapped in place: the output always holds native-endian values.
"""
from __future__ import annotations

import ast
import logging
import math
import mmap
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from dali_mesh.io._common import (DataFileError, HeaderError, IOStats, TruncatedFileError, UnsupportedDtypeError,
                                  _account, check_dtype, check_expected, check_region_fits, native_dtype, sample_shape,
                                  window_out)
from dali_mesh.plan.window import WindowPlan, plan_window
from dali_mesh.plan.ranges import (DEFAULT_MERGE_GAP, StoredArray, Units, count_npy_units, group_units,
                                   plan_npy_reads, plan_npy_units)
from dali_mesh.partition import Region
from dali_mesh.storage import StoredObject, readv_all, store_of

__all__ = [
    "DEFAULT_MERGE_GAP",
    "NpyHeader",
    "StoredArray",
    "count_npy_units",
    "group_units",
    "read_npy_header",
    "read_npy_header_bytes",
    "read_npy_window",
    "plan_npy_reads",
    "plan_npy_units",
    "Units",
]

log = logging.getLogger(__name__)

#: Largest header accepted (numpy's own limit is 10000 bytes; a larger one is corrupt or hostile).
MAX_HEADER_BYTES = 65536
_MAGIC = b"\x93NUMPY"
_DIRECT_ALIGN = 4096
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_WILLNEED_CHUNK = 512 << 10
_DIRECT_CHUNK = 16 << 20  # largest O_DIRECT bounce read
#: numpy's own limit on the number of axes (NPY_MAXDIMS in numpy 2); numpy refuses more.
MAX_NDIM = 64


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says.

    ``dtype`` is the stored dtype (its byte order as in the file); ``data_offset`` is where the array
    data starts; ``file_size`` the size of the file when it was parsed.
    """

    path: str
    version: tuple[int, int]
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int
    file_size: int

    @property
    def native_dtype(self) -> np.dtype:
        return native_dtype(self.dtype)

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _open(path: str, direct: bool = False) -> StoredObject:
    store, key = store_of(path)
    return store.open(key, ".npy file", direct=direct)


def _parse_header(path: str, head: bytes, file_size: int) -> NpyHeader:
    """Parse the header bytes at the start of a ``.npy`` file (``head`` holds at least the header)."""
    if len(head) < 10 or head[:6] != _MAGIC:
        raise HeaderError(path, "not a .npy file (bad magic string); was it written by numpy.save?")
    major, minor = head[6], head[7]
    if (major, minor) == (1, 0):
        hlen_size, encoding = 2, "latin1"
    elif (major, minor) in ((2, 0), (3, 0)):
        hlen_size, encoding = 4, ("latin1" if major == 2 else "utf8")
    else:  # numpy refuses every other version (1.9 included)
        raise HeaderError(path, f".npy format version {major}.{minor} is not supported (1.0, 2.0, 3.0 are)")
    hlen = int.from_bytes(head[8 : 8 + hlen_size], "little")
    offset = 8 + hlen_size + hlen
    if hlen > MAX_HEADER_BYTES:
        raise HeaderError(path, f"header of {hlen} bytes is larger than the {MAX_HEADER_BYTES} allowed; the file is corrupt")
    if offset > file_size:
        raise HeaderError(path, f"header claims {hlen} bytes but the file has only {file_size}; the file is truncated or corrupt")
    raw = head[8 + hlen_size : offset]
    if len(raw) < hlen:
        raise HeaderError(path, "header is cut short")
    try:
        text = raw.decode(encoding)
        # literals only: never evaluates code, never unpickles. TypeError: an unhashable key
        # ({[1]: 2}); MemoryError/RecursionError: absurdly nested literals
        meta = ast.literal_eval(text)
    except (UnicodeDecodeError, ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise HeaderError(path, f"header is not a valid dict literal ({type(e).__name__}); the file is corrupt") from None
    keys = {"descr", "fortran_order", "shape"}
    if not isinstance(meta, dict) or meta.keys() != keys:
        # repr, not sorted(): keys may be of mixed, unorderable types
        got = ", ".join(_short(k) for k in meta) if isinstance(meta, dict) else type(meta).__name__
        raise HeaderError(path, f"header must be a dict with keys descr, fortran_order, shape; got {got}")
    descr, fortran, shape = meta["descr"], meta["fortran_order"], meta["shape"]
    if not isinstance(fortran, bool):
        raise HeaderError(path, f"fortran_order must be True or False, got {_short(fortran)}")
    if not isinstance(shape, tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise HeaderError(path, f"shape must be a tuple of non-negative integers, got {_short(shape)}")
    if len(shape) > MAX_NDIM:
        raise HeaderError(path, f"shape has {len(shape)} axes; numpy allows at most {MAX_NDIM}: the file is corrupt")
    if not isinstance(descr, str):
        raise UnsupportedDtypeError(path, f"structured dtype {_short(descr)} is not supported; store plain numeric arrays")
    try:
        dtype = np.dtype(descr)
    except Exception as e:  # np.dtype raises TypeError, ValueError, SyntaxError (',<f4'), ...
        raise HeaderError(path, f"dtype descr {_short(descr)} is not understood ({type(e).__name__}); "
                          "the file is corrupt or not written by numpy") from None
    if dtype.kind == "O" or dtype.hasobject:
        raise UnsupportedDtypeError(path, "object dtype is refused (it would need unpickling); store a numeric array")
    check_dtype(path, dtype)
    header = NpyHeader(path, (major, minor), shape, dtype, fortran, offset, file_size)
    expected = offset + header.data_bytes
    if file_size != expected:
        what = "truncated" if file_size < expected else "longer than its header says"
        cls = TruncatedFileError if file_size < expected else HeaderError
        raise cls(
            path,
            f"file is {what}: header says shape {shape} of {dtype} ({header.data_bytes} data bytes "
            f"after a {offset}-byte header = {expected} bytes) but the file has {file_size} bytes",
        )
    return header


def _short(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (header values may be huge or hostile)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_header(obj: StoredObject, path: str, stats: IOStats) -> NpyHeader:
    return _read_header_and_bytes(obj, path, stats)[0]


def _read_header_and_bytes(obj: StoredObject, path: str, stats: IOStats) -> tuple[NpyHeader, bytes]:
    """The header and the very bytes it was parsed from (``data_offset`` of them)."""
    size = obj.size
    head = obj.pread(512, 0)
    stats.read_calls += 1
    stats.bytes_read += len(head)
    if len(head) >= 12 and head[:6] == _MAGIC and head[6] in (2, 3):
        need = 12 + int.from_bytes(head[8:12], "little")
    elif len(head) >= 10 and head[:6] == _MAGIC:
        need = 10 + int.from_bytes(head[8:10], "little")
    else:
        need = 0
    if len(head) < need <= min(size, MAX_HEADER_BYTES + 12):
        more = obj.pread(need - len(head), len(head))
        stats.read_calls += 1
        stats.bytes_read += len(more)
        head += more
    header = _parse_header(path, head, size)
    return header, bytes(head[:header.data_offset])


def read_npy_header(path: str | os.PathLike) -> NpyHeader:
    """Parse and check the header of a ``.npy`` file (shape, dtype, order, size against the data).

    Every failure is a :class:`DataFileError` naming the file: missing file, not a regular file,
    corrupt header, a data size that differs from the file's, a dtype the pipeline cannot carry."""
    return read_npy_header_bytes(path)[0]


def read_npy_header_bytes(path: str | os.PathLike) -> tuple[NpyHeader, bytes]:
    """:func:`read_npy_header` and the header's bytes as parsed: what a plan checks at every read
    must be exactly what it was planned from (a second read could see a file replaced between the
    two)."""
    path = str(path)
    stats = IOStats(files_opened=1)
    obj = _open(path)
    try:
        return _read_header_and_bytes(obj, str(path), stats)
    except OSError as e:
        raise _io_error(path, e) from None
    finally:
        obj.close()
        _account(None, stats)


def _io_error(path: str, e: OSError) -> Exception:
    """A read's ``OSError`` (EIO from a failing disk, ESTALE on NFS ...) as a :class:`DataFileError`
    naming the file; errors that already are one pass through."""
    if isinstance(e, DataFileError):
        return e
    return DataFileError(path, f"reading failed ({e.strerror or e}); check the file and its storage")


def _aligned_buffer(size: int) -> mmap.mmap:
    return mmap.mmap(-1, max(size, _DIRECT_ALIGN))  # anonymous maps are page aligned


def _read_groups(obj: StoredObject, path, dest: memoryview, fo, do, ub, groups, stats, direct: bool) -> None:
    fo_l, do_l, ub_l = fo.tolist(), do.tolist(), ub.tolist()
    if direct:  # reads widen to pages: merge groups whose widened spans touch
        merged = []
        for g0, g1 in groups:
            if merged and fo_l[g0] // _DIRECT_ALIGN <= -(-(fo_l[merged[-1][1] - 1] + ub_l[merged[-1][1] - 1]) // _DIRECT_ALIGN):
                merged[-1] = (merged[-1][0], g1)
            else:
                merged.append((g0, g1))
        groups = merged
    else:
        max_gap = 0
        if fo.size > 1:
            max_gap = int(max(0, (fo[1:] - fo[:-1] - ub[:-1]).max()))
        scratch = memoryview(bytearray(max_gap)) if max_gap else None
        gap_views: dict[int, memoryview] = {}
        for g0, g1 in groups:
            bufs, lens = [dest[do_l[g0] : do_l[g0] + ub_l[g0]]], [ub_l[g0]]
            end = fo_l[g0] + ub_l[g0]
            for f, d, n in zip(fo_l[g0 + 1 : g1], do_l[g0 + 1 : g1], ub_l[g0 + 1 : g1]):
                gap = f - end
                if gap:
                    view = gap_views.get(gap)
                    if view is None:
                        view = gap_views[gap] = scratch[:gap]
                    bufs.append(view)
                    lens.append(gap)
                bufs.append(dest[d : d + n])
                lens.append(n)
                end = f + n
            readv_all(obj, bufs, lens, fo_l[g0], stats)
        return
    bounce = None
    for g0, g1 in groups:
        lo = fo_l[g0] // _DIRECT_ALIGN * _DIRECT_ALIGN
        hi_group = fo_l[g1 - 1] + ub_l[g1 - 1]
        u = g0
        while lo < hi_group:
            hi = min(-(-hi_group // _DIRECT_ALIGN) * _DIRECT_ALIGN, lo + _DIRECT_CHUNK)
            if bounce is None or len(bounce) < hi - lo:
                bounce = _aligned_buffer(hi - lo)
            view = memoryview(bounce)[: hi - lo]
            got = obj.readv([view], lo)
            stats.read_calls += 1
            stats.bytes_read += got
            # copy every unit (or unit part) inside [lo, lo + got)
            while u < g1 and fo_l[u] < lo + got:
                a, b = max(fo_l[u], lo), min(fo_l[u] + ub_l[u], lo + got)
                d = do_l[u] + (a - fo_l[u])
                dest[d : d + b - a] = view[a - lo : b - lo]
                if b < fo_l[u] + ub_l[u]:
                    break
                u += 1
            if got < hi - lo and lo + got < hi_group:
                raise TruncatedFileError(path, f"O_DIRECT read at byte {lo} ended early: the file was truncated while reading")
            view.release()
            lo = hi


def _read_mmap(obj: StoredObject, header: NpyHeader, plan: WindowPlan, prefix, out, stats: IOStats,
               units=None, willneed: bool = True) -> None:
    """Copy every box out of a read-only mapping of the file (no readahead: ``MADV_RANDOM``; the
    pages needed are announced with ``MADV_WILLNEED`` so that cold reads go out as large requests
    instead of one synchronous page fault per page).

    A file truncated after this check and while the boxes are copied raises SIGBUS in the process:
    that is why this path runs only when the caller asks for ``method="mmap"``."""
    path = header.path
    size = obj.current_size()
    if size != header.file_size:
        raise TruncatedFileError(path, f"file changed size while opening ({header.file_size} -> {size} bytes); "
                                 "it is being rewritten: read it again once it is whole")
    try:
        mm = mmap.mmap(obj.fileno(), 0, access=mmap.ACCESS_READ)
    except (ValueError, OSError) as e:  # "cannot mmap an empty file", ENODEV ...
        raise DataFileError(path, f"cannot be memory-mapped ({e}); use method='preadv'") from None
    if len(mm) < header.file_size:  # shrank between fstat and mmap
        mm.close()
        raise TruncatedFileError(path, f"file shrank to {len(mm)} bytes while opening; it is being rewritten")
    try:
        if hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            mm.madvise(mmap.MADV_RANDOM)
        if units is None:
            fo, _, ub, _ = plan_npy_reads(header, plan, prefix)
        else:
            fo, ub = units
        groups = group_units(fo, ub, 0, True)  # exactly the pages needed
        if willneed and hasattr(mmap, "MADV_WILLNEED"):
            # start reading exactly the pages needed, in large requests, before faulting them in
            fo_l, ub_l = fo.tolist(), ub.tolist()
            for g0, g1 in groups:
                lo = fo_l[g0] // _PAGE * _PAGE
                hi = fo_l[g1 - 1] + ub_l[g1 - 1]
                # the kernel caps one WILLNEED at the device's readahead size: announce in pieces
                for a in range(lo, hi, _WILLNEED_CHUNK):
                    mm.madvise(mmap.MADV_WILLNEED, a, min(_WILLNEED_CHUNK, hi - a))
        arr = np.ndarray(header.shape, dtype=header.dtype, buffer=mm, offset=header.data_offset,
                         order="F" if header.fortran_order else "C")
        for dst, src in plan.slices(prefix):
            out[dst] = arr[src]
            stats.read_calls += 1
        del arr
        # bytes: the pages the boxes touch
        if len(fo):
            first, last = fo // _PAGE, (fo + ub - 1) // _PAGE
            order = np.argsort(first)
            first, last = first[order], np.maximum.accumulate(last[order])
            new_pages = np.minimum(last - first + 1, last - np.concatenate(([first[0] - 1], last[:-1])))
            stats.bytes_read += int(np.clip(new_pages, 0, None).sum()) * _PAGE
    finally:
        mm.close()


def read_npy_window(
    path: str | os.PathLike,
    region: Region,
    out: np.ndarray | None = None,
    *,
    prefix: Sequence[int] = (),
    index_maps: Mapping[int, Sequence[int]] | None = None,
    merge_gap: int = DEFAULT_MERGE_GAP,
    page_merge: bool = True,
    direct: bool = False,
    method: str = "auto",
    expected_shape: Sequence[int] | None = None,
    expected_dtype=None,
    stats: IOStats | None = None,
) -> np.ndarray:
    """Fill ``out`` (shape ``region.window_shape``, the file's dtype in native byte order) with the
    window of the sample in ``path``, reading only the bytes the window needs.

    Args:
        region: the window and its domain, in sample coordinates (``Layout.region``).
        out: destination; allocated when ``None``. Any strides: a C-contiguous ``out`` of a C-order
            file is read into directly, anything else through one staging buffer.
        prefix: indices of leading file axes that select the sample (the sample is
            ``file[prefix]``); empty for one sample per file.
        index_maps: sample axis -> file indices of that axis (a channel subset).
        merge_gap: byte ranges whose gap is at most this are read in one call.
        page_merge: also merge gaps that hold no page the neighbouring ranges do not touch.
        direct: switch the descriptor to ``O_DIRECT`` (bypass the page cache).
        method: ``"preadv"`` (exact byte ranges straight into ``out``); ``"auto"`` (default) is
            preadv. ``"mmap"`` (only when asked) maps the file with ``MADV_RANDOM``, announces
            exactly the pages needed with ``MADV_WILLNEED`` and copies the boxes (``bytes_read``
            then counts the pages touched): for an innermost-axis split it reads the same pages with
            fewer copies. **Risk:** if another process truncates or rewrites the file while the
            boxes are copied, the kernel kills this process (or the DALI worker) with SIGBUS, with
            no Python error and no file named; preadv turns the same race into a
            :class:`TruncatedFileError`. Use mmap only for files nothing rewrites while training.
        expected_shape, expected_dtype: the sample shape (after prefix and index maps) and dtype the
            caller expects; a file that differs raises :class:`ShapeMismatchError` naming it.
        stats: counters to add this read to (the process-wide counters are always updated).

    Returns ``out``, equal to ``take_window(np.load(path)[prefix], region)``. Every problem with the
    file is a :class:`DataFileError` naming it (see :func:`read_npy_header`).
    """
    path = str(path)
    if method not in ("auto", "preadv", "mmap"):
        raise ValueError(f"method must be 'auto', 'preadv' or 'mmap', got {method!r}")
    if method == "mmap" and direct:
        raise ValueError("direct=True (O_DIRECT) reads with preadv; it cannot be combined with method='mmap'")
    local = IOStats(files_opened=1)
    obj = _open(path, direct=direct)
    try:
        if method == "mmap" and obj.store.local_path(obj.key) is None:
            raise ValueError(f"{path}: method='mmap' maps local files only; use method='preadv'")
        # obj is checked again after the read (check_unchanged): never a window of two versions
        header = _read_header(obj, path, local) if not direct else None
        if direct:  # O_DIRECT needs aligned reads even for the header: read it through a plain open
            header = read_npy_header(path)
        shape = sample_shape(path, header.shape, prefix, index_maps, f"shape {header.shape}")
        native = header.native_dtype
        check_expected(path, shape, native, expected_shape, expected_dtype)
        check_region_fits(path, region, shape)
        window_shape = region.window_shape
        out = window_out(path, region, out, native)
        local.window_bytes += out.nbytes
        plan = plan_window(region, index_maps)
        if out.size == 0:
            return out
        fo, do, ub, groups = plan_npy_reads(header, plan, prefix, merge_gap, page_merge)
        # never mmap unless asked: a file rewritten under a mapping kills the process (SIGBUS)
        if method == "mmap":
            _read_mmap(obj, header, plan, prefix, out, local, units=(fo, ub))
            obj.check_unchanged()
            plan.finish(out)
            return out
        if header.fortran_order:
            direct_ok = out.T.flags.c_contiguous
            stage = out.T if direct_ok else np.empty(window_shape[::-1], native)
        else:
            direct_ok = out.flags.c_contiguous
            stage = out if direct_ok else np.empty(window_shape, native)
        if groups:
            dest = memoryview(stage.reshape(-1).view(np.uint8))
            _read_groups(obj, path, dest, fo, do, ub, groups, local, direct)
            dest.release()
        obj.check_unchanged()
        if header.dtype.byteorder not in "=|":
            stage.byteswap(inplace=True)  # the file is foreign-endian: make the values native
        if not direct_ok:
            out[...] = stage.T if header.fortran_order else stage
        plan.finish(out)
        return out
    except OSError as e:
        raise _io_error(path, e) from None
    finally:
        obj.close()
        _account(stats, local)
