"""Build and install dali_mesh.

Install with ``pip install --no-build-isolation .`` (or ``-e .``) so that the plugin is built against
the DALI already installed in this environment (see README): an isolated build environment would
fetch a second DALI.

The C++/CUDA plugin is built by CMake (CMakeLists.txt) with the flags of ``nvidia.dali.sysconfig`` of
the Python running this build (``sys.executable``), in ``build/cmake`` (incremental: re-running
rebuilds only what changed). It installs, inside the package ``dali_mesh/``:

* ``libdali_mesh.so``          the DALI plugin (``fn.dali_mesh.strided_slice``, ``mesh_roi``,
                               ``read_windows``), linked to the kernels library beside it
* ``libdali_mesh_kernels.so``  the core (kernels, reader, codecs, byte stores) without DALI, with C
                               entry points (ctypes): one copy per process, the plugin's and ctypes'
* ``_build_info.py``           the DALI version built against (checked when the plugin loads)

Environment:
  DALI_MESH_CUDA=auto|0|1     GPU operator: when nvcc is found (default) / never / required
  DALI_MESH_CUDA_ARCHS=...    CUDA architectures (default: SASS for sm_80 (runs on all 8.x GPUs) and
                              sm_90 + PTX of compute_75 (JIT on T4s and GPUs after 9.0), from one PTX
                              compile; "native": the GPUs of this machine; or a CMake list such as
                              "75-real;80-real;86-real;89-real;90"; see CMakeLists.txt)
  DALI_MESH_NVCC_THREADS=N    architectures nvcc compiles at once (default 0: one per CPU)
  DALI_MESH_WHEEL=1           building a wheel (`make wheel`): the C libraries the plugin links from
                              other wheels or the system (c-blosc2, libcrc32c, the codec libraries)
                              are copied into dali_mesh/_libs and found there (RUNPATH $ORIGIN/_libs;
                              the plugin finds the kernels library beside it, $ORIGIN)

Without DALI, ``make kernels`` builds ``libdali_mesh_kernels.so`` alone (see the Makefile).
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default 2)
  CUDACXX=/path/to/nvcc       the CUDA compiler, when not on PATH
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CMAKE_BUILD_DIR = ROOT / "build" / "cmake"
LIBS = {"dali_mesh.libdali_mesh": "libdali_mesh.so",
        "dali_mesh.libdali_mesh_kernels": "libdali_mesh_kernels.so"}


def _dali_info() -> dict:
    """Flags and versions of the DALI importable by *this* interpreter."""
    try:
        import nvidia.dali as dali  # noqa: PLC0415
        import nvidia.dali.sysconfig as sysconfig  # noqa: PLC0415
    except ImportError as e:
        raise SystemExit(
            f"dali_mesh: cannot build the DALI plugin: DALI is not importable by {sys.executable} "
            f"({e}). Install it first (pip install nvidia-dali-cuda120==2.4.0), then run "
            "`pip install --no-build-isolation -e .` (without --no-build-isolation pip builds in a "
            "fresh environment without DALI). To build only the DALI-free kernels library "
            "(libdali_mesh_kernels.so, e.g. on a GPU machine without DALI), run `make kernels` "
            "(add DALI_MESH_CUDA_ARCHS=native for the local GPU)."
        ) from None
    cuda_major = ""
    try:
        import nvidia.dali.backend as backend  # noqa: PLC0415

        cuda_major = str(int(backend.__cuda_version__) // 1000)
    except (ImportError, AttributeError, ValueError):
        pass
    return {
        "version": dali.__version__,
        "compile_flags": sysconfig.get_compile_flags(),
        "link_flags": sysconfig.get_link_flags(),
        "cuda_major": cuda_major,
    }


def _blosc2_dir() -> str | None:
    """The blosc2 wheel's package folder (c-blosc2's headers and library) in this interpreter's
    environment, found without importing it (the wheel is installed for its C library only)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("blosc2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return str(folder) if (folder / "include" / "blosc2.h").exists() else None


def _crc32c_dir() -> str | None:
    """The folder holding the google-crc32c wheel's libcrc32c (``google_crc32c.libs``, beside its
    package; zarr's own dependency for Zarr v3's crc32c codec), found without importing it."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("google_crc32c")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]).parent / "google_crc32c.libs"
    return str(folder) if any(folder.glob("libcrc32c*.so*")) else None


def _tool(name: str) -> str | None:
    """A tool next to this interpreter (the venv's cmake/ninja) first, then on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


class CMakeBuild(build_ext):
    """Runs CMake once for both libraries and puts them inside the package."""

    def get_ext_filename(self, fullname: str) -> str:
        # called with the full dotted name and (by get_ext_fullpath) with its last part
        for name, lib in LIBS.items():
            if fullname == name:
                return os.path.join(*name.split(".")[:-1], lib)
            if fullname == name.rsplit(".", 1)[1]:
                return lib
        return super().get_ext_filename(fullname)

    def run(self) -> None:
        self._built = False
        super().run()

    def build_extension(self, ext: Extension) -> None:
        if not self._built:
            self._cmake()
            self._built = True
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace(CMAKE_BUILD_DIR / LIBS[ext.name], target)
        if self._wheel and not (self.inplace or getattr(self, "editable_mode", False)):
            _bundle_libraries(CMAKE_BUILD_DIR / LIBS[ext.name], target.parent / "_libs", self._lib_dirs)
        # _build_info.py next to the library; in editable mode also in the source tree (setuptools
        # copies only the libraries there)
        _replace_text(target.parent / "_build_info.py", self._build_info)
        if self.inplace or getattr(self, "editable_mode", False):
            _replace_text(ROOT / "dali_mesh" / "_build_info.py", self._build_info)

    def _cmake(self) -> None:
        cmake = _tool("cmake")
        if not cmake:
            raise SystemExit("dali_mesh: cmake not found: pip install cmake (or install it system-wide)")
        dali = _dali_info()
        cuda_mode = os.environ.get("DALI_MESH_CUDA", "auto").strip().lower() or "auto"
        if cuda_mode not in ("auto", "0", "1", "on", "off", "true", "false"):
            raise SystemExit(f"dali_mesh: DALI_MESH_CUDA={cuda_mode!r}: expected auto, 0 or 1")
        cuda_mode = {"1": "ON", "on": "ON", "true": "ON", "0": "OFF", "off": "OFF",
                     "false": "OFF"}.get(cuda_mode, "AUTO")
        args = [
            cmake, "-S", str(ROOT), "-B", str(CMAKE_BUILD_DIR),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DDALI_COMPILE_FLAGS={';'.join(dali['compile_flags'])}",
            f"-DDALI_LINK_FLAGS={';'.join(dali['link_flags'])}",
            f"-DDALI_VERSION={dali['version']}",
            f"-DDALI_CUDA_MAJOR={dali['cuda_major']}",
            f"-DDALI_MESH_CUDA={cuda_mode}",
        ]
        blosc2 = _blosc2_dir()
        self._lib_dirs = []
        if blosc2:
            args.append(f"-DDALI_MESH_BLOSC2_DIR={blosc2}")
            self._lib_dirs.append(os.path.join(blosc2, "lib"))
        crc32c = _crc32c_dir()
        if crc32c:
            args.append(f"-DDALI_MESH_CRC32C_DIR={crc32c}")
            self._lib_dirs.append(crc32c)
        self._wheel = os.environ.get("DALI_MESH_WHEEL", "0").strip().lower() in ("1", "on", "true", "yes")
        args.append(f"-DDALI_MESH_WHEEL={'ON' if self._wheel else 'OFF'}")
        if os.environ.get("DALI_MESH_NVCC_THREADS"):
            args.append(f"-DDALI_MESH_NVCC_THREADS={os.environ['DALI_MESH_NVCC_THREADS']}")
        archs = os.environ.get("DALI_MESH_CUDA_ARCHS", "").strip()
        if archs and archs != "default":
            args += [f"-DDALI_MESH_CUDA_ARCHS={archs}", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
        else:  # back to the default after a run with an override
            args += ["-UCMAKE_CUDA_ARCHITECTURES", "-UDALI_MESH_CUDA_ARCHS"]
        ninja = _tool("ninja")
        if not (CMAKE_BUILD_DIR / "CMakeCache.txt").exists() and ninja:
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        t0 = time.monotonic()
        subprocess.run(args, check=True)
        subprocess.run([cmake, "--build", str(CMAKE_BUILD_DIR), "-j", jobs], check=True)
        info = dict(line.split("=", 1) for line in
                    (CMAKE_BUILD_DIR / "dali_mesh_build.txt").read_text().splitlines() if "=" in line)
        with_cuda = info.get("cuda", "OFF").upper() in ("ON", "TRUE", "1")
        self._build_info = (
            '"""Written by setup.py at build time; checked by dali_mesh.fn when the plugin loads."""\n'
            f"DALI_VERSION = {dali['version']!r}\n"
            f"DALI_CUDA_MAJOR = {dali['cuda_major']!r}\n"
            f"WITH_CUDA = {with_cuda!r}\n"
            f"CUDA_VERSION = {info.get('cuda_version', '')!r}\n"
            f"CUDA_ARCHS = {info.get('cuda_archs', '')!r}\n"
            f"PYTHON = {sys.executable!r}\n"
        )
        print(f"dali_mesh: plugin built in {time.monotonic() - t0:.1f} s "
              f"({'CPU + GPU' if with_cuda else 'CPU only'}, DALI {dali['version']})")


# libraries every Linux has, and DALI's own (loaded by DALI before the plugin): never bundled
_SYSTEM_LIBS = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so",
                "libgcc_s.so", "libstdc++.so", "libdali", "libcuda.so")
# the remote stores' libraries, kept the system's (see _bundle_libraries)
_REMOTE_LIBS = ("libcurl", "libexpat")


def _bundle_libraries(lib: Path, dest: Path, lib_dirs: list[str]) -> None:
    """Copies the shared libraries ``lib`` needs (as ``ldd`` resolves them, with the wheels' library
    folders searched too), except the system's, DALI's own and this package's (the kernels library, which
    the plugin finds beside itself), into ``dest`` under the names it asks for: a wheel then runs on a
    machine without the codec -dev packages or the blosc2 wheel."""
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(lib_dirs + [os.environ.get("LD_LIBRARY_PATH", "")]))

    def needs(path) -> list[tuple[str, str]]:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env, check=True).stdout
        pairs = [line.strip().partition(" => ") for line in out.splitlines()]
        return [(name, rest.split(" (")[0].strip()) for name, _, rest in pairs if rest]

    dest.mkdir(parents=True, exist_ok=True)
    # libcurl stays the system's (Debian's libcurl4), with the TLS and other libraries it links: a
    # wheel does not carry a TLS stack; so does expat, the remote stores' XML reader (Debian's libexpat1,
    # which its python3 depends on), so that both get the system's security fixes
    linked = needs(lib)
    system = {name for name, _ in linked if name.startswith(_REMOTE_LIBS)}
    for name, path in linked:
        if name.startswith(_REMOTE_LIBS) and path != "not found":
            system |= {n for n, _ in needs(path)}
    for name, path in linked:
        if name.startswith(_SYSTEM_LIBS) or name in system or name in LIBS.values():
            continue
        if path == "not found":
            raise SystemExit(f"dali_mesh: {lib.name} needs {name}, which ldd cannot find: cannot bundle it")
        _replace(Path(os.path.realpath(path)), dest / name)


def _replace(src: Path, dst: Path) -> None:
    """Atomic copy: a process that has the old library loaded keeps a valid mapping."""
    if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.read_bytes() == src.read_bytes():
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _replace_text(dst: Path, text: str) -> None:
    if dst.exists() and dst.read_text() == text:
        return
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, dst)


setup(
    name="dali_mesh",
    version="0.1.0",
    description="Partition-aware data loading for model-parallel training with NVIDIA DALI",
    packages=find_packages(include=["dali_mesh", "dali_mesh.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.24"],
    extras_require={
        "dali": ["nvidia-dali-cuda120==2.4.0"],
        "torch": ["torch>=2.5"],
        "io": ["h5py>=3.10", "zarr>=2.16"],
        "gpu": ["cupy-cuda12x"],
        # reference:// locations (Kerchunk reference sets): fsspec reads them, kerchunk writes them;
        # jinja2 renders a set's generated ("gen") keys. icechunk:// repositories: the icechunk library
        # (2.x needs Python >= 3.12 and reads 1.x repositories; the calls used here are in both)
        "virtual": ["kerchunk>=0.2.10", "fsspec>=2025.2.0", "jinja2>=3", "icechunk>=1.1.21,<3",
                    "fastparquet>=2024.11", "pandas>=2"],  # fastparquet, pandas: Parquet reference sets
        "test": ["pytest", "pytest-timeout", "hypothesis"],
    },
    ext_modules=[Extension(name, sources=[]) for name in LIBS],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["dali-mesh=dali_mesh.cli:main"]},
    zip_safe=False,
)
