"""Fixtures shared by the test modules."""
import pytest


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo process group for the module: enough to build real DeviceMeshes and DTensors."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---- the CUDA spill check's compiles, started early ---------------------------------------------------
SPILL_TEST = "test_the_cuda_kernels_compile_without_register_spills"


def spill_compiles(out_dir):
    """Start the two nvcc processes of tests/pipeline/test_build.py's spill check (each with part of the
    kernel instantiations: DALI_MESH_KERNEL_PART) writing objects into ``out_dir``; ``None`` without
    nvcc. Returns the ``Popen`` objects (stdout and stderr piped)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc:
        return None
    root = Path(__file__).resolve().parents[1]
    return [subprocess.Popen([nvcc, "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "--fmad=false",
                              "-DDALI_MESH_WITH_CUDA=1", f"-DDALI_MESH_KERNEL_PART={part}", "-I", str(root / "csrc"),
                              "-c", str(root / "csrc" / "kernels" / "slice_gpu.cu"), "-o",
                              os.path.join(str(out_dir), f"k{part}.o")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for part in (1, 2)]


FUZZ_TESTS = {"test_corrupted_chunks_never_crash_under_sanitizers": "CODEC_HARNESS",
              "test_crafted_plan_words_never_crash_under_sanitizers": "PLAN_HARNESS"}


# ---- `make test-fast`: the single-process tests (pytest -m "not slow") ---------------------------------
#: whole modules that run several ranks or processes, or build with sanitizers
SLOW_MODULES = {
    "tests/torch/test_distributed.py", "tests/torch/test_share.py", "tests/torch/test_example_physicsnemo.py",
    "tests/cli/test_launch.py", "tests/cli/test_end_to_end.py", "tests/pipeline/test_watchdog.py",
    "tests/test_wheel.py",
}
#: single tests of other modules: multi-rank runs, sanitizer builds, the spill check's nvcc compiles
SLOW_NAME_PARTS = ("torchrun", "gloo_ranks", "_4_ranks", "_8_ranks", "2x2_mesh", "world4", "world8",
                   "sanitizer", SPILL_TEST)
#: further tests that take long on 2 cores (tests/conftest.py's durations, measured with --durations)
SLOW_TESTS: set[str] = set()


def _mark_slow(items):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    for item in items:
        try:
            module = pathlib.Path(str(item.fspath)).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        name = item.name.split("[")[0]
        if (module in SLOW_MODULES or any(part in name for part in SLOW_NAME_PARTS)
                or f"{module}::{name}" in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Marks the tests `make test-fast` leaves out ``slow`` (above), before ``-m`` deselects."""
    _mark_slow(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """When the spill check is selected, its compiles (30 s of nvcc on 2 cores) start now and run beside
    the tests before it, on the core the single-process tests leave idle; so do the sanitized builds
    of the fuzz harnesses (tests/io/test_codec_fuzz.py, test_plan_fuzz.py)."""
    import tempfile

    config, items = session.config, session.items
    if any(item.name == SPILL_TEST for item in items) and not hasattr(config, "_dm_spill"):
        out = tempfile.mkdtemp(prefix="dali_mesh_spill_")
        config._dm_spill = (out, spill_compiles(out))
    fuzz = {FUZZ_TESTS[item.name] for item in items if item.name in FUZZ_TESTS}
    if fuzz and not hasattr(config, "_dm_fuzz"):
        import sys

        module = sys.modules.get("tests.io.test_codec_fuzz")
        if module is not None:  # collected (its imports were there)
            out = tempfile.mkdtemp(prefix="dali_mesh_fuzz_")
            module.start_builds(out, [getattr(module, h) for h in sorted(fuzz)])
            config._dm_fuzz = (out, module)


def pytest_unconfigure(config):
    import shutil

    fuzz = getattr(config, "_dm_fuzz", None)
    if fuzz is not None:
        fuzz[1].stop_builds()
        shutil.rmtree(fuzz[0], ignore_errors=True)
    spill = getattr(config, "_dm_spill", None)
    if spill is not None:
        for proc in spill[1] or []:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate()
            except ValueError:  # the test read it already
                pass
        shutil.rmtree(spill[0], ignore_errors=True)
