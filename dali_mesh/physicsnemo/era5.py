"""A drop-in for PhysicsNeMo's ``ERA5HDF5Datapipe`` in which each rank reads only its band.

Same arguments, same files, same output (a list holding one dict: ``invar`` ``(B, C, H, W)``, or
``(B, num_history + 1, C, H, W)``; ``outvar`` ``(B, num_steps, C, H, W)``; ``cos_zenith``
``(B, num_history + num_steps + 1, 1, H, W)``; ``time_of_year_idx`` ``(B, 1)``), and with
``order="physicsnemo"`` (the default) the same samples in the same order, batch for batch; but
``H, W`` are this rank's window of the layout (halo included with ``output="local"``, the owned
band as a ShardTensor with ``output="shard_tensor"``), read by the native reader (decoded on DALI's
threads where the files are compressed) instead of whole fields in Python worker processes.

What it does not do: ``interpolation_type`` (a resize of each rank's band is not the band of the
resized field) is refused; ``cos_zenith`` needs ``latlon_resolution`` equal to the fields' ``(H, W)``
when the fields are split (the zenith grid is split with them).

``data_dir`` and ``stats_dir`` may be ``s3://`` or ``gs://`` prefixes (``stats_dir`` also an
``https://`` one) read with ``storage_options``: the year files are found by listing the prefix, by
the local glob's rule.
"""
from __future__ import annotations

import datetime
import fnmatch
import io
import logging
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from dali_mesh.io.containers import open_hdf5_file
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, LayoutError, take_window
from dali_mesh.physicsnemo.era5_source import ERA5Source
from dali_mesh.pipeline.native import batch_entries
from dali_mesh.pipeline.watchdog import DEFAULT_TIMEOUT_S
from dali_mesh.source import ForecastSpec
from dali_mesh.storage import DataFileError, MissingFileError, StoredLocation, read_exactly, store_of

log = logging.getLogger(__name__)

#: the fields' axes in a step as the layout sees them: (channel, lat, lon)
AXES = {"channel": 0, "lat": 1, "lon": 2}
#: PhysicsNeMo's year files, ``Path.glob``'s pattern (a remote prefix's names are matched by it too)
YEAR_FILES = "????.h5"


class _Times:
    """Batch external source: the time stamps (PhysicsNeMo's, seconds since the epoch, float64) and
    the in-year index of each sample of a batch, from the source's stateless order (the same entries
    ``read_windows`` takes, so they line up and resume from a checkpoint alike)."""

    def __init__(self, source: ERA5Source, *, start_year: int, dt: float, count: int, stamps: bool,
                 in_year: bool) -> None:
        self.source, self.start_year, self.dt, self.count = source, int(start_year), float(dt), int(count)
        self.stamps, self.in_year = bool(stamps), bool(in_year)  # which outputs, in this order

    def __call__(self, info):
        stamps, doy = [], []
        stride = self.source.forecast.stride
        for sample_id, _ in batch_entries(self.source, info):
            year, in_idx = self.source.locate(sample_id)
            # as physicsnemo.datapipes.climate.era5_hdf5.ERA5DaliExternalSource.__call__
            start = datetime.datetime(self.start_year + year, 1, 1, tzinfo=datetime.UTC) + \
                datetime.timedelta(hours=int(in_idx) * self.dt)
            stamps.append(np.array([(start + datetime.timedelta(hours=j * stride * self.dt)).timestamp()
                                    for j in range(self.count)]))
            doy.append(np.array([in_idx], np.int64))
        return tuple(out for out, used in ((stamps, self.stamps), (doy, self.in_year)) if used)


class ERA5HDF5Datapipe:
    """PhysicsNeMo's ``ERA5HDF5Datapipe`` (same arguments and outputs), reading each rank's band.

    PhysicsNeMo's arguments (``data_dir`` ... ``world_size``) mean what they mean there, except:
    ``num_workers`` is the number of DALI threads reading (natively; Python worker processes only
    when the files cannot be read natively); ``process_rank``/``world_size`` are taken from the
    layout's batch dims where it has any (given values must agree); ``interpolation_type`` is refused.
    The arguments below are dali_mesh's own, beside PhysicsNeMo's.

    Args:
        layout: a :class:`~dali_mesh.Layout` over a step's ``(channel, lat, lon)`` after the channel
            pick (``patch_size`` must then be its crop). Default: built from ``device_mesh`` (or
            PhysicsNeMo's ``DistributedManager`` mesh, or one process), ``shard``, ``halo``,
            ``boundary``, with ``patch_size`` as its crop.
        device_mesh: the torch ``DeviceMesh`` (needed for ``output="shard_tensor"``).
        shard: mesh dim name -> ``"lat"``, ``"lon"`` (or a step axis number). Default on a 1-D mesh:
            its dim splits ``lat``; on others give it (the mesh dim that shards nothing is the
            data-parallel dim).
        halo, boundary, fill_value: as :class:`~dali_mesh.Layout` (axis numbers or ``"lat"``/``"lon"``
            keys). Normalisation applies to halo cells too (a constant fill is normalised).
        output: ``"local"`` (torch tensors of the window) or ``"shard_tensor"`` (PhysicsNeMo
            ShardTensors of the owned band; ``cos_zenith`` and ``time_of_year_idx`` stay local).
        order: ``"physicsnemo"`` (PhysicsNeMo's order: a contiguous block per data-parallel rank,
            shuffled by numpy at every epoch) or ``"dali_mesh"`` (dali_mesh's keyed permutation with
            ``seed``: every data-parallel rank draws from all years).
        timeout: seconds a batch may take (:class:`~dali_mesh.torch.MeshLoader`'s watchdog).
        storage_options: for ``s3://`` and ``gs://`` ``data_dir``/``stats_dir`` prefixes (``stats_dir``
            also ``https://``), named as fsspec's s3fs names them (see :class:`~dali_mesh.NumpySource`);
            used for the listing and the statistics and given to the source. Default: the environment's.

    Iterate it as PhysicsNeMo's: ``for data in pipe: data[0]["invar"]``; each ``iter()`` is one
    epoch; ``len(pipe)`` batches per epoch. ``state_dict()`` / ``load_state_dict()`` checkpoint it.
    """

    def __init__(
        self,
        data_dir: str,
        stats_dir: str | None = None,
        channels: Sequence[int] | None = None,
        batch_size: int = 1,
        num_steps: int = 1,
        num_history: int = 0,
        stride: int = 1,
        latlon_resolution: tuple[int, int] | None = None,
        interpolation_type: str | None = None,
        patch_size: tuple[int, int] | int | None = None,
        num_samples_per_year: int | None = None,
        use_cos_zenith: bool = False,
        cos_zenith_args: Mapping | None = None,
        use_time_of_year_index: bool = False,
        shuffle: bool = True,
        num_workers: int = 1,
        device="cuda",
        process_rank: int = 0,
        world_size: int = 1,
        *,
        layout: Layout | None = None,
        device_mesh=None,
        shard: Mapping[str, int | str] | None = None,
        halo=0,
        boundary="constant",
        fill_value: float = 0,
        output: str = "local",
        order: str = "physicsnemo",
        seed: int = 0,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        storage_options: dict | None = None,
    ) -> None:
        import torch  # noqa: PLC0415

        if interpolation_type is not None:
            raise ValueError(f"interpolation_type={interpolation_type!r}: dali_mesh does not resize (the resize of "
                             "a rank's band is not the band of the resized field); store the fields at the model's "
                             "resolution, or use PhysicsNeMo's own ERA5HDF5Datapipe")
        if output not in ("local", "shard_tensor"):
            raise ValueError(f"output must be 'local' or 'shard_tensor', got {output!r}")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
        self.storage_options = None if storage_options is None else dict(storage_options)
        # a folder is a Path (PhysicsNeMo's checks, unchanged); a remote prefix its location, no "/" at the end
        self.data_dir = _directory(data_dir, self.storage_options)
        self.stats_dir = _directory(stats_dir, self.storage_options) if stats_dir is not None else None
        if isinstance(self.data_dir, Path) and not self.data_dir.is_dir():
            raise IOError(f"Error, data directory {self.data_dir} does not exist")
        if isinstance(self.stats_dir, Path) and not self.stats_dir.is_dir():
            raise IOError(f"Error, stats directory {self.stats_dir} does not exist")
        self.batch_size, self.num_steps, self.num_history, self.stride = batch_size, num_steps, num_history, stride
        self.num_workers, self.shuffle, self.output = int(num_workers), bool(shuffle), output
        self.use_cos_zenith, self.use_time_of_year_index = bool(use_cos_zenith), bool(use_time_of_year_index)
        self.latlon_resolution = latlon_resolution
        # PhysicsNeMo fills these defaults into the caller's dict; this copy leaves it alone
        args = dict(cos_zenith_args or {})
        if self.use_cos_zenith:
            args.setdefault("dt", 6.0)
            args.setdefault("start_year", 1980)
            args.setdefault("latlon_bounds", ((90, -90), (0, 360)))
        self.cos_zenith_args = args
        if isinstance(patch_size, int):
            patch_size = (patch_size, patch_size)
        self.patch_size = patch_size
        self.device = torch.device(device) if isinstance(device, str) else device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda:0")
        self.output_keys = ["invar", "outvar"] + (["cos_zenith"] if self.use_cos_zenith else []) + \
            (["time_of_year_idx"] if self.use_time_of_year_index else [])
        if self.use_cos_zenith and not latlon_resolution:
            raise ValueError("latlon_resolution must be set for cos zenith angle")

        if isinstance(self.data_dir, Path):
            self.data_paths = sorted(self.data_dir.glob(YEAR_FILES))
            if not self.data_paths:
                raise IOError(f"no year files ({YEAR_FILES}) in {self.data_dir}")
            first = _h5(self.data_paths[0])
        else:
            self.data_paths = _remote_year_files(self.data_dir, self.storage_options)  # StoredLocations
            first = open_hdf5_file(self.data_paths[0])
        with first as f:
            if "fields" not in f:
                raise IOError(f"{self.data_paths[0]} has no dataset 'fields' (it holds {sorted(f)})")
            shape = f["fields"].shape
        if len(shape) != 4:
            raise ValueError(f"{self.data_paths[0]}: dataset 'fields' has shape {shape}, not (step, channel, lat, lon)")
        given = list(range(shape[1])) if channels is None else [int(c) for c in channels]
        if not given or max(given) >= shape[1] or min(given) < -shape[1]:
            raise ValueError(f"Provided channel has indexes greater than the number of fields {shape[1]}: "
                             f"{given}")
        # negative indexes count from the last field, as numpy (and so PhysicsNeMo's datapipe) takes them
        self.channels = [c % shape[1] for c in given]
        img = tuple(shape[2:])
        if self.patch_size is not None:
            if self.use_cos_zenith:
                raise ValueError("Patching is not supported with cos zenith angle")
            img = tuple(s - s % p for s, p in zip(img, self.patch_size))
        self.img_shape = img
        self.mu = self.sd = None
        self._load_statistics()

        self.layout = layout if layout is not None else self._layout(device_mesh, shard, halo, boundary, fill_value)
        self.device_mesh = device_mesh
        if self.layout.num_batch_groups > 1 and (process_rank, world_size) == (0, 1):
            # left out: the data-parallel rank is the layout's (ERA5Source refuses other given values)
            process_rank, world_size = self.layout.batch_index, self.layout.num_batch_groups
        self.process_rank, self.world_size = int(process_rank), int(world_size)
        self.source = ERA5Source(
            [p if isinstance(p, str) else str(p) for p in self.data_paths], self.layout, batch_size=batch_size, shuffle=self.shuffle, seed=seed,
            forecast=ForecastSpec(history=num_history, lead=num_steps, stride=stride), channels=self.channels,
            samples_per_year=num_samples_per_year, process_rank=self.process_rank, world_size=self.world_size,
            order=order, storage_options=self.storage_options)
        self.num_samples_per_year = self.source.samples_per_year
        self.n_years = len(self.data_paths)
        self.total_length = self.n_years * self.num_samples_per_year
        region = self.source.region
        if region.domain_shape[1:] != self.img_shape:
            raise LayoutError(f"the layout's domain {region.domain_shape[1:]} of (lat, lon) is not the fields' "
                              f"{self.img_shape} (patch_size {self.patch_size}): give the crop in the layout")
        self.region = region
        self._latlon = self._latlon_window() if self.use_cos_zenith else None
        self.length = len(self.source) // self.batch_size

        from dali_mesh.torch import MeshLoader  # noqa: PLC0415

        names = tuple(self.output_keys) + ("sample_id", "is_pad")
        self.loader = MeshLoader(self._make_pipeline, self.layout, output_map=names,
                                 window_outputs=("invar", "outvar"), output=output, device_mesh=device_mesh,
                                 sample_shape=self.source.sample_shape, timeout=timeout)
        self._epochs = 0
        self._in_epoch = False  # an epoch was started and not run to its end

    # ---- set-up ------------------------------------------------------------------------------------
    def _load_statistics(self) -> None:
        """``global_means.npy`` / ``global_stds.npy`` of shape ``(1, C, 1, 1)``, as PhysicsNeMo loads them."""
        if self.stats_dir is None:
            return
        if isinstance(self.stats_dir, Path):
            mean_file, std_file = self.stats_dir / "global_means.npy", self.stats_dir / "global_stds.npy"
            for f in (mean_file, std_file):
                if not f.exists():
                    raise IOError(f"{'Mean' if f == mean_file else 'Std'} statistics file {f} not found")
            mu, sd = np.load(str(mean_file)), np.load(str(std_file))
        else:
            mu, sd = (_remote_npy(f"{self.stats_dir}/{name}", what, self.storage_options)
                      for name, what in (("global_means.npy", "Mean"), ("global_stds.npy", "Std")))
        self.mu = mu[:, self.channels]
        self.sd = sd[:, self.channels]
        if not self.mu.shape == self.sd.shape == (1, len(self.channels), 1, 1):
            raise AssertionError(f"Error, normalisation arrays have wrong shape: {self.mu.shape}, {self.sd.shape}; "
                                 f"expected (1, {len(self.channels)}, 1, 1)")

    def _layout(self, device_mesh, shard, halo, boundary, fill_value) -> Layout:
        if device_mesh is not None:
            mesh = MeshInfo.from_device_mesh(device_mesh)
        else:
            mesh = _physicsnemo_mesh()
        if shard is None:
            if len(mesh.shape) != 1:
                raise LayoutError(f"shard= is needed on a {len(mesh.shape)}-D mesh {mesh.names}: say which mesh dim "
                                  "splits 'lat' (or 'lon'), e.g. shard={'spatial': 'lat'}")
            shard = {mesh.names[0]: "lat"} if mesh.shape[0] > 1 else {}
        crop = None if self.patch_size is None else [None, (0, self.img_shape[0]), (0, self.img_shape[1])]
        return Layout(mesh, shard={d: _axis(a) for d, a in shard.items()}, crop=crop, halo=_per_axis(halo),
                      boundary=_per_axis(boundary), fill_value=fill_value, split="physicsnemo")

    def _latlon_window(self) -> np.ndarray:
        """This rank's window of PhysicsNeMo's lat/lon grid ``(2, h, w)`` (the fields' window rules)."""
        res = tuple(self.latlon_resolution)
        if self.layout.shard_axes(3) and res != self.img_shape:
            raise ValueError(f"latlon_resolution {res} is not the fields' {self.img_shape}: with the fields split, "
                             "the cos zenith grid is split with them and must be theirs")
        lat, lon = _latlon_grid(self.cos_zenith_args["latlon_bounds"], res)
        grid = np.stack([lat, lon], axis=0)
        if not self.layout.shard_axes(3) and res != self.img_shape:
            return grid  # one rank, PhysicsNeMo's own grid whatever its shape
        region = self.layout.region((2,) + res)
        if region.window_shape[0] != 2:
            raise LayoutError("cos zenith: the layout splits or pads the channel axis; only lat/lon may be split")
        return np.ascontiguousarray(take_window(grid, region))

    def _make_pipeline(self, checkpoint=None):
        from nvidia.dali import Pipeline, fn, types  # noqa: PLC0415

        from dali_mesh.pipeline.native import read_windows  # noqa: PLC0415

        cuda = self.device.type == "cuda"
        pipe = Pipeline(batch_size=self.batch_size, num_threads=max(1, self.num_workers), prefetch_queue_depth=2,
                        py_num_workers=max(1, self.num_workers), device_id=self.device.index if cuda else None,
                        py_start_method="spawn", enable_checkpointing=True, checkpoint=checkpoint)
        with pipe:
            invar, outvar, ids, pads = read_windows(self.source, "gpu" if cuda else "cpu", layout="FCHW")
            if self.num_history == 0:
                invar = fn.squeeze(invar, axis_names="F")  # (C, H, W), PhysicsNeMo's layout
            if self.mu is not None:  # as PhysicsNeMo normalises: fn.normalize, the same arguments
                invar = fn.normalize(invar, mean=self.mu[0] if self.num_history == 0 else self.mu,
                                     stddev=self.sd[0] if self.num_history == 0 else self.sd)
                outvar = fn.normalize(outvar, mean=self.mu, stddev=self.sd)
            outputs = [invar, outvar]
            if self.use_cos_zenith or self.use_time_of_year_index:
                both = self.use_cos_zenith and self.use_time_of_year_index
                times = _Times(self.source, start_year=self.cos_zenith_args.get("start_year", 1980),
                               dt=self.cos_zenith_args.get("dt", 6.0), count=self.num_history + self.num_steps + 1,
                               stamps=self.use_cos_zenith, in_year=self.use_time_of_year_index)
                dtypes = [types.FLOAT64] * self.use_cos_zenith + [types.INT64] * self.use_time_of_year_index
                got = fn.external_source(source=times, num_outputs=len(dtypes), batch=True, batch_info=True,
                                         dtype=dtypes, ndim=[1] * len(dtypes))
                stamps, doy = got if both else (got[0], None) if self.use_cos_zenith else (None, got[0])
                if self.use_cos_zenith:
                    from physicsnemo.datapipes.climate.utils.zenith_angle import cos_zenith_angle  # noqa: PLC0415

                    cz = fn.cast(cos_zenith_angle(stamps, latlon=types.Constant(self._latlon)), dtype=types.FLOAT)
                    outputs.append(cz.gpu() if cuda else cz)
                if self.use_time_of_year_index:
                    outputs.append(doy)
            pipe.set_outputs(*outputs, ids, pads)
        return pipe

    # ---- iteration ---------------------------------------------------------------------------------
    def __iter__(self):
        """One epoch, whole: an epoch left part-way (a ``break``) is run to its end first, unread, so
        that the next ``for`` starts the next epoch at its first batch (DALI's iterator cannot be
        reset mid-epoch)."""
        if self._in_epoch:
            for _ in self.loader:
                pass
        if self._epochs:
            self.loader.reset()
        self._epochs += 1
        self._in_epoch = True
        keys = self.output_keys
        for batch in self.loader:
            yield [{k: batch[k] for k in keys}]
        self._in_epoch = False

    def __len__(self) -> int:
        return self.length

    def state_dict(self) -> dict:
        """The loader's checkpoint (:meth:`dali_mesh.torch.MeshLoader.state_dict`)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.loader.close()


# ---- helpers -----------------------------------------------------------------------------------------
def _axis(a) -> int:
    if isinstance(a, str):
        if a not in AXES:
            raise LayoutError(f"axis {a!r} is not one of {sorted(AXES)} (or a step axis number)")
        return AXES[a]
    return a


def _per_axis(value):
    """``halo``/``boundary`` with ``"lat"``/``"lon"`` keys as axis numbers."""
    if isinstance(value, Mapping):
        return {_axis(k): v for k, v in value.items()}
    return value


def _physicsnemo_mesh() -> MeshInfo:
    """PhysicsNeMo's ``DistributedManager`` mesh where one was made, else one process."""
    try:
        from physicsnemo.distributed import DistributedManager  # noqa: PLC0415
    except ImportError:
        return MeshInfo((1,), ("world",), (0,))
    if DistributedManager.is_initialized() and getattr(DistributedManager(), "_global_mesh", None) is not None:
        return MeshInfo.from_physicsnemo()
    return MeshInfo((1,), ("world",), (0,))


def _latlon_grid(bounds, shape) -> tuple[np.ndarray, np.ndarray]:
    """PhysicsNeMo's ``latlon_grid`` (``physicsnemo.datapipes.climate.utils.invariant``)."""
    from physicsnemo.datapipes.climate.utils.invariant import latlon_grid  # noqa: PLC0415

    return latlon_grid(bounds=bounds, shape=shape)


def _directory(location, storage_options: dict | None) -> Path | str:
    """A local folder as a ``Path`` (``file://`` taken off), a remote prefix as its location string."""
    store, key = store_of(location, storage_options)
    path = store.local_path(key)
    if path is not None:
        return Path(path)
    return os.fspath(location).rstrip("/")


def _remote_year_files(location: str, storage_options: dict | None) -> list[str]:
    """The year files directly under the prefix ``location``, named and sorted by the local glob's
    rule (objects deeper down, as files in subfolders, are not year files)."""
    store, key = store_of(location, storage_options)
    prefix = key.rstrip("/") + "/"
    if not store.supports_listing:
        raise IOError(f"Error, data directory {location}: its store ({store.spec}) cannot list a folder; give an "
                      "s3:// or gs:// prefix, or a local folder")
    try:
        objects, _ = store.list(prefix)
    except DataFileError as e:
        raise IOError(f"Error, data directory {location} cannot be listed for its year files ({e})") from e
    names = sorted(k[len(prefix):] for k, _ in objects if k.startswith(prefix) and k != prefix)
    years = [n for n in names if fnmatch.fnmatchcase(n, YEAR_FILES)]
    if not years:
        held = f"it holds {len(names)} objects, none named {YEAR_FILES}" if names else "nothing is stored under it"
        raise IOError(f"no year files ({YEAR_FILES}) in {location} ({held})")
    # each year file resolved already, with this prefix's store (its options): read with them below
    return [StoredLocation(store, prefix + n) for n in years]


def _remote_npy(location: str, what: str, storage_options: dict | None) -> np.ndarray:
    """A ``.npy`` object read whole (one version) and loaded as ``np.load`` loads a file."""
    store, key = store_of(location, storage_options)
    try:
        obj = store.open(key, "statistics file")
    except MissingFileError:
        raise IOError(f"{what} statistics file {location} not found") from None
    with obj:
        data = read_exactly(obj, obj.size, 0)
    return np.load(io.BytesIO(data))


def _h5(path: os.PathLike):
    import h5py  # noqa: PLC0415

    return h5py.File(path, "r")
