"""One native core per process (issue 53): the DALI plugin links the kernels library instead of holding a
second copy of the core. The plugin's dynamic section names ``libdali_mesh_kernels.so`` and finds it beside
itself (RUNPATH ``$ORIGIN``, never the build folder's absolute path), it defines none of the core's symbols,
and in one process (DALI's plugin and ctypes, loaded in either order) the kernels library is mapped once;
a memory store written from Python and an Icechunk store's callbacks are read by ``fn.read_windows`` with
nothing given to the plugin (tests/storage/test_memory.py, test_icechunk_native.py), remote stores with
credentials in the parent and in DALI's workers (tests/storage/test_sources_apart.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("nvidia.dali")

from dali_mesh._kernels.library import library_path  # noqa: E402
from dali_mesh.pipeline.plugin import PLUGIN_PATH  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(not PLUGIN_PATH.exists(), reason="the plugin is not built")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


def test_the_plugin_links_the_kernels_library_beside_it_and_holds_no_core_of_its_own():
    dynamic = subprocess.run([_tool("readelf"), "-d", str(PLUGIN_PATH)], capture_output=True, text=True,
                             check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert "libdali_mesh_kernels.so" in needed, dynamic
    (runpath,) = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(RUNPATH)" in line]
    assert runpath.split(":")[0] == "$ORIGIN", runpath  # beside itself first
    assert not [p for p in runpath.split(":") if "build" in p], runpath  # never the build folder's copy
    soname = subprocess.run([_tool("readelf"), "-d", str(library_path())], capture_output=True, text=True,
                            check=True).stdout
    assert "Library soname: [libdali_mesh_kernels.so]" in soname, soname
    own = subprocess.run([_tool("nm"), "-DC", "--defined-only", str(PLUGIN_PATH)], capture_output=True, text=True,
                         check=True).stdout
    assert not [line for line in own.splitlines() if "dali_mesh::" in line], "the plugin defines core symbols"
    kernels = subprocess.run([_tool("nm"), "-DC", "--defined-only", str(library_path())], capture_output=True,
                             text=True, check=True).stdout
    assert "dali_mesh::StoreOf(" in kernels  # the core's interface, which the plugin uses
    # the version script (csrc/c_api/exports.map) exports the C API and the dali_mesh namespace only: not the
    # CUDA runtime linked in, nor libstdc++'s instantiations
    names = [line.split(" ", 2)[2] for line in kernels.splitlines() if line.count(" ") >= 2]
    assert names and not [n for n in names if not n.startswith(("dm_", "dali_mesh_")) and "dali_mesh::" not in n]


_LOAD = textwrap.dedent("""
    import ctypes, sys
    from dali_mesh import _kernels
    from dali_mesh.pipeline.plugin import PLUGIN_PATH, load_plugin
    if sys.argv[1] == "plugin first":
        load_plugin()
        lib = _kernels.load()
    else:
        lib = _kernels.load()
        load_plugin()
    plugin = ctypes.CDLL(str(PLUGIN_PATH))
    same = ctypes.cast(plugin.dali_mesh_store_put, ctypes.c_void_p).value == \\
        ctypes.cast(lib.dali_mesh_store_put, ctypes.c_void_p).value
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libdali_mesh" in line})
    print(same, *mapped)
""")


@pytest.mark.parametrize("order", ["plugin first", "kernels first"])
def test_one_process_maps_the_kernels_library_once(order):
    run = subprocess.run([sys.executable, "-c", _LOAD, order], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    same, *mapped = run.stdout.split()
    assert same == "True"  # the plugin's store entry points are the kernels library's own
    assert mapped == sorted({os.path.realpath(PLUGIN_PATH), os.path.realpath(library_path())}), mapped


_TWO_CORES = textwrap.dedent("""
    import sys
    from dali_mesh import _kernels
    from dali_mesh._kernels.library import KernelsError
    from dali_mesh.pipeline.plugin import load_plugin

    try:
        if sys.argv[1] == "plugin first":
            load_plugin()
            _kernels.load()
        else:
            _kernels.load()
            load_plugin()
    except (KernelsError, ImportError) as e:
        print(type(e).__name__, e)
    else:
        print("loaded both", *sorted({l.split()[-1] for l in open("/proc/self/maps") if "libdali_mesh_kernels" in l}))
""")


@pytest.mark.parametrize("order", ["plugin first", "kernels first"])
def test_a_second_copy_of_the_core_is_refused(tmp_path, order):
    """``$DALI_MESH_KERNELS_LIB`` naming a copy of the kernels library elsewhere (a separately built one, as
    ``make kernels`` writes) while DALI's plugin links the one beside it. Plugin first: ctypes would load a
    second core, each with its own stores, credentials and caches; it is refused, naming both copies and the
    fix. Kernels first: the plugin's dynamic loader takes the library already loaded by its name (its
    SONAME), so the process holds one core, the one named, and both load."""
    copy = tmp_path / "elsewhere" / "libdali_mesh_kernels.so"
    copy.parent.mkdir()
    shutil.copy(library_path(), copy)
    env = dict(os.environ, DALI_MESH_KERNELS_LIB=str(copy))
    run = subprocess.run([sys.executable, "-c", _TWO_CORES, order], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    said = run.stdout.strip()
    if order == "kernels first":
        assert said == f"loaded both {copy}", said
        return
    assert said.startswith("KernelsError"), said
    assert "two copies of the native core are loaded" in said and "unset DALI_MESH_KERNELS_LIB" in said
    assert str(copy) in said and os.path.realpath(library_path()) in said
