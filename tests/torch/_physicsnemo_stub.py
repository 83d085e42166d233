"""PhysicsNeMo's climate datapipe modules without its package ``__init__``s (tests and benchmarks only).

Workaround: ``physicsnemo.datapipes/__init__`` (PhysicsNeMo 2.2.2) imports
``physicsnemo.datapipes.readers.mesh`` -> ``physicsnemo.mesh`` -> ``physicsnemo.nn`` -> ``timm`` ->
``torchvision``, which cannot be installed beside the CPU torch of these machines. The ERA5 datapipe
(``physicsnemo.datapipes.climate.era5_hdf5``) and its ``utils`` (zenith angle, lat/lon grid) need none
of it, so the two package ``__init__``s (``physicsnemo.datapipes``, ``physicsnemo.datapipes.climate``)
are replaced by empty packages over the same folders and the modules are imported from their files
as they are. A user's full PhysicsNeMo install needs none of this.
"""
from __future__ import annotations

import importlib
import sys
import types

PACKAGES = ("physicsnemo.datapipes", "physicsnemo.datapipes.climate")


def install() -> None:
    """Empty packages in place of the two ``__init__``s (idempotent)."""
    import physicsnemo

    base = physicsnemo.__path__[0] + "/datapipes"
    for name, path in zip(PACKAGES, (base, base + "/climate")):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [path]
            sys.modules[name] = pkg


def uninstall() -> None:
    """Forget the empty packages and every module imported under them."""
    for name in [n for n in sys.modules if n == PACKAGES[0] or n.startswith(PACKAGES[0] + ".")]:
        del sys.modules[name]


def era5_datapipe_class():
    """PhysicsNeMo's own ``ERA5HDF5Datapipe``."""
    install()
    return importlib.import_module("physicsnemo.datapipes.climate.era5_hdf5").ERA5HDF5Datapipe
