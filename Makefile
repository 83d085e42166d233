# `make demo` runs the main job, `make test` the tests. Both create or reuse .venv, install what is
# needed (building the DALI plugin) and are safe to re-run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned. torch==2.13.0 is the CPU build (on these machines pip takes it from local disk); never
# let a range pull a multi-GB CUDA build here.
DEPS := torch==2.13.0 numpy==2.4.6 nvidia-dali-cuda120==2.4.0 h5py==3.16.0 zarr==3.1.6 \
        matplotlib==3.11.2 setuptools==84.2.1 wheel==0.48.0 cmake==4.4.5 ninja==1.13.2 google-crc32c==1.9.0
TEST_DEPS := pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.17 xarray==2026.9.0 pandas==3.1.1 h5netcdf==1.8.2
# installed with --no-deps: blosc2 for its C library only (c-blosc2: headers, libblosc2.so), which
# the plugin links; PhysicsNeMo (for tests against the real package) and the light pure-Python
# modules its domain_parallel and distributed modules import, pinned one by one: its own
# requirements pull torchvision through timm, which does not import beside the CPU torch here
NO_DEPS := blosc2==4.14.1 nvidia-physicsnemo==2.2.2 warp-lang==1.19.0 requests==2.34.2 urllib3==2.8.0 \
           idna==3.20 certifi==2026.10.19.post1 charset-normalizer==3.5.3 s3fs==2026.9.0 fsspec==2026.9.0 \
           aiobotocore==3.10.0 botocore==1.43.117 jmespath==1.1.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 \
           aiosignal==1.4.0 aioitertools==0.13.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 \
           propcache==0.5.4 yarl==1.25.1 wrapt==2.5.2 python-dateutil==2.9.0.post0 six==1.17.0 \
           tqdm==4.70.1 treelib==1.8.0 tensordict==0.15.3 cloudpickle==3.1.3 pyvers==0.2.3 \
           omegaconf==2.4.0 PyYAML==6.0.4 jaxtyping==0.3.11 wadler_lindig==0.1.8 termcolor==3.3.0 \
           einops==0.8.2
STAMP := $(VENV)/.deps-$(shell echo $(DEPS) $(TEST_DEPS) $(NO_DEPS) | cksum | cut -d' ' -f1)
PLUGIN_SOURCES := $(wildcard csrc/* csrc/*/* csrc/*/*/*) CMakeLists.txt setup.py
INSTALLED := $(VENV)/.installed

# `make kernels` builds only the DALI-free libdali_mesh_kernels.so (CPU kernel, host emulation of the
# GPU kernel, and the CUDA kernels when nvcc is found) into $(KERNELS_DEST): for a machine with a GPU
# and no DALI. It needs CMake >= 3.24 (a system CMake is fine), a C++20 compiler and, for the GPU
# code, nvcc (its sources compile as C++17); no venv, no DALI, nothing downloaded.
#   make kernels DALI_MESH_CUDA_ARCHS=native   the local GPU (default: SASS 75..90 + PTX of 90)
#   make kernels DALI_MESH_CUDA=0              CPU only;  KERNELS_DEST=/tmp/k  elsewhere
#   make kernels DALI_MESH_MIN_BLOCKS_PER_SM=4 the kernels bounded to 4 blocks per SM (gpu-check times both)
# `make gpu-check` runs the GPU check (benchmarks/gpu_check.py) with $(PYTHON) as it is: it creates
# no venv and installs nothing (PYTHON=/path/to/python3 to choose the interpreter).
CMAKE ?= cmake
KERNELS_BUILD ?= build/kernels
KERNELS_DEST ?= dali_mesh
DALI_MESH_CUDA ?= AUTO
DALI_MESH_MIN_BLOCKS_PER_SM ?= 0

.PHONY: all install demo test bench clean kernels gpu-check
all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PIP) install -q --upgrade "pip>=23"
	$(PIP) install -q $(DEPS) $(TEST_DEPS)
	$(PIP) install -q --no-deps $(NO_DEPS)
	touch $@

# --no-build-isolation: the plugin must be built against the DALI installed above, not a second one.
$(INSTALLED): $(STAMP) $(PLUGIN_SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(INSTALLED)

demo: install
	$(VENV)/bin/dali-mesh demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

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
	rm -rf build *.egg-info dali_mesh/*.so dali_mesh/_build_info.py
