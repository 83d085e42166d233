"""Read a window of one sample of an HDF5 dataset through h5py hyperslabs.

Each box of the read plan (:mod:`dali_mesh.plan.window`) is one ``Dataset.read_direct`` from a
hyperslab of the file into a hyperslab of the destination: HDF5 reads only the chunks (chunked
datasets, compressed or not) or the byte runs (contiguous datasets) that the box touches, and
converts big-endian data to the destination's native dtype. h5py is imported on first use.

A sample is ``dataset[prefix]``: e.g. one time step ``t`` of an ERA5-style ``(time, channel, lat,
lon)`` dataset is ``prefix=(t,)``; ``index_maps={0: channels}`` selects a channel subset.

What :func:`open_hdf5_dataset` refuses, naming the file and the dataset: a path that is not a
regular file (a FIFO would block HDF5's open for ever); by default, a dataset whose bytes live in
another file (external raw storage, an external link on its path, a virtual dataset), since a file
could otherwise make the loader deliver any file on the host as a sample (``allow_external=True``
for files you trust); a filter HDF5 cannot apply here (e.g. a plugin compressor that is not
installed); dtypes the pipeline cannot carry. HDF5's own refusals (a truncated file, a header
claiming more data than the file holds) are reported naming the file and the dataset.

:mod:`.hdf5_planner` plans the native reads of a dataset, :mod:`.hdf5_writer` writes one (what
``dali-mesh convert`` writes).
"""
from __future__ import annotations

import itertools
import logging
import os
import posixpath

import numpy as np

from dali_mesh.io._common import (DataFileError, ExternalStorageError, HeaderError, MissingArrayError,
                                  UnsupportedDtypeError, UnsupportedFilterError, check_dtype, native_dtype)
from dali_mesh.formats.box_reads import ArrayBoxes, read_array_window
from dali_mesh.partition import Region
from dali_mesh.io.containers import open_hdf5_container, open_hdf5_file

__all__ = ["open_hdf5_dataset", "only_dataset_name", "read_hdf5_window", "hdf5_sample_info"]

log = logging.getLogger(__name__)

_MAX_LINK_HOPS = 32  # soft links followed while resolving a dataset's path (a loop ends here)


def _resolve_links(h5py, f, path: str, name: str, allow_external: bool):
    """The object at ``name``, walking its path one link at a time so that an external link is
    seen before HDF5 opens the file it points at. Soft links are followed (at most
    ``_MAX_LINK_HOPS``); ``None`` when a component does not exist."""
    if allow_external:  # h5py's own resolution, external links followed
        return f.get(name)
    todo = [c for c in name.split("/") if c]
    node, where, hops = f, "/", 0
    while todo:
        if not isinstance(node, h5py.Group):
            return None
        comp = todo.pop(0)
        if comp == ".":
            continue
        link = node.get(comp, getlink=True)
        if link is None:
            return None
        here = posixpath.join(where, comp)
        if isinstance(link, h5py.SoftLink):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise HeaderError(path, f"dataset {name!r}: more than {_MAX_LINK_HOPS} soft links (a loop?)")
            target = link.path
            base = "/" if target.startswith("/") else where
            todo = [c for c in target.split("/") if c] + todo
            node, where = (f if base == "/" else f[base]), base
            continue
        if isinstance(link, h5py.ExternalLink):
            raise ExternalStorageError(
                path, f"dataset {name!r}: {here} is an external link to {link.path!r} in file "
                f"{link.filename!r}; refused by default (a file must not make the loader read other "
                "files); pass allow_external=True (dali-mesh commands: --allow-external) if you trust it")
        node, where = node[comp], here
    return node


def _check_storage(h5py, path: str, ds, allow_external: bool) -> None:
    """Refuse what would read other files and filters HDF5 cannot apply; each error names the
    dataset. (Contiguous storage past the end of the file HDF5 refuses itself when the dataset is
    opened: "invalid dataset size", or "truncated file" at the file's open.)"""
    name = ds.name
    if not allow_external:
        ext = ds.external
        if ext:
            files = sorted({str(e[0]) for e in ext})
            raise ExternalStorageError(
                path, f"dataset {name} keeps its raw data in external file(s) {files}; refused by default "
                "(a file must not make the loader read other files); pass allow_external=True "
                "(dali-mesh commands: --allow-external) if you trust it")
        if ds.is_virtual:
            srcs = sorted({f"{v.file_name}:{v.dset_name}" for v in ds.virtual_sources()})
            raise ExternalStorageError(
                path, f"dataset {name} is a virtual dataset mapping {srcs}; refused by default (its "
                "sources are other files, and a missing source reads as fill values); pass "
                "allow_external=True (dali-mesh commands: --allow-external) if you trust it")
    dcpl = ds.id.get_create_plist()
    for i in range(dcpl.get_nfilters()):
        code, _, _, fname = dcpl.get_filter(i)[:4]
        if not h5py.h5z.filter_avail(code):
            label = fname.decode("latin1", "replace") if isinstance(fname, bytes) else str(fname)
            raise UnsupportedFilterError(
                path, f"dataset {name} needs HDF5 filter {code} ({label or 'unnamed'}), which is not available "
                "here; install its plugin (e.g. `pip install hdf5plugin` and `import hdf5plugin`) or "
                "rewrite the file without it")


def open_hdf5_dataset(path: str | os.PathLike, name: str, *, random_access: bool = False,
                      allow_external: bool = False, version=None, **file_kwargs):
    """Open ``path`` read-only and return ``(h5py.File, Dataset)``; errors name the file.

    ``random_access=True`` opens the file in Python with ``POSIX_FADV_RANDOM`` and hands h5py the
    file object: the kernel then reads no pages beyond those HDF5 asks for (HDF5's own file
    descriptor gets readahead, which pulls neighbouring chunks of other ranks), at some cost in
    speed (every HDF5 read goes through Python).

    ``allow_external=False`` (default) refuses, with :class:`ExternalStorageError`, a dataset whose
    bytes live in other files: external raw storage (``dataset.external``), an external link on the
    dataset's path, a virtual dataset. ``True`` follows them, as h5py does; do that only for files
    you trust (such a file can make the loader deliver the bytes of any file on the host).

    ``version`` (a :class:`~dali_mesh.storage.Version` of an object in an object store): h5py reads
    that version of the object (every read sends its ETag) instead of the one a HEAD finds.

    Raises :class:`DataFileError` subclasses naming the file: missing, not a regular file, not
    HDF5, no such dataset or a corrupt one (e.g. a dataset claiming 2**40 elements in a 2 KiB file),
    a dtype the pipeline cannot carry, a filter that is not available.
    """
    import h5py

    path = str(path)
    f, fobj = open_hdf5_container(path, random_access, file_kwargs, version)
    try:
        try:
            obj = _resolve_links(h5py, f, path, name, allow_external)
        except (KeyError, OSError, ValueError, RuntimeError) as e:
            if isinstance(e, DataFileError):
                raise
            # HDF5's own checks (e.g. "invalid dataset size, likely file corruption" for a header
            # claiming 2**40 elements in a 2 KiB file) arrive as KeyError/OSError naming no file
            raise HeaderError(path, f"dataset {name!r} cannot be opened ({e}); the file is corrupt") from None
        if obj is None or not isinstance(obj, h5py.Dataset):
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            raise MissingArrayError(path, f"has no dataset {name!r}; datasets in the file: {names}")
        try:
            obj.dtype
        except (OSError, ValueError, TypeError) as e:
            raise UnsupportedDtypeError(path, f"dataset {name!r} has a type h5py cannot map ({e})") from None
        check_dtype(path, obj.dtype, label=f"dataset {name!r}: ")
        _check_storage(h5py, path, obj, allow_external)
    except BaseException:
        f.close()
        if fobj is not None:
            fobj.close()
        raise
    return f, obj


def only_dataset_name(path: str | os.PathLike) -> str:
    """The name of the one dataset in the HDF5 file ``path`` (the default when none is named).

    Raises :class:`MissingArrayError` listing the datasets when there are none or several, and the
    errors of :func:`open_hdf5_dataset` for a missing, non-regular or non-HDF5 file."""
    import h5py

    path = str(path)
    f = open_hdf5_file(path)  # local or in a byte store; its errors name the file
    with f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    if len(names) != 1:
        raise MissingArrayError(path, f"holds {len(names)} datasets {names}: name one (--dataset)")
    return names[0]


def hdf5_sample_info(dataset, num_prefix: int) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(sample shape, native dtype, samples along the first axis)`` of a dataset whose leading
    ``num_prefix`` axes index samples."""
    shape = tuple(dataset.shape)
    return shape[num_prefix:], native_dtype(dataset.dtype), (shape[0] if num_prefix else 1)


def _chunk_bytes(dataset, prefix, boxes) -> int:
    """Stored bytes of the chunks the boxes touch (hyperslab bytes for a contiguous dataset)."""
    itemsize = dataset.dtype.itemsize
    chunks = dataset.chunks
    if chunks is None:
        return sum(int(np.prod(ln)) * itemsize for _, _, ln in boxes)
    seen = set()
    total = 0
    dsid = dataset.id
    for _, fst, ln in boxes:
        full_start = tuple(prefix) + fst
        full_len = (1,) * len(prefix) + ln
        ranges = [range(s // c, (s + n - 1) // c + 1) for s, n, c in zip(full_start, full_len, chunks)]
        for idx in itertools.product(*ranges):
            if idx in seen:
                continue
            seen.add(idx)
            try:
                info = dsid.get_chunk_info_by_coord(tuple(i * c for i, c in zip(idx, chunks)))
                total += info.size or 0
            except Exception:  # an unwritten chunk (fill value): nothing stored, nothing read
                pass
    return total


def read_hdf5_window(dataset, region: Region, out: np.ndarray | None = None, *, count_chunks: bool = True,
                     path: str | None = None, **window) -> np.ndarray:
    """Fill ``out`` with the window of sample ``dataset[prefix]`` (an ``h5py.Dataset``), one hyperslab read
    per box: :func:`~dali_mesh.formats.box_reads.read_array_window` (``window``: its ``prefix``,
    ``index_maps``, ``expected_shape``, ``expected_dtype`` and ``stats``). ``count_chunks``: add the stored
    size of the chunks touched to ``stats.bytes_read`` (an HDF5 metadata look-up per chunk). ``path``: the
    file's name for error messages (default: h5py's ``file.filename``).
    """
    path = path or dataset.file.filename

    def read_box(buf, dst, src, local):
        try:
            dataset.read_direct(buf, source_sel=src, dest_sel=dst)
        except OSError as e:
            if "filter" in str(e).lower():  # a filter missing or failing is not truncation
                raise DataFileError(path, f"reading dataset {dataset.name} failed in an HDF5 filter ({e}); "
                                    "install the filter's plugin, or the chunk is corrupt") from None
            raise DataFileError(path, f"reading dataset {dataset.name} failed ({e}); the file is truncated or corrupt") from None
        local.read_calls += 1

    def counted(local, plan, prefix):
        if count_chunks and plan is not None:
            local.bytes_read += _chunk_bytes(dataset, prefix, plan.boxes())

    return read_array_window(ArrayBoxes(path, tuple(dataset.shape), native_dtype(dataset.dtype),
                                        f"dataset {dataset.name} of shape {dataset.shape}", read_box, counted,
                                        label=f"dataset {dataset.name}: ", contiguous=True), region, out, **window)


# ---- the native reader's plan ---------------------------------------------------------------------
