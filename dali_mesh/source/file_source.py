"""Sources of one sample per file (or store), in any registered format of one array per location:
:class:`FileSource`, and :class:`NumpySource`, the same over ``.npy`` files with the ``.npy`` reader's
options."""
from __future__ import annotations

import os
from typing import Sequence

from dali_mesh._checks import is_int as _is_int
from dali_mesh.formats import FORMATS, NPY, ArrayFormat, format_named
from dali_mesh.io._common import ShapeMismatchError, check_frame, sample_shape
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.plan import NotNativeError
from dali_mesh.partition import Layout
from dali_mesh.source.arguments import channel_maps, file_list, check_group_rows, normalise_maps, resolve_rows, with_rows
from dali_mesh.source.base import WindowSource

__all__ = ["FileSource", "NumpySource", "file_source"]


class FileSource(WindowSource):
    """One sample per file (or store) of ``format``, read through the format's own ``open`` and
    ``read_window``; this rank's window of it.

    Args:
        files: the files (or stores); the sample id is the index in this list.
        layout: the ``Layout`` (its mesh coordinate decides the window and the sample group).
        format: a registered format of one array per location (``steps=False``), by name or object.
        name: the array in each file (``None``: the location is the array).
        format_options: options of the format's ``info`` and ``open``.
        read_options: options of the format's ``read_window`` (``.npy``: ``merge_gap``, ``direct``, ``method``).
        batch_size, shuffle, seed, drop_last, channels, channel_axis, per_sample_shapes, check_files,
            reuse_buffers, share, storage_options, rows: as :class:`NumpySource`.
    """

    def __init__(self, files: Sequence[str | os.PathLike], layout: Layout, *, format, name: str | None = None,
                 format_options: dict | None = None, read_options: dict | None = None, batch_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 channels: Sequence[int] | None = None, channel_axis: int = 0, per_sample_shapes: bool = False,
                 check_files: bool = False, reuse_buffers: bool = True, share=None,
                 storage_options: dict | None = None, rows=None) -> None:
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         per_sample_shapes=per_sample_shapes, reuse_buffers=reuse_buffers, share=share)
        self.format = format_named(format) if isinstance(format, str) else format
        if not isinstance(self.format, ArrayFormat) or self.format.steps:
            raise ValueError(f"format must name a format of one sample per location "
                             f"({', '.join(n for n, f in FORMATS.items() if not f.steps)}), got {format!r}")
        self.name = name
        self.format_options = dict(format_options or {})
        self.read_options = dict(read_options or {})
        self.files = file_list(files, type(self).__name__, self.format.container)
        self._use_storage_options(storage_options)
        self.num_samples = len(self.files)
        self.index_maps = channel_maps(channels, channel_axis)
        first = self._info(self.files[0])
        check_frame(first.shape, self.files[0])
        self.index_maps = normalise_maps(self.index_maps, first.shape, self.files[0])
        self.rows, self.group_rows = resolve_rows(rows, layout, self.share_dims)
        check_group_rows(self.index_maps, self.rows, self.group_rows, layout, first.shape, self.files[0])
        self.index_maps = with_rows(self.index_maps, self.rows, layout, first.shape, self.files[0])
        shape = sample_shape(self.files[0], first.shape, index_maps=self.index_maps)
        self.sample_ndim = len(shape)
        self.dtype = first.dtype
        self.sample_shape = None if per_sample_shapes else shape
        if self.sample_shape is not None:
            self.region  # fail now if the layout does not fit the data
        self._check_batches()
        if check_files:
            for f in self.files[1:]:
                info = self._info(f)
                check_frame(info.shape, f)
                s = sample_shape(f, info.shape, index_maps=self.index_maps)
                if info.dtype != self.dtype or (not per_sample_shapes and s != shape):
                    raise ShapeMismatchError(
                        f, f"shape {s} {info.dtype} differs from the first file's ({self.files[0]}) "
                        f"{shape} {self.dtype}; make every file the same, or pass per_sample_shapes=True")

    def _info(self, path: str):
        return self.format.info(path, self.name, **self.format_options)

    def _read(self, sample_id: int) -> tuple:
        path = self.files[sample_id]
        if self.sample_shape is None:
            shape = self._info(path).shape
            check_frame(shape, path)
            region = self.region_of(sample_shape(path, shape, index_maps=self.index_maps))
            expected = None
        else:
            region, expected = self.region, self.sample_shape
        out = self._empty(region.window_shape, self.dtype)
        handle = self.format.open(path, self.name, **self.format_options)
        try:
            self.format.fill_window(handle, region, out, prefix=(), index_maps=self.index_maps,
                                    expected_shape=expected, expected_dtype=self.dtype, **self.read_options)
        finally:
            self.format.close(handle)
        return (out,)

    def _files_of(self, sample_id: int) -> str:
        return self.files[sample_id]

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        return (self.format.plan_files(self.files, region_of=self.region_of, index_maps=self.index_maps,
                                       sample_shape=self.sample_shape, dtype=self.dtype, sample_ndim=self.sample_ndim,
                                       merge_gap=merge_gap),)


class NumpySource(FileSource):
    """One sample per ``.npy`` file; this rank's window of it.

    Args:
        files: the ``.npy`` paths; the sample id is the index in this list.
        layout: the ``Layout`` (its mesh coordinate decides the window and the sample group).
        batch_size: the pipeline's batch size (the sample order pads to whole batches).
        shuffle, seed, drop_last: the sample order (:func:`dali_mesh.sample_order`).
        channels, channel_axis: read only these indices of ``channel_axis`` (the sample shape then
            has ``len(channels)`` there; the layout applies to that shape).
        rows: an index-set window (:class:`~dali_mesh.partition.Rows`, a graph or mesh partition's rows
            for this rank): ``sample[..., rows.ids, ...]`` on ``rows.axis``, in that order, reading only
            those rows (runs of adjacent ids are merged into reads). The layout must not shard that axis.
            With ``share=``, ``{mesh coordinate: Rows}`` of every member of this rank's read group: the
            group reads their union once (:func:`~dali_mesh.source.arguments.resolve_rows`).
        per_sample_shapes: allow files of different shapes (the region is computed per file);
            otherwise every file must match the first (shape and dtype), or an error names it.
        merge_gap, direct, method: passed to :func:`dali_mesh.formats.npy.read_npy_window`.
        check_files: read every header now (errors name the first bad file) instead of on first use.
        reuse_buffers: recycle output arrays that nobody holds any more
            (:class:`~dali_mesh.source.buffers.BufferPool`).
        share: ``"group"`` (or a list of mesh dim names): read once per group; the ranks that read the
            same samples (every mesh dim that does not split the batch, or the dims named) split the
            batches, each reads its batches' group window and ``MeshLoader`` exchanges the members'
            windows over torch.distributed (:mod:`dali_mesh.torch.group_exchange`). The same for every source.
        storage_options: for ``s3://``, ``gs://`` and ``https://`` files, named as fsspec's s3fs names them
            (``anon``, ``key``, ``secret``, ``token``, ``endpoint_url``, ``client_kwargs={"region_name": ...}``,
            ``profile``; and the client's ``retries``, ``retry_seconds``, ``timeout``, ``stall``); without
            them, the environment's (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...). Kept
            in memory only (never in a plan, a fingerprint or a checkpoint). The same for every source.
    """

    def __init__(self, files: Sequence[str | os.PathLike], layout: Layout, *, batch_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 channels: Sequence[int] | None = None, channel_axis: int = 0,
                 per_sample_shapes: bool = False, merge_gap: int = DEFAULT_MERGE_GAP,
                 direct: bool = False, method: str = "auto", check_files: bool = False,
                 reuse_buffers: bool = True, share=None, storage_options: dict | None = None,
                 rows=None) -> None:
        if not _is_int(merge_gap) or merge_gap < 0:
            raise ValueError(f"merge_gap must be an integer >= 0 (bytes), got {merge_gap!r}")
        if method not in ("auto", "preadv", "mmap"):
            raise ValueError(f"method must be 'auto', 'preadv' or 'mmap', got {method!r}")
        self.merge_gap, self.direct, self.method = int(merge_gap), bool(direct), method
        super().__init__(files, layout, format=NPY, read_options={"merge_gap": self.merge_gap, "direct": self.direct,
                                                                  "method": self.method},
                         batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, channels=channels,
                         channel_axis=channel_axis, per_sample_shapes=per_sample_shapes, check_files=check_files,
                         reuse_buffers=reuse_buffers, share=share, storage_options=storage_options, rows=rows)

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        if self.direct:
            raise NotNativeError("NumpySource(direct=True) asks for O_DIRECT, which the native reader does not do")
        return super().native_plans(merge_gap)


#: the named per-file sources of the formats that have one (their class name goes into checkpoints)
_SOURCE_CLASSES = {NPY.name: NumpySource}


def file_source(files, layout, *, format, **kw) -> FileSource:
    """The per-file source of ``format`` over ``files``: :class:`NumpySource` for ``.npy``, a
    :class:`FileSource` for any other registered format of one array per location."""
    fmt = format_named(format) if isinstance(format, str) else format
    cls = _SOURCE_CLASSES.get(fmt.name)
    return cls(files, layout, **kw) if cls is not None else FileSource(files, layout, format=fmt, **kw)
