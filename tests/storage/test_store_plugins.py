"""Byte stores named by an entry point of the ``dali_mesh.stores`` group, by URL scheme (issue 53,
"Stores as peers"), under the formats' rules (dali_mesh/plugin_registry.py): a store of another package
is found without editing dali_mesh; a scheme is never taken twice (a plugin naming ``s3`` is not used; two
packages declaring one scheme: neither); a broken plugin is skipped and its own scheme says why. The
store a plugin resolves is read through the shared seam and equals numpy."""
from __future__ import annotations

import types
from importlib import metadata

import numpy as np
import pytest

from dali_mesh import plugin_registry
from dali_mesh.storage import (ENTRY_POINT_GROUP, SCHEMES, StorePluginError, UnsupportedLocationError,
                               register_scheme, store_of)
from dali_mesh.storage.local import LocalStore


class _Objects(LocalStore):
    """This machine's files under ``objs://``, read as objects (no path handed out)."""

    def local_path(self, key):
        return None

    def __reduce__(self):
        return (_Objects, ())


def resolve_objs(location: str, options: dict):
    return _Objects(), location.split("://", 1)[1]


def resolve_s3_elsewhere(location: str, options: dict):  # a plugin that would read every s3:// location
    raise AssertionError("never called: s3 is the built-in store's")


NOT_CALLABLE = 42


def _ep(name, value, package=None):
    ep = metadata.EntryPoint(name, value, ENTRY_POINT_GROUP)
    return ep._for(types.SimpleNamespace(name=package)) if package else ep


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setattr(SCHEMES, "_entries", dict(SCHEMES._entries))
    monkeypatch.setattr(SCHEMES, "_plugins_loaded", False)
    monkeypatch.setattr(SCHEMES, "_refused", {})

    def declare(*eps):
        monkeypatch.setattr(plugin_registry.metadata, "entry_points",
                            lambda group: [ep for ep in eps if group == ENTRY_POINT_GROUP])

    return declare


def test_a_store_named_by_an_entry_point_reads_through_the_seam(plugins, tmp_path):
    from dali_mesh import Layout, MeshInfo, NumpySource
    from dali_mesh.partition import take_window

    plugins(_ep("objs", f"{__name__}:resolve_objs", "objs-pkg"))
    data = np.random.default_rng(3).standard_normal((3, 7, 5)).astype(np.float32)
    for t in range(3):
        np.save(tmp_path / f"{t}.npy", data[t])
    store, key = store_of(f"objs://{tmp_path}/0.npy")
    assert isinstance(store, _Objects) and key == f"{tmp_path}/0.npy"
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 1}, boundary="periodic")
    src = NumpySource([f"objs://{tmp_path}/{t}.npy" for t in range(3)], layout, batch_size=1, shuffle=False)
    for t in range(3):
        np.testing.assert_array_equal(src.read_sample(t)[0], take_window(data[t], src.region))
    assert list(SCHEMES)[-1] == "objs"


def test_a_plugin_may_not_take_a_built_in_scheme(plugins):
    plugins(_ep("s3", f"{__name__}:resolve_s3_elsewhere", "evil-pkg"))
    with pytest.warns(RuntimeWarning, match=r"entry point 's3' .* of package 'evil-pkg' \(resolve_s3_elsewhere\) is "
                                            r"not used: store 's3' is dali_mesh's built-in"):
        store, _ = store_of("s3://bucket/key.npy", {"anon": True})
    assert type(store).__name__ == "RemoteStore"
    with pytest.raises(StorePluginError, match=r"store 's3' is already dali_mesh's built-in .* may not take its name"):
        register_scheme("s3", resolve_s3_elsewhere)
    with pytest.raises(StorePluginError, match="may not take its name"):
        register_scheme("S3", resolve_s3_elsewhere)  # schemes are case-blind


def test_one_scheme_declared_by_two_packages_is_used_by_neither(plugins):
    plugins(_ep("objs", f"{__name__}:resolve_objs", "pkg-a"), _ep("objs", f"{__name__}:resolve_s3_elsewhere", "pkg-b"))
    with pytest.warns(RuntimeWarning, match="is declared by package 'pkg-a' .* and package 'pkg-b'"):
        with pytest.raises(StorePluginError, match="neither is used"):
            store_of("objs:///tmp/x.npy")
    assert isinstance(store_of("memory://m/x")[0], object)  # the others work


@pytest.mark.parametrize("name,value,match", [
    ("objs", "tests.storage.no_such_module:resolve", r"cannot be loaded \(ModuleNotFoundError"),
    ("objs", f"{__name__}:NOT_CALLABLE", "names 42, which is not a resolver"),
    ("Objs", f"{__name__}:resolve_objs", "its name must be a URL scheme in lower case"),
])
def test_a_broken_store_plugin_is_skipped_and_its_scheme_says_why(plugins, name, value, match):
    plugins(_ep(name, value, "broken-pkg"))
    with pytest.warns(RuntimeWarning, match=match):
        store_of("memory://m/x")  # another scheme: found, with a warning naming the broken one
    with pytest.raises(StorePluginError, match=match):
        SCHEMES[name]
    if name == "objs":
        with pytest.raises(StorePluginError, match=match):
            store_of("objs:///tmp/x.npy")
    with pytest.raises(UnsupportedLocationError, match="no store of this build reads nope:// locations"):
        store_of("nope://x")


def test_a_scheme_is_a_scheme():
    with pytest.raises(ValueError, match="is not a URL scheme"):
        register_scheme("no scheme", resolve_objs)
