# `make demo` runs the main job, `make test` the tests. Both create or reuse .venv, install what is
# needed (building the DALI plugin) and are safe to re-run. `make test-fast`: the single-process tests
# only (no multi-rank runs, no sanitizer builds). `make wheel`: dist/dali_mesh-*.whl with the plugin
# inside, for `pip install` on machines with the same DALI. docs/install.md has the measured times.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned. torch==2.13.0 is the CPU build (on these machines pip takes it from local disk); never
# let a range pull a multi-GB CUDA build here.
DEPS := torch==2.13.0 numpy==2.4.6 nvidia-dali-cuda120==2.4.0 h5py==3.16.0 zarr==3.1.6 \
        matplotlib==3.11.2 setuptools==84.2.1 wheel==0.48.0 cmake==4.4.5 ninja==1.13.2 google-crc32c==1.9.0
TEST_DEPS := pytest==9.2.0 hilbertcurve==2.0.5 networkx==3.6.1 pytest-timeout==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2 hypothesis==6.170.17 xarray==2026.9.0 pandas==3.1.1 h5netcdf==1.8.2 \
             sphinx==8.2.3 myst-parser==4.0.1 moto[server]==5.2.5 boto3==1.43.117 botocore==1.43.117 \
             kerchunk==0.2.10 ujson==6.1.0 fastparquet==2026.9.0 cramjam==2.14.0 icechunk==1.1.21 virtualizarr==2.5.1 \
             obstore==0.12.1 obspec==0.1.0 obspec-utils==0.9.0 universal_pathlib==0.3.11 pathlib_abc==0.5.2 \
             tensorstore==0.1.86 ml_dtypes==0.7.0
# installed with --no-deps: blosc2 for its C library only (c-blosc2: headers, libblosc2.so), which
# the plugin links; PhysicsNeMo (for tests against the real package) and the light pure-Python
# modules its domain_parallel and distributed modules import, pinned one by one: its own
# requirements pull torchvision through timm, which does not import beside the CPU torch here;
# anemoi-datasets (the tests' oracle of its stores) pins zarr<=2.18.7 in its requirements but reads
# zarr 3 stores with zarr 3, which its code supports: it and the two modules it imports, no deps
NO_DEPS := blosc2==4.14.1 nvidia-physicsnemo==2.2.2 anemoi-datasets==0.5.47 anemoi-utils==0.5.14 aniso8601==10.0.1 warp-lang==1.19.0 requests==2.34.2 urllib3==2.8.0 \
           idna==3.20 certifi==2026.10.19.post1 charset-normalizer==3.5.3 s3fs==2026.9.0 fsspec==2026.9.0 \
           aiobotocore==3.10.0 botocore==1.43.117 jmespath==1.1.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 \
           aiosignal==1.4.0 aioitertools==0.13.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 \
           propcache==0.5.4 yarl==1.25.1 wrapt==2.5.2 python-dateutil==2.9.0.post0 six==1.17.0 \
           tqdm==4.70.1 treelib==1.8.0 tensordict==0.15.3 cloudpickle==3.1.3 pyvers==0.2.3 \
           omegaconf==2.4.0 PyYAML==6.0.4 jaxtyping==0.3.11 wadler_lindig==0.1.8 termcolor==3.3.0 \
           einops==0.8.2
# what the demo and the plugin build need: DEPS and blosc2 (c-blosc2); the tests: the rest besides
BUILD_NO_DEPS := blosc2==4.14.1
TEST_NO_DEPS := $(filter-out $(BUILD_NO_DEPS),$(NO_DEPS))
STAMP := $(VENV)/.deps-$(shell echo $(DEPS) $(BUILD_NO_DEPS) | cksum | cut -d' ' -f1)
TEST_STAMP := $(VENV)/.test-deps-$(shell echo $(TEST_DEPS) $(TEST_NO_DEPS) | cksum | cut -d' ' -f1)
# --no-compile: no .pyc written for the ~30,000 modules installed (torch, DALI) at install time;
# Python compiles the few it imports on first use (the test set-up compiles them all, below). -q: pip's
# warnings still show.
PIP_INSTALL := $(PIP) install -q --no-compile
# the C libraries the plugin links from the system (codecs, libcurl): .ci/system-libs.sh checks them
# on every run, installs the missing -dev packages when run as root with apt-get
# (DALI_MESH_SYSTEM_LIBS=0: never), and rewrites this file only when the list found changes
SYSLIBS := build/system-libs.txt
PLUGIN_SOURCES := $(wildcard csrc/* csrc/*/* csrc/*/*/*) CMakeLists.txt setup.py
INSTALLED := $(VENV)/.installed

# `make kernels` builds only the DALI-free libdali_mesh_kernels.so (CPU kernel, host emulation of the
# GPU kernel, and the CUDA kernels when nvcc is found) into $(KERNELS_DEST): for a machine with a GPU
# and no DALI. It needs CMake >= 3.24 (a system CMake is fine), a C++20 compiler and, for the GPU
# code, nvcc (its sources compile as C++17); no venv, no DALI, nothing downloaded.
#   make kernels DALI_MESH_CUDA_ARCHS=native   the local GPU (default: SASS 80, 90 + PTX 75)
#   make kernels DALI_MESH_CUDA=0              CPU only;  KERNELS_DEST=/tmp/k  elsewhere
#   make kernels DALI_MESH_MIN_BLOCKS_PER_SM=4 the kernels bounded to 4 blocks per SM (gpu-check times both)
# `make gpu-check` runs the GPU check (benchmarks/gpu_check.py) with $(PYTHON) as it is: it creates
# no venv and installs nothing (PYTHON=/path/to/python3 to choose the interpreter).
CMAKE ?= cmake
KERNELS_BUILD ?= build/kernels
KERNELS_DEST ?= dali_mesh
DALI_MESH_CUDA ?= AUTO
DALI_MESH_MIN_BLOCKS_PER_SM ?= 0

.PHONY: all install demo test test-fast wheel wheel-check bench clean kernels gpu-check FORCE
all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

# pip >= 23 (Debian 12's python3 -m venv gives 23.0.1); no upgrade when it is there already
$(STAMP): | $(PY)
	@$(PY) -c 'import pip, sys; sys.exit(int(pip.__version__.split(".")[0]) < 23)' \
	  || $(PIP) install -q --no-compile --upgrade "pip>=23"
	$(PIP_INSTALL) $(DEPS)
	$(PIP_INSTALL) --no-deps $(BUILD_NO_DEPS)
	touch $@

# then the bytecode of everything installed, once (75 s on 2 cores): the suite starts hundreds of
# interpreters, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) Python would otherwise
# compile torch and DALI again in each (`import torch, torch.distributed.tensor, nvidia.dali.fn`:
# 18 s without the bytecode, 7.5 s with it, 2026-12-04). The one file skipped is Python 3.12 syntax
# that torch never imports on 3.11.
$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) $(TEST_DEPS)
	$(PIP_INSTALL) --no-deps $(TEST_NO_DEPS)
	$(PY) -m compileall -q -j 0 -x '/py312_intrinsics\.py$$' $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	touch $@

$(SYSLIBS): FORCE
	@sh .ci/system-libs.sh $@

FORCE:

# --no-build-isolation: the plugin must be built against the DALI installed above, not a second one.
$(INSTALLED): $(SYSLIBS) $(STAMP) $(PLUGIN_SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(INSTALLED)

demo: install
	$(VENV)/bin/dali-mesh demo

# two pytest-xdist workers (the machines these run on have 2 cores; much of the suite waits on
# subprocesses, timeouts and the other rank). PYTEST_XDIST=0 runs them in one process. Not
# xdist_group/--dist loadgroup: with pytest 9.2 it has no effect (xdist 3.8.0 renames item._nodeid,
# which pytest 9 no longer reads), so a module fixture is made once per worker that runs its tests.
PYTEST_XDIST ?= 2
PYTEST_ARGS := -q -p no:cacheprovider $(if $(filter-out 0,$(PYTEST_XDIST)),-n $(PYTEST_XDIST) --dist load)

test: install $(TEST_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# the single-process tests (tests/conftest.py marks the others `slow`: multi-rank runs, sanitizer
# and spill-check builds, the end-to-end CLI runs)
test-fast: install $(TEST_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow"

# dist/dali_mesh-<version>-<python>-<platform>.whl: the package with libdali_mesh.so,
# libdali_mesh_kernels.so, the C libraries they link that a fresh machine may lack (dali_mesh/_libs)
# and _build_info.py (the DALI version it was built against, checked when the plugin loads). Built
# in build/cmake like the editable install (incremental). `make wheel-check` installs it into a
# new venv beside DALI alone and runs a small pipeline from it (native reads through the plugin), and
# checks that the plugin links the kernels library beside it, loaded once (one native core).
wheel: $(SYSLIBS) $(STAMP)
	rm -f dist/dali_mesh-*.whl
	DALI_MESH_WHEEL=1 $(PIP) wheel -q --no-build-isolation --no-deps -w dist .
	@ls dist/dali_mesh-*.whl

wheel-check: wheel
	$(PY) tests/wheel_check.py dist/dali_mesh-*.whl

bench: install
	$(PY) benchmarks/region_bench.py

kernels:
	$(CMAKE) -S . -B $(KERNELS_BUILD) -DCMAKE_BUILD_TYPE=Release -DDALI_MESH_KERNELS_ONLY=ON \
	  -DDALI_MESH_CUDA=$(DALI_MESH_CUDA) -DDALI_MESH_MIN_BLOCKS_PER_SM=$(DALI_MESH_MIN_BLOCKS_PER_SM) \
	  $(if $(DALI_MESH_CUDA_ARCHS),"-DDALI_MESH_CUDA_ARCHS=$(DALI_MESH_CUDA_ARCHS)" "-DCMAKE_CUDA_ARCHITECTURES=$(DALI_MESH_CUDA_ARCHS)")
	$(CMAKE) --build $(KERNELS_BUILD) --target dali_mesh_kernels -j $(or $(CMAKE_BUILD_PARALLEL_LEVEL),2)
	mkdir -p $(KERNELS_DEST)
	cp $(KERNELS_BUILD)/libdali_mesh_kernels.so $(KERNELS_DEST)/libdali_mesh_kernels.so.tmp
	mv -f $(KERNELS_DEST)/libdali_mesh_kernels.so.tmp $(KERNELS_DEST)/libdali_mesh_kernels.so

gpu-check:
	$(PYTHON) benchmarks/gpu_check.py

clean:
	rm -rf build dist *.egg-info dali_mesh/*.so dali_mesh/_build_info.py
