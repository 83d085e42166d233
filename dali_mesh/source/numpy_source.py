"""Sources of one sample per ``.npy`` file."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.io._common import ShapeMismatchError, apply_index_maps, check_frame
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.formats.npy import plan_npy_files, read_npy_header, read_npy_window
from dali_mesh.plan import NotNativeError
from dali_mesh.partition import Layout
from dali_mesh.source.arguments import channel_maps, file_list, normalise_maps
from dali_mesh.source.base import WindowSource

__all__ = ["NumpySource"]



class NumpySource(WindowSource):
    """One sample per ``.npy`` file; this rank's window of it.

    Args:
        files: the ``.npy`` paths; the sample id is the index in this list.
        layout: the ``Layout`` (its mesh coordinate decides the window and the sample group).
        batch_size: the pipeline's batch size (the sample order pads to whole batches).
        shuffle, seed, drop_last: the sample order (:func:`dali_mesh.sample_order`).
        channels, channel_axis: read only these indices of ``channel_axis`` (the sample shape then
            has ``len(channels)`` there; the layout applies to that shape).
        per_sample_shapes: allow files of different shapes (the region is computed per file);
            otherwise every file must match the first (shape and dtype), or an error names it.
        merge_gap, direct, method: passed to :func:`dali_mesh.io.read_npy_window`.
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
                 reuse_buffers: bool = True, share=None, storage_options: dict | None = None) -> None:
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         per_sample_shapes=per_sample_shapes, reuse_buffers=reuse_buffers, share=share)
        self.files = file_list(files, "NumpySource", "file")
        self._use_storage_options(storage_options)
        self.num_samples = len(self.files)
        self.index_maps = channel_maps(channels, channel_axis)
        if not _is_int(merge_gap) or merge_gap < 0:
            raise ValueError(f"merge_gap must be an integer >= 0 (bytes), got {merge_gap!r}")
        self.merge_gap = int(merge_gap)
        self.direct = bool(direct)
        if method not in ("auto", "preadv", "mmap"):
            raise ValueError(f"method must be 'auto', 'preadv' or 'mmap', got {method!r}")
        self.method = method
        first = read_npy_header(self.files[0])
        check_frame(first.shape, self.files[0])
        self.index_maps = normalise_maps(self.index_maps, first.shape, self.files[0])
        shape = apply_index_maps(first.shape, self.index_maps, self.files[0])
        self.sample_ndim = len(shape)
        self.dtype = first.native_dtype
        self.sample_shape = None if per_sample_shapes else shape
        if self.sample_shape is not None:
            self.region  # fail now if the layout does not fit the data
        self._check_batches()
        if check_files:
            for f in self.files[1:]:
                h = read_npy_header(f)
                check_frame(h.shape, f)
                s = apply_index_maps(h.shape, self.index_maps, f)
                if h.native_dtype != self.dtype or (not per_sample_shapes and s != shape):
                    raise ShapeMismatchError(
                        f, f"shape {s} {h.native_dtype} differs from the first file's ({self.files[0]}) "
                        f"{shape} {self.dtype}; make every file the same, or pass per_sample_shapes=True")

    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:
        path = self.files[sample_id]
        if self.sample_shape is None:
            h = read_npy_header(path)
            check_frame(h.shape, path)
            region = self.region_of(apply_index_maps(h.shape, self.index_maps, path))
            expected = None
        else:
            region, expected = self.region, self.sample_shape
        out = read_npy_window(path, region, self._empty(region.window_shape, self.dtype),
                              prefix=(), index_maps=self.index_maps,
                              merge_gap=self.merge_gap, direct=self.direct, method=self.method,
                              expected_shape=expected, expected_dtype=self.dtype)
        return (out,)

    def _files_of(self, sample_id: int) -> str:
        return self.files[sample_id]

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        if self.direct:
            raise NotNativeError("NumpySource(direct=True) asks for O_DIRECT, which the native reader does not do")
        return (plan_npy_files(self.files, region_of=self.region_of, index_maps=self.index_maps,
                               sample_shape=self.sample_shape, dtype=self.dtype, sample_ndim=self.sample_ndim,
                               merge_gap=merge_gap),)
