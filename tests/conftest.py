"""Fixtures shared by the test modules."""
import pytest


@pytest.fixture
def kernels_library():
    """The kernels library (dali_mesh._kernels) loaded, or the test skipped when it is not built."""
    from dali_mesh import _kernels

    try:
        _kernels.load()
    except _kernels.KernelsError as e:
        pytest.skip(f"the kernels library is not built: {e}")


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
    # subprocesses of DALI pipelines or ranks: the demo, the benchmark scripts' tiny runs, the docs'
    # snippets and Sphinx build, PhysicsNeMo's real DistributedManager and its ERA5 datapipe
    "tests/cli/test_demo.py", "tests/test_bench_scripts.py", "tests/test_docs.py",
    "tests/torch/test_physicsnemo_real.py", "tests/torch/test_physicsnemo_era5.py",
    "tests/reader/test_read_ahead_memory.py",
}
#: single tests of other modules: multi-rank runs, sanitizer builds, the spill check's nvcc compiles
SLOW_NAME_PARTS = ("torchrun", "gloo_ranks", "_4_ranks", "_8_ranks", "2x2_mesh", "world4", "world8",
                   "sanitizer", SPILL_TEST)
#: further tests that took 1.2 s or more (setup and call, all parametrisations) in a full run on 2 cores
#: (`PYTEST_ADDOPTS=--durations=200 bash .ci/run`, 2026-12-03): each still runs in `make test`
SLOW_TESTS: set[str] = {
    # remote storage against the moto server (each > 4 s)
    "tests/storage/test_remote.py::test_dataset_sources_read_from_s3_with_storage_options_equal_xarray",
    "tests/storage/test_remote.py::test_the_differential_zarr_fuzz_holds_over_s3",
    "tests/storage/test_remote.py::test_listing_pages_through_every_object",
    "tests/storage/test_remote.py::test_every_rank_reads_hdf5_and_zarr_from_s3_natively_as_the_local_copy",
    "tests/storage/test_remote.py::test_demo_reads_an_s3_store_and_counts_the_bytes_fetched",
    "tests/storage/test_remote.py::test_blosc_chunks_read_in_parts_over_s3_equal_zarr_python",
    "tests/storage/test_remote.py::test_convert_copies_an_s3_source_as_h5py_reads_it",
    "tests/storage/test_remote.py::test_plan_data_prints_what_each_rank_fetches_and_the_reader_fetches_it",
    # issue 52's hang tests: a server that never answers, 2-3 s timeouts, two exits of a process of their
    # own with moto (2-8 s each, 2026-12-07); the demo's one-line error of a nested location
    "tests/storage/test_icechunk_timeouts.py::test_a_process_with_reads_stuck_in_the_library_exits_at_once",
    "tests/storage/test_icechunk_timeouts.py::test_a_read_whose_requests_are_never_answered_fails_within_its_timeout",
    "tests/storage/test_icechunk_timeouts.py::test_stall_drops_an_answer_that_stops_sending_and_the_read_goes_on",
    "tests/storage/test_icechunk_timeouts.py::test_making_a_source_over_a_server_that_never_answers_fails_within_its_"
    "timeout",
    "tests/storage/test_icechunk_timeouts.py::test_without_a_timeout_the_default_bounds_the_source_too",
    "tests/cli/test_locations.py::test_a_nested_presigned_url_never_shows_in_the_command_lines_output",
    # 20 processes whose icechunk open timed out, each exiting (16 s)
    "tests/storage/test_icechunk_review.py::test_a_process_whose_open_timed_out_exits_cleanly_every_time",
    # a spawned DataLoader worker imports torch and the test module (about 7 s under load)
    "tests/storage/test_icechunk_fork.py::test_torch_dataloader_with_spawned_workers_reads_every_window_as_zarr_python",
    "tests/cli/test_convert.py::test_a_full_disk_is_one_line_exit_2_and_no_partial_copy",
    "tests/cli/test_convert.py::test_sigterm_removes_the_partial_copy_and_sigkill_leftovers_go_next_time",
    "tests/cli/test_plan.py::test_plan_data_channels_counts_the_chunks_each_rank_reads",
    "tests/cli/test_plan.py::test_plan_huge_meshes_are_bounded",
    "tests/cli/test_plan.py::test_plan_png",
    "tests/io/test_channels.py::test_channel_lists_with_repeats_on_every_read_path",
    "tests/io/test_crafted_fuzz.py::test_crafted_files_are_refused_or_read_exactly",
    "tests/io/test_faults.py::test_concurrent_rewrite_never_kills_a_default_read",
    "tests/io/test_faults.py::test_fifo_in_a_zarr_store_is_refused_without_blocking",
    "tests/io/test_faults.py::test_fifo_in_place_of_a_file_is_refused_without_blocking",
    "tests/io/test_npy_fuzz.py::test_mutated_npy_files_read_like_numpy_or_raise_data_file_error",
    "tests/io/test_npy_rewrite.py::test_a_window_is_never_of_two_versions",
    "tests/partition/test_partition.py::test_chunk_matches_torch_dtensor",
    "tests/partition/test_partition.py::test_window_equals_np_pad",
    "tests/pipeline/test_dataset.py::test_a_variable_that_is_not_native_falls_back_alone",
    "tests/pipeline/test_dataset.py::test_every_window_of_every_rank_equals_xarray",
    "tests/pipeline/test_dataset.py::test_netcdf4_files_equal_xarray",
    "tests/pipeline/test_dataset.py::test_partitioned_source_and_normalisation",
    "tests/pipeline/test_dataset_checks.py::test_float64_output_is_normalised_in_float64",
    "tests/pipeline/test_kernels.py::test_random_windows_every_mode_and_dtype",
    "tests/pipeline/test_partitioned_source.py::test_checkpoint_restores_the_same_next_sample",
    "tests/pipeline/test_partitioned_source.py::test_hdf5_forecast_source_in_a_pipeline",
    "tests/pipeline/test_partitioned_source.py::test_parallel_source_two_epochs_match_the_oracle",
    "tests/pipeline/test_read_windows.py::test_demo_verifies_a_folder_of_mixed_byte_orders_and_orders",
    "tests/pipeline/test_read_windows.py::test_hdf5_types_h5py_converts_are_read_through_h5py",
    "tests/pipeline/test_read_windows.py::test_layout_string_and_fallback_to_partitioned_source",
    "tests/pipeline/test_read_windows.py::test_same_outputs_as_partitioned_source_over_two_shuffled_epochs",
    "tests/pipeline/test_read_windows_compressed.py::test_filters_and_unknown_codecs_fall_back_naming_them",
    "tests/pipeline/test_read_windows_compressed.py::test_random_compressed_configurations_match_the_oracle",
    "tests/pipeline/test_read_windows_compressed.py::test_the_process_exits_after_a_decode_error",
    "tests/pipeline/test_read_windows_compressed.py::test_zarr_compressed_equals_partitioned_source_and_resumes",
    "tests/pipeline/test_read_windows_compressed.py::test_zarr_v3_sharded",
    "tests/pipeline/test_read_windows_differential.py::test_every_window_equals_zarr_python",
    "tests/pipeline/test_read_windows_faults.py::test_a_group_near_2_63_is_refused_not_prefetched_for_ever",
    "tests/pipeline/test_read_windows_faults.py::test_a_process_that_dies_leaves_no_plan_behind",
    "tests/pipeline/test_read_windows_faults.py::test_a_stuck_native_read_is_named_and_the_process_exits",
    "tests/pipeline/test_read_windows_faults.py::test_checksum_valid_nonsense_never_crashes",
    "tests/pipeline/test_read_windows_faults.py::test_hdf5_external_link_is_never_read_natively",
    "tests/pipeline/test_read_windows_faults.py::test_many_chunk_zarr_batch_reads_under_a_low_open_file_limit",
    "tests/pipeline/test_read_windows_faults.py::test_npy_saved_over_while_read_natively_is_one_version_or_an_error",
    "tests/pipeline/test_read_windows_faults.py::test_short_reads_and_eintr_in_the_header_check_and_the_reads",
    "tests/pipeline/test_read_windows_scale.py::test_a_window_of_many_rows_plans_in_runs_not_elements",
    "tests/pipeline/test_read_windows_scale.py::test_many_chunked_hdf5_steps_plan_per_chunk_layout",
    "tests/pipeline/test_read_windows_scale.py::test_two_to_the_31_steps_define_and_read_without_planning_every_step",
    "tests/reader/test_plan_reader.py::test_the_reader_runs_without_dali",
    "tests/test_architecture.py::test_no_import_circle_through_annotations_either",
    "tests/test_source.py::test_many_hdf5_files_read_under_a_low_open_file_limit",
    "tests/torch/test_like.py::test_first_batch_is_checked_against_the_model_input",
    "tests/torch/test_loader.py::test_padded_samples_flagged_or_dropped",
    "tests/torch/test_loader.py::test_per_sample_shapes_come_as_lists",
    "tests/torch/test_loader_checks.py::test_checkpoint_of_another_source_or_batch_size_is_refused_and_the_same_resumes",
    "tests/torch/test_loader_checks.py::test_load_state_dict_refuses_what_is_not_a_state",
    "tests/torch/test_loader_checks.py::test_output_map_of_the_wrong_length_is_refused",
    "tests/torch/test_loader_checks.py::test_output_map_swapping_sample_id_and_is_pad_is_refused",
}


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
    of the fuzz harnesses (tests/io/test_codec_fuzz.py, test_plan_fuzz.py). Not in pytest-xdist workers."""
    import os
    import tempfile

    config, items = session.config, session.items
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # under pytest-xdist every worker collects every test: each would start the compiles though one
        # worker runs the test; the tests compile when they run instead
        return
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
