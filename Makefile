# `make demo` runs the main job, `make test` the tests. Both create or reuse .venv, install what is
# needed (building the DALI plugin) and are safe to re-run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned. torch==2.13.0 is the CPU build (on these machines pip takes it from local disk); never
# let a range pull a multi-GB CUDA build here.
DEPS := torch==2.13.0 numpy==2.4.6 nvidia-dali-cuda120==2.4.0 h5py==3.16.0 zarr==3.1.6 \
        matplotlib==3.11.2 setuptools==84.2.1 wheel==0.48.0 cmake==4.4.5 ninja==1.13.2
TEST_DEPS := pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.17
STAMP := $(VENV)/.deps-$(shell echo $(DEPS) $(TEST_DEPS) | cksum | cut -d' ' -f1)
PLUGIN_SOURCES := $(wildcard csrc/* csrc/*/*) CMakeLists.txt setup.py
INSTALLED := $(VENV)/.installed

.PHONY: all install demo test bench clean
all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PIP) install -q --upgrade "pip>=23"
	$(PIP) install -q $(DEPS) $(TEST_DEPS)
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

clean:
	rm -rf build *.egg-info dali_mesh/*.so dali_mesh/_build_info.py
