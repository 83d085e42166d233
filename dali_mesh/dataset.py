"""The weather dataset sources' former module, kept so that ``from dali_mesh.dataset import ...`` still
works: import :class:`~dali_mesh.ZarrDatasetSource`, :class:`~dali_mesh.NetCDFDatasetSource` and
:class:`~dali_mesh.NamedLayout` from ``dali_mesh`` (they live in :mod:`dali_mesh.weather`)."""
from dali_mesh.weather import Channel, NamedLayout, NetCDFDatasetSource, ZarrDatasetSource  # noqa: F401
