"""CI smoke runs of the benchmark scripts and of the GPU check's CPU-side logic, so that the code a GPU
machine runs does not rot where there is none: each script runs on tiny data (a few seconds) and
its output is checked; the GPU check's planning, JUnit counting, time bounds and summary are checked
on fake results."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
LAST_LINE = ("gpu-check: {p} passed, {f} failed, {s} skipped; kernel {k} of D2D copy; "
             "dali_mesh read_windows {r} samples/s into GPU memory")


def _run(args, tmp_path, timeout=120, env=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _module(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _needs_plugin():
    pytest.importorskip("nvidia.dali")
    from dali_mesh import fn as dfn

    if not dfn.PLUGIN_PATH.exists():
        pytest.skip("libdali_mesh.so not built (pip install --no-build-isolation -e .)")


def _needs_kernels():
    from dali_mesh import _kernels as K

    try:
        K.load()
    except K.KernelsError as e:
        pytest.skip(str(e))


# ---- gpu_bench.py ------------------------------------------------------------------------------------------
def test_gpu_bench_cpu_tiny_runs_every_loader(tmp_path):
    _needs_plugin()
    r = _run([str(BENCH / "gpu_bench.py"), "--device", "cpu", "--tiny", "--dir", str(tmp_path / "data"),
              "--json", str(tmp_path / "b.json"), "--out", str(tmp_path / "b.md")], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["ok"] is True
    (case,) = data["cases"]
    assert case["shape"] == [2, 21, 40]
    assert sorted(case["results"]) == ["a", "b", "c", "d", "e"]
    for key, res in case["results"].items():
        assert res["error"] == "" and res["mismatch"] == "", (key, res)
        assert len(res["cold_s"]) == 1 and len(res["warm_s"]) == 1 and res["warm_samples_per_s"] > 0, (key, res)
    assert data["headline_samples_per_s"] == case["results"]["e"]["warm_samples_per_s"]  # the native reader
    md = (tmp_path / "b.md").read_text()
    assert md.count("equal to numpy") == 5 and "CPU pipelines (`--device cpu`)" in md
    assert not (tmp_path / "data").exists()  # data removed without --keep


def test_gpu_bench_check_finds_a_wrong_batch(tmp_path):
    """The benchmark's own check of the first batch: equal passes, one wrong value is reported."""
    gb = _module("gpu_bench")
    files = gb.make_data(str(tmp_path), 2, (2, 9, 12))
    args = type("Args", (), {"device": "cpu", "batch_size": 2, "threads": 1, "workers": 1})()
    case = gb.Case(files, (2, 9, 12), args)
    from dali_mesh._kernels import reference_strided_slice
    from dali_mesh.partition import take_window

    owned = [take_window(np.load(f), case.region) for f in files]
    assert case.check("b", [owned]) == ""
    owned[1] = owned[1].copy()
    owned[1][0, 0, 3] += 1
    assert case.check("b", [owned]).startswith("sample 1:")
    d = [reference_strided_slice(take_window(np.load(f), case.halo_region), case.d_start, case.d_shape, 1,
                                 ["constant", "constant", "periodic"], dtype=np.float16, channel_axis=0,
                                 mean=case.mean, std=case.std) for f in files[::-1]]
    assert case.check("d", [d, [1, 0]]) == ""  # sample ids say which file each window is
    assert case.check("d", [d, [0, 1]]).startswith("sample 0:")
    assert case.d_shape == [2, case.halo_region.window_shape[1], 12 + 2 * gb.LON_HALO]


# ---- gpu_check.py ------------------------------------------------------------------------------------------
def test_gpu_check_without_a_gpu_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run `make gpu-check`")
    out = tmp_path / "out"
    r = _run([str(BENCH / "gpu_check.py")], tmp_path, env={"GPU_CHECK_OUT": str(out)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no CUDA GPU visible" in r.stderr
    lines = r.stdout.strip().splitlines()
    skipped = len(json.loads((out / "results.json").read_text())["steps"])
    assert lines[-1] == LAST_LINE.format(p=0, f=0, s=skipped, k="n/a", r="n/a")
    assert (out / "summary.md").read_text().rstrip().endswith(lines[-1] + "\n```")


def _fake_info(**kw):
    info = {"python_path": "/opt/py/bin/python3", "cpus": 16, "gpus": 1, "gpu_name": "NVIDIA H200",
            "torch": "2.11", "tools": {"nvcc": "/usr/local/cuda/bin/nvcc", "compute-sanitizer": "/cs",
                                       "cmake": "/usr/bin/cmake", "make": "/usr/bin/make", "nvidia-smi": None},
            "make_kernels_target": True}
    info.update(kw)
    return info


def test_gpu_check_plans_each_setting(tmp_path, monkeypatch, capsys):
    gc = _module("gpu_check")
    assert gc.setting_of(_fake_info()) == "kernels"
    assert gc.setting_of(_fake_info(dali="2.4.0")) == "dali"
    assert gc.setting_of(_fake_info(gpus=0)) == "none"

    steps = {s.name: s for s in gc.plan(_fake_info(), "kernels", tmp_path, 16)}
    build = steps["build-kernels"]
    assert build.cmd[1:] == ["kernels", "DALI_MESH_CUDA=1", "DALI_MESH_CUDA_ARCHS=native"]
    assert "--ignore=tests/gpu/test_gpu_dali.py" in steps["gpu-tests"].cmd
    assert steps["stress"].cmd[-1] == "tests/gpu/test_gpu_stress.py"
    assert steps["memcheck"].cmd[:3] == ["/cs", "--tool", "memcheck"] and steps["memcheck"].last
    assert steps["memcheck"].env == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    for name in ("dali-tests", "demo-1rank", "demo-2ranks", "gpu-bench"):
        assert steps[name].cmd is None and "DALI is not importable" in steps[name].reason
    # the kernels bounded to 4 blocks per SM (issue 19.20), built apart and timed beside the default
    mb4 = steps["build-kernels-minblocks4"]
    assert mb4.cmd[1:5] == ["kernels", "DALI_MESH_CUDA=1", "DALI_MESH_CUDA_ARCHS=native", "DALI_MESH_MIN_BLOCKS_PER_SM=4"]
    assert any(a.startswith("KERNELS_DEST=") and a.endswith("kernels-minblocks4") for a in mb4.cmd)
    bench4 = steps["kernel-bench-minblocks4"]
    assert bench4.needs == ("build-kernels-minblocks4",) and "kernel_bench_minblocks4.json" in bench4.cmd[-1]
    assert bench4.env["DALI_MESH_KERNELS_LIB"].endswith("kernels-minblocks4/libdali_mesh_kernels.so")
    assert all(0 < s.timeout <= 300 for s in steps.values() if s.cmd)  # each step bounded,
    assert gc.DEFAULT_BUDGET < 8 * 60  # and the whole check

    no_make = gc.plan(_fake_info(make_kernels_target=False), "kernels", tmp_path, 4)
    assert no_make[0].cmd[0] == "bash" and "-DDALI_MESH_KERNELS_ONLY=ON" in no_make[0].cmd[2]
    assert "-DCMAKE_CUDA_ARCHITECTURES=native" in no_make[0].cmd[2]
    no_torch = {s.name: s for s in gc.plan(_fake_info(torch=None, cupy="13.6"), "kernels", tmp_path, 4)}
    assert no_torch["kernel-bench"].cmd is None and "torch" in no_torch["kernel-bench"].reason
    assert no_torch["gpu-tests"].cmd is not None  # the tests run on cupy memory
    no_sanitizer = gc.plan(_fake_info(tools={"compute-sanitizer": None}), "kernels", tmp_path, 4)
    assert no_sanitizer[-1].cmd is None and "compute-sanitizer" in no_sanitizer[-1].reason

    plan = gc.plan(_fake_info(dali="2.4.0"), "dali", tmp_path, 16)
    assert [s.name for s in plan][:3] == ["build-kernels", "build-plugin", "gpu-tests"]
    steps = {s.name: s for s in plan}
    assert steps["gpu-tests"].needs == ("build-kernels",) and steps["dali-tests"].needs == ("build-plugin",)
    assert steps["build-plugin"].cmd[1:] == ["-m", "pip", "install", "--no-index", "--no-build-isolation",
                                             "--no-deps", "-e", "."]
    assert steps["build-plugin"].env["DALI_MESH_CUDA_ARCHS"] == "native"
    assert steps["dali-tests"].cmd[-1] == "tests/gpu/test_gpu_dali.py"
    assert steps["demo-1rank"].cmd[2:4] == ["dali_mesh.cli", "demo"] and "1" in steps["demo-1rank"].cmd
    assert "benchmarks/gpu_bench.py" in steps["gpu-bench"].cmd

    # --dry-run prints the plan of the forced setting and runs nothing
    monkeypatch.setattr(gc, "detect", lambda python: _fake_info(python_path=python, gpus=0, dali="2.4.0"))
    assert gc.main(["--dry-run", "--setting", "dali", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("gpu-check plan: setting dali")
    assert "--no-index" in text and "tests/gpu/test_gpu_dali.py" in text and "compute-sanitizer" in text
    assert not (tmp_path / "o").exists()


def test_gpu_check_runs_steps_counts_tests_and_bounds_time(tmp_path):
    gc = _module("gpu_check")
    (tmp_path / "test_fake.py").write_text(
        "import pytest\n"
        "def test_ok():\n    assert 1\n"
        "def test_bad():\n    assert 0, 'wrong window'\n"
        "def test_skip():\n    pytest.skip('no GPU here')\n")
    cmd, junit = gc._pytest(sys.executable, tmp_path, "fake", [str(tmp_path / "test_fake.py")])
    with open(tmp_path / "log", "w") as log:
        res = gc.run_step(gc.Step("fake", "three tests", cmd, 60, junit=junit, cwd=str(tmp_path)), log, 100)
        assert (res.status, res.passed, res.failed, res.skipped) == ("failed", 1, 1, 1)
        assert "test_bad" in res.failed_tests[0] and "wrong window" in res.failed_tests[0]
        assert "no GPU here" in res.skipped_tests[0]

        slow = gc.Step("slow", "sleeps", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
        res = gc.run_step(slow, log, 100)
        assert (res.status, res.failed) == ("failed", 1) and "timed out after 1 s" in res.detail
        assert res.seconds < 30

        res = gc.run_step(gc.Step("late", "no budget", [sys.executable, "-c", "pass"], 60), log, 5)
        assert (res.status, res.skipped) == ("skipped", 1) and "budget" in res.detail
        res = gc.run_step(gc.Step("bench", "one check", [sys.executable, "-c", "pass"], 60), log, 100)
        assert (res.status, res.passed, res.failed) == ("passed", 1, 0)
    assert "===== slow: sleeps" in (tmp_path / "log").read_text()


def test_gpu_check_summary_and_last_line_from_fake_results(tmp_path):
    gc = _module("gpu_check")
    (tmp_path / "kernel_bench.json").write_text(json.dumps({"cases": {
        "inside": {"window": "w", "kernel_GBps": 3900.0, "d2d_copy_GBps": 4400.0, "fraction_of_copy": 0.886},
        "periodic_halo": {"window": "w", "kernel_GBps": 3000.0, "d2d_copy_GBps": 4400.0, "fraction_of_copy": 0.68},
        "inside_cols": {"window": "w", "kernel_GBps": 3500.0, "d2d_copy_GBps": 4400.0, "fraction_of_copy": 0.79}}}))
    (tmp_path / "gpu_bench.json").write_text(json.dumps({"headline_samples_per_s": 412.34, "markdown": "| t |"}))
    results = [gc.Result("build-kernels", "b", "passed", 40, passed=1),
               gc.Result("gpu-tests", "t", "failed", 20, passed=12, failed=1, failed_tests=["x::test_y: boom"]),
               gc.Result("memcheck", "m", "skipped", detail="compute-sanitizer is not installed", skipped=1)]
    frac, rows = gc.kernel_figures(tmp_path / "kernel_bench.json")
    rate, md = gc.loader_figure(tmp_path / "gpu_bench.json")
    totals = gc.totals_of(results)
    line = gc.last_line(totals, frac, rate)
    assert line == LAST_LINE.format(p=13, f=1, s=1, k="89%", r="412.3")
    assert gc.last_line({"passed": 3, "failed": 0, "skipped": 0}, None, None) == LAST_LINE.format(
        p=3, f=0, s=0, k="n/a", r="n/a")
    assert [(r["case"], r["met"]) for r in rows] == [("inside", True), ("periodic_halo", False), ("inside_cols", None)]
    summary = gc.summary_markdown(_fake_info(dali="2.4.0"), "dali", results, rows, md,
                                  {"demo-2ranks": "passed; backend: gloo on the CPU"}, line, "python gpu_check.py")
    assert "- gpu-tests: FAILED x::test_y: boom" in summary
    assert "- memcheck: not run (compute-sanitizer is not installed)" in summary
    assert "- kernel periodic_halo: 68% of D2D copy, target 75%: MISSED" in summary
    assert "| inside | w | 3900 | 4400 | 89% | 85% met |" in summary
    assert "demo-2ranks: passed; backend: gloo on the CPU" in summary and "| t |" in summary
    assert summary.rstrip().endswith(line + "\n```")
    assert gc.kernel_figures(tmp_path / "missing.json") == (None, [])


# ---- the other benchmark scripts ----------------------------------------------------------------------------
def test_kernel_bench_host_tiny(tmp_path):
    _needs_kernels()
    r = _run([str(BENCH / "kernel_bench.py"), "--host", "--tiny", "--iters", "2", "--json", str(tmp_path / "k.json")],
             tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cases = json.loads((tmp_path / "k.json").read_text())["cases"]
    assert sorted(cases) == sorted(["inside", "inside_cols", "periodic_halo", "periodic_halo_full", "periodic_halo_4",
                                    "rows_halo_u8", "normalise_f16"])
    assert all(c["fraction_of_copy"] > 0 for c in cases.values())
    assert cases["periodic_halo"]["window"].startswith("start [0, 5, -2] shape [2, 8, 44]")  # rank 1 of 4, 21 rows


def test_kernel_bench_without_a_gpu_exits_with_a_clear_message(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _run([str(BENCH / "kernel_bench.py"), "--tiny"], tmp_path)
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr and "--host" in r.stderr


def test_read_bench_tiny(tmp_path):
    pytest.importorskip("nvidia.dali")
    r = _run([str(BENCH / "read_bench.py"), "--tiny", "--dir", str(tmp_path / "d"), "--out", str(tmp_path / "r.md")],
             tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "r.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 6 and any("dali_mesh read_npy_window" in row for row in rows)


def test_e2e_bench_tiny(tmp_path):
    pytest.importorskip("nvidia.dali")
    r = _run([str(BENCH / "e2e_bench.py"), "--tiny", "--dir", str(tmp_path / "d")], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| ")}
    assert {"native", "window", "full", "dali"} <= set(rows)


def test_physicsnemo_era5_bench_tiny(tmp_path):
    _needs_plugin()
    pytest.importorskip("physicsnemo.distributed", reason="PhysicsNeMo is not installed (make test installs it)")
    r = _run([str(BENCH / "physicsnemo_era5_bench.py"), "--tiny", "--dir", str(tmp_path / "d")], tmp_path,
             timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| 1 |")]
    assert [row[2].strip() for row in rows] == ["PhysicsNeMo ERA5HDF5Datapipe", "dali_mesh drop-in, rank 1 of 4",
                                                 "dali_mesh drop-in, rank 3 of 4"]
    assert all(row[3].strip() == "8" for row in rows), rows  # 2 years x (5 - 1) samples, whole batches


def test_dataset_bench_tiny(tmp_path):
    _needs_plugin()
    pytest.importorskip("xarray")
    r = _run([str(BENCH / "dataset_bench.py"), "--tiny", "--dir", str(tmp_path / "d")], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| whole") or line.startswith("| band")]
    assert [row[2].strip() for row in rows] == ["xarray", "xarray band", "xarray band + norm", "dali_mesh",
                                                "dali_mesh per variable", "dali_mesh + norm",
                                                "dali_mesh per variable + norm"] * 2, r.stdout


def test_share_bench_tiny(tmp_path):
    _needs_plugin()
    pytest.importorskip("torch")
    r = _run([str(BENCH / "share_bench.py"), "--tiny", "--dir", str(tmp_path / "d")], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| independent") or
            line.startswith("| group")]
    assert [row[1].strip() for row in rows] == ["independent"] * 2 + ["group"] * 2, r.stdout
    assert all(row[7].strip().startswith("shm:") for row in rows[2:]), r.stdout  # two local ranks: shared memory
    assert "group epoch / independent epoch" in r.stdout, r.stdout


def test_share_bench_remote_tiny(tmp_path):
    """The group over S3 (the benchmarks' S3 server on 127.0.0.1): each of 2 ranks fetches half the stored
    bytes, counted by its own fetch counters; independent reading and tensorstore's ranks all of them."""
    _needs_plugin()
    pytest.importorskip("torch")
    pytest.importorskip("moto")
    pytest.importorskip("tensorstore")
    r = _run([str(BENCH / "share_bench.py"), "--tiny", "--remote", "0.005", "--dir", str(tmp_path / "d")], tmp_path,
             timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith(("| independent", "| group", "| tensorstore"))]
    fetched = {(row[0].split()[0], row[1]): float(row[2]) for row in rows}
    assert fetched == {("independent", "0"): 1.0, ("independent", "1"): 1.0, ("group", "0"): 0.5,
                       ("group", "1"): 0.5, ("tensorstore", "0"): 1.0}, r.stdout
    assert "group epoch / tensorstore's epoch" in r.stdout, r.stdout


def test_region_bench_quick(tmp_path):
    r = _run([str(BENCH / "region_bench.py"), "--quick"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[-3] for line in r.stdout.splitlines()[1:]] == ["8", "1024", "262144", "1048576", "1048576"]


def test_icechunk_local_reads_counts_the_disk(tmp_path):
    """Its table's columns are the disk's bytes for reads of an evicted range: at least the range in both
    (the page cache held none of it), and not much more for the plain pread."""
    pytest.importorskip("icechunk")
    r = _run([str(BENCH / "icechunk_local_reads.py"), "--folder", str(tmp_path)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| ") and "range" not in line]
    assert len(rows) == 4, r.stdout
    if all(int(row[3].split()[0]) == 0 for row in rows):
        pytest.skip(f"{tmp_path}'s reads do not reach the disk's count (/proc/self/io): a file system in memory")
    for n, _, library, plain in rows:
        n, library, plain = int(n), int(library.split()[0]), int(plain.split()[0])
        assert n <= plain <= n + (64 << 10), r.stdout
        assert n <= library, r.stdout


def test_gpu_check_main_skips_what_a_failed_build_would_feed(tmp_path, monkeypatch, capsys):
    """The whole run on fake steps: a failed build skips the steps that need it, others still run,
    the step marked last runs last, and the exit status says something failed."""
    gc = _module("gpu_check")
    py = sys.executable

    def fake_plan(info, setting, out, jobs):
        return [gc.Step("sanitizer", "runs last", [py, "-c", "pass"], 30, last=True),
                gc.Step("build-kernels", "fails", [py, "-c", "raise SystemExit(3)"], 30),
                gc.Step("build-plugin", "works", [py, "-c", "pass"], 30),
                gc.Step("gpu-tests", "needs kernels", [py, "-c", "pass"], 30, needs=("build-kernels",)),
                gc.Step("dali-tests", "needs the plugin", [py, "-c", "pass"], 30, needs=("build-plugin",))]

    monkeypatch.setattr(gc, "detect", lambda python: _fake_info(python_path=python))
    monkeypatch.setattr(gc, "plan", fake_plan)
    assert gc.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == LAST_LINE.format(p=3, f=1, s=1, k="n/a", r="n/a")
    steps = json.loads((tmp_path / "results.json").read_text())["steps"]
    assert [(r["name"], r["status"]) for r in steps] == [
        ("build-kernels", "failed"), ("build-plugin", "passed"), ("gpu-tests", "skipped"),
        ("dali-tests", "passed"), ("sanitizer", "passed")]
    assert steps[0]["detail"] == "exit status 3" and "build-kernels did not pass" in steps[2]["detail"]
    assert "- gpu-tests: not run (build-kernels did not pass)" in (tmp_path / "summary.md").read_text()


def test_plan_scale_bench_tiny(tmp_path):
    _needs_plugin()
    r = _run([str(BENCH / "plan_scale_bench.py"), "--rows", "65536"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| last") or line.startswith("| rows")]
    assert len(rows) == 2, r.stdout
    # one cell of each of 65536 rows: one repeated unit of 65536 runs, a plan of under 1 KiB
    assert rows[0][4].strip() == "1 (65536)" and int(rows[0][3]) < 1024, r.stdout


# ---- pread_bench.py ----------------------------------------------------------------------------------------
def test_pread_bench_tiny_reports_every_distance(tmp_path):
    mod = _module("pread_bench")
    r = _run([str(BENCH / "pread_bench.py"), "--mib", "1", "--runs", "1", "--dir", str(tmp_path)], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.strip("|").split("|") for line in r.stdout.splitlines()
            if line.startswith("| ") and "GB/s" not in line]
    assert [int(d) for d, _ in rows] == list(mod.DISTANCES), r.stdout
    assert all(float(g) > 0 for _, g in rows), r.stdout
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # its file is gone


def test_remote_bench_quick(tmp_path):
    """The remote benchmark's CI-size run: its parallel S3 server (benchmarks/s3_server.py) on 127.0.0.1
    with 20 ms per request, every reader's windows checked against numpy, the native reader fetching at
    most what tensorstore does."""
    _needs_plugin()
    pytest.importorskip("tensorstore")
    readers = {"native", "native_sync", "tensorstore", "tensorstore_ahead"}
    r = _run([str(BENCH / "remote_bench.py"), "--quick", "--readers", ",".join(sorted(readers))], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("| 20 ms, unlimited |")]
    assert {row[2] for row in rows} == readers, r.stdout
    for store in {row[1] for row in rows}:
        fetched = {row[2]: float(row[4].rstrip("x")) for row in rows if row[1] == store}
        assert fetched["native"] <= fetched["tensorstore"] + 0.02, (store, fetched)
        # reading ahead fetches nothing more (a chunk read in parts may start from another guess)
        assert abs(fetched["native"] - fetched["native_sync"]) <= 0.02, (store, fetched)


def test_remote_bench_bandwidth_costs_size_over_rate(tmp_path):
    """``--mbps``: at 2 MB/s per connection a reader that reads one step at a time (one request per step,
    one after another) takes longer than on the unlimited link by about its fetched bytes / 2 MB/s, and
    the link column names the bandwidth."""
    pytest.importorskip("tensorstore")
    rate = 2.0
    r = _run([str(BENCH / "remote_bench.py"), "--quick", "--mbps", f"0,{rate:g}", "--readers", "tensorstore",
              "--stores", "blosc_globe", "--no-cache"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = next([c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("| link |"))
    rows = {row[0]: dict(zip(head, row)) for row in ([c.strip() for c in line.split("|")[1:-1]] for line in lines
                                                     if line.startswith("| 20 ms"))}
    assert sorted(rows) == ["20 ms, 2 MB/s", "20 ms, unlimited"], r.stdout
    limited, unlimited = rows["20 ms, 2 MB/s"], rows["20 ms, unlimited"]
    fetched_mb = float(limited["stored MB (steps read)"]) * float(limited["fetched / stored"].rstrip("x"))
    extra = float(limited["epoch s"]) - float(unlimited["epoch s"])
    want = fetched_mb / rate
    assert want > 0.2, r.stdout  # large enough to be told from the noise
    assert 0.8 * want <= extra <= 1.5 * want + 0.05, (extra, want, r.stdout)
    # the open to the first batch holds the open and at least the first step's round trip
    for row in rows.values():
        assert float(row["open to 1st batch s"]) >= float(row["open s"]) + 0.02, row


def test_s3_server_shared_link_carries_every_connections_bytes_in_turn():
    """``shared_mbps``: one link for every connection together. Four connections fetching 1 MB each at
    once over a shared 8 MB/s link take about 4 MB / 8 MB/s (0.5 s), where a link of 8 MB/s per
    connection lets them take about 1 MB / 8 MB/s each, side by side; small bodies (one slice) cross
    the shared link too."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.s3_server import S3Server

    def fetch_all(server, size, clients=4):
        def one(i):
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            c.request("GET", "/bench/obj", headers={"Range": f"bytes=0-{size - 1}"})
            body = c.getresponse().read()
            c.close()
            return len(body)

        with ThreadPoolExecutor(clients) as pool:
            t0 = time.perf_counter()
            got = list(pool.map(one, range(clients)))
            return time.perf_counter() - t0, got

    with S3Server(buckets=["bench"]) as server:
        server.put("bench", "obj", os.urandom(1 << 20))
        server.configure(shared_mbps=8)
        shared, got = fetch_all(server, 1 << 20)
        assert got == [1 << 20] * 4
        server.configure(shared_mbps=0, mbps=8)
        per_connection, _ = fetch_all(server, 1 << 20)
        server.configure(mbps=0, shared_mbps=0.5)
        small, got = fetch_all(server, 32 << 10)  # 4 x 32 KiB at 0.5 MB/s: 0.26 s
        assert got == [32 << 10] * 4
    want = 4 * (1 << 20) / 8e6
    assert 0.9 * want <= shared <= 2.5 * want, (shared, want)
    assert per_connection < 0.75 * shared, (per_connection, shared)
    assert small >= 0.9 * 4 * (32 << 10) / 0.5e6, small


def test_graph_bench_quick(tmp_path):
    """The graph benchmark's CI-size run (issue 55): every rank's ``src`` and ``local_src`` rows of both
    data orders (random, Hilbert-renumbered) and both formats (.npy, Zarr Blosc) read natively and by the
    PhysicsNeMo path, each checked against numpy inside the script; the renumbered data's ``src`` rows
    read fewer bytes from storage than the random order's."""
    _needs_plugin()
    pytest.importorskip("torch")
    pytest.importorskip("zarr")
    r = _run([str(BENCH / "graph_bench.py"), "--quick", "--dir", str(tmp_path / "data")], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = next([c.strip() for c in line.split("|")[1:-1]] for line in lines
                if line.startswith("| order | format | what | rank |"))
    rows = [dict(zip(head, [c.strip() for c in line.split("|")[1:-1]])) for line in lines
            if line.startswith(("| random |", "| hilbert |")) and line.count("|") == len(head) + 1]
    assert {(row["order"], row["format"]) for row in rows} == {(o, f) for o in ("random", "hilbert")
                                                              for f in ("npy", "zarr_blosc")}, r.stdout
    assert {(row["what"], row["rank"]) for row in rows} == {(w, str(k)) for w in ("src", "local_src")
                                                           for k in range(4)}, r.stdout
    for fmt in ("npy", "zarr_blosc"):
        got = {o: [float(row["native bytes / stored"].rstrip("x")) for row in rows
                   if (row["order"], row["format"], row["what"]) == (o, fmt, "src")] for o in ("random", "hilbert")}
        assert len(got["random"]) == len(got["hilbert"]) == 4, r.stdout
        if fmt == "npy":  # page-sized reads: every rank reads less
            assert all(h < rnd for h, rnd in zip(got["hilbert"], got["random"])), (fmt, got)
        # a Zarr chunk of the CI size holds few 64 KiB Blosc blocks: over the ranks
        assert sum(got["hilbert"]) < sum(got["random"]), (fmt, got)
    assert "| native |" in r.stdout and "requests per chunk" in r.stdout, r.stdout  # the S3 table


def test_graph_bench_removes_only_what_it_wrote(tmp_path):
    """graph_bench's --dir: a folder of the benchmark's names that it did not write (no meta.json of its
    own), or a link, is refused and left as it is."""
    (tmp_path / "data" / "hilbert_npy").mkdir(parents=True)
    (tmp_path / "data" / "hilbert_npy" / "mine.txt").write_text("keep")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "data" / "random_npy")
    r = _run([str(BENCH / "graph_bench.py"), "--quick", "--dir", str(tmp_path / "data")], tmp_path, timeout=300)
    assert r.returncode != 0 and "was not written by this benchmark" in r.stderr, r.stdout + r.stderr
    assert (tmp_path / "data" / "hilbert_npy" / "mine.txt").read_text() == "keep"
    assert os.path.islink(tmp_path / "data" / "random_npy") and (tmp_path / "elsewhere").is_dir()
