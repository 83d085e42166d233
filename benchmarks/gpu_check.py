"""The GPU check: one command that settles, on a machine with an NVIDIA GPU, what a GPU can settle.

    make gpu-check                      # = $(PYTHON) benchmarks/gpu_check.py
    python3 benchmarks/gpu_check.py [--dry-run] [--setting auto|kernels|dali] [--budget 460]

It uses the Python that runs it (``PYTHON=... make gpu-check`` chooses) and installs nothing from a
package index. Two settings, detected:

* ``kernels`` (a GPU, torch with CUDA and/or cupy, the CUDA toolkit, numpy, pytest; no DALI):
  builds the DALI-free kernels library for the local GPU (``make kernels DALI_MESH_CUDA_ARCHS=native``,
  or CMake with ``-DDALI_MESH_KERNELS_ONLY=ON`` where the Makefile has no such target), runs
  ``tests/gpu`` (every test should run: a skip is a finding), the stress tests, a subset under
  ``compute-sanitizer --tool memcheck`` when it is installed, and ``benchmarks/kernel_bench.py``;
* ``dali`` (DALI importable as well): builds the plugin instead
  (``pip install --no-index --no-build-isolation --no-deps -e .`` with ``DALI_MESH_CUDA_ARCHS=native``)
  and also runs ``tests/gpu/test_gpu_dali.py``, ``dali-mesh demo`` on one GPU (1 rank: NCCL; 2 ranks
  sharing the GPU: the backend the demo picks is recorded) and ``benchmarks/gpu_bench.py``.

Every step has a time bound, and the whole check a budget (``--budget`` seconds, default 460: under
8 minutes on one H200). Output in ``$GPU_CHECK_OUT`` (default ``build/gpu-check/``): ``log`` (every
command and its output), ``results.json``, ``summary.md``. The last line printed is

    gpu-check: N passed, M failed, K skipped; kernel X% of D2D copy; dali_mesh read_windows Y samples/s into GPU memory

(tests count one each, other steps one each; "n/a" where a part could not run). Exit status: 0 when
nothing failed, 1 when something failed, 2 when there is no GPU to check.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: seconds for the whole check: under 8 minutes on one H200 (issue 8); each step has its own bound too
DEFAULT_BUDGET = 460
DEFAULT_OUT = ROOT / "build" / "gpu-check"
#: kernel_bench case -> target fraction of device-to-device copy bandwidth (issue 8)
KERNEL_TARGETS = {"inside": 0.85, "periodic_halo": 0.75, "normalise_f16": 0.70, "rows_halo_u8": 0.85,
                  "periodic_halo_4": 0.75}
#: the kernel fraction and the loader rate of the last line
HEADLINE_KERNEL_CASE = "inside"
HEADLINE_LOADER = "dali_mesh read_windows"
SETTING_WORDS = {"dali": "GPU + DALI", "kernels": "GPU, no DALI", "none": "no GPU"}
MEMCHECK_TESTS = ("tests/gpu/test_gpu_kernels.py", "tests/gpu/test_gpu_stress.py")
MEMCHECK_SELECT = ("vector_paths or domain_box or normalise_and_cast or mixed_vector_widths or two_streams "
                   "or misaligned")

PROBE = r"""
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import numpy; info["numpy"] = numpy.__version__
except Exception as e: info["numpy_error"] = repr(e)
try:
    import pytest; info["pytest"] = pytest.__version__
except Exception as e: info["pytest_error"] = repr(e)
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["gpus"] = torch.cuda.device_count()
        info["gpu_name"] = torch.cuda.get_device_name(0)
except Exception as e: info["torch_error"] = repr(e)
try:
    import cupy
    info["cupy"] = cupy.__version__
    n = cupy.cuda.runtime.getDeviceCount()
    if n and "gpus" not in info:
        info["gpus"] = n
        info["gpu_name"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
except Exception as e: info["cupy_error"] = repr(e).splitlines()[0][:200]
try:
    import nvidia.dali as dali
    info["dali"] = dali.__version__
    from importlib import metadata
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-dali-cuda"):
            info["dali_wheel"] = name  # e.g. nvidia-dali-cuda130: the CUDA major DALI was built for
except Exception as e: info["dali_error"] = repr(e).splitlines()[0][:200]
print(json.dumps(info))
"""


# ---- detecting the machine ------------------------------------------------------------------------------
def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / name).is_file():
            return str(Path(base) / "bin" / name)
    return None


def _output(cmd: list[str], timeout: float = 30) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def detect(python: str) -> dict:
    """What this machine has: the Python's packages (probed in a child, so this process never
    initialises CUDA), the GPU and driver, and the CUDA tools."""
    info: dict = {"python_path": python, "cpus": os.cpu_count()}
    try:
        probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
        info.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        info["probe_error"] = f"{python} could not be probed: {e}"
    tools = {t: _which(t) for t in ("nvcc", "compute-sanitizer", "cmake", "make", "nvidia-smi")}
    info["tools"] = tools
    if tools["nvidia-smi"]:
        smi = _output([tools["nvidia-smi"], "--query-gpu=name,driver_version,memory.total",
                       "--format=csv,noheader"])
        if smi:
            name, driver, memory = (s.strip() for s in (smi.splitlines()[0].split(",") + ["", ""])[:3])
            info.update(smi_gpu=name, driver=driver, gpu_memory=memory)
    if tools["nvcc"]:
        m = re.search(r"release ([0-9.]+)", _output([tools["nvcc"], "--version"]))
        info["nvcc"] = m.group(1) if m else "unknown"
    makefile = ROOT / "Makefile"
    info["make_kernels_target"] = makefile.exists() and re.search(r"^kernels:", makefile.read_text(), re.M) is not None
    return info


def setting_of(info: dict) -> str:
    """``dali``, ``kernels`` or ``none`` (no GPU visible to torch or cupy)."""
    if not info.get("gpus"):
        return "none"
    return "dali" if info.get("dali") else "kernels"


# ---- the plan ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Step:
    name: str
    what: str
    cmd: list[str] | None  # None: not run (``reason`` says why)
    timeout: float
    env: dict = dataclasses.field(default_factory=dict)
    junit: str | None = None  # a pytest step: its JUnit XML file
    cwd: str | None = None
    reason: str = ""
    last: bool = False  # runs with whatever budget is left, after the rest
    needs: tuple = ()  # steps (builds) that must have passed


def _pytest(python: str, out: Path, name: str, targets: list[str], extra: list[str] = ()) -> tuple[list[str], str]:
    junit = str(out / f"junit-{name}.xml")
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}",
            *targets, *extra], junit


def plan(info: dict, setting: str, out: Path, jobs: int) -> list[Step]:
    py = info["python_path"]
    tools = info["tools"]
    build_env = {"DALI_MESH_CUDA": "1", "DALI_MESH_CUDA_ARCHS": "native", "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    if tools.get("nvcc") and not shutil.which("nvcc"):
        build_env["CUDACXX"] = tools["nvcc"]  # found under CUDA_HOME, not on PATH
    steps: list[Step] = []
    dali = setting == "dali"
    # the DALI-free library first, in both settings: its checks do not depend on the plugin's build
    if info.get("make_kernels_target"):
        steps.append(Step("build-kernels", "the DALI-free kernels library for the local GPU (make kernels)",
                          [tools.get("make") or "make", "kernels", "DALI_MESH_CUDA=1", "DALI_MESH_CUDA_ARCHS=native"],
                          240, build_env))
    else:
        cmake = tools.get("cmake") or "cmake"
        bdir = out / "kernels-build"
        script = (f"{shlex.quote(cmake)} -S . -B {shlex.quote(str(bdir))} -DCMAKE_BUILD_TYPE=Release "
                  "-DDALI_MESH_KERNELS_ONLY=ON -DDALI_MESH_CUDA=ON -DDALI_MESH_CUDA_ARCHS=native "
                  f"-DCMAKE_CUDA_ARCHITECTURES=native && {shlex.quote(cmake)} --build {shlex.quote(str(bdir))} "
                  f"--target dali_mesh_kernels -j {jobs} && cp {shlex.quote(str(bdir))}/libdali_mesh_kernels.so "
                  "dali_mesh/libdali_mesh_kernels.so")
        steps.append(Step("build-kernels", "the DALI-free kernels library for the local GPU (CMake, "
                          "the Makefile has no kernels target)", ["bash", "-c", script], 240, build_env))
    if dali:
        steps.append(Step("build-plugin", "the DALI plugin (and the kernels library again) for the local GPU",
                          [py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", "-e", "."],
                          300, build_env))
    kernel_needs = ("build-kernels",)
    dali_needs = ("build-plugin",)
    cmd, junit = _pytest(py, out, "gpu", ["tests/gpu"], ["--ignore=tests/gpu/test_gpu_stress.py",
                                                         "--ignore=tests/gpu/test_gpu_dali.py"])
    steps.append(Step("gpu-tests", "tests/gpu: the CUDA kernel against numpy and its host emulation", cmd, 180,
                      junit=junit, needs=kernel_needs))
    cmd, junit = _pytest(py, out, "stress", ["tests/gpu/test_gpu_stress.py"])
    steps.append(Step("stress", "two streams without a sync, a misaligned sample, > 2**32-byte samples", cmd, 180,
                      junit=junit, needs=kernel_needs))
    if info.get("torch"):
        steps.append(Step("kernel-bench", "the kernel alone vs device-to-device copy",
                          [py, "benchmarks/kernel_bench.py", "--json", str(out / "kernel_bench.json")], 150,
                          needs=kernel_needs))
        if info.get("make_kernels_target"):
            # the same kernels bounded to 4 blocks per SM (they spill: slice_gpu.cu), timed beside them
            mb4 = out / "kernels-minblocks4"
            steps.append(Step("build-kernels-minblocks4", "the kernels library again, bounded to 4 blocks per SM",
                              [tools.get("make") or "make", "kernels", "DALI_MESH_CUDA=1", "DALI_MESH_CUDA_ARCHS=native",
                               "DALI_MESH_MIN_BLOCKS_PER_SM=4", f"KERNELS_BUILD={mb4 / 'build'}", f"KERNELS_DEST={mb4}"],
                              240, build_env))
            steps.append(Step("kernel-bench-minblocks4", "the kernel bounded to 4 blocks per SM vs D2D copy",
                              [py, "benchmarks/kernel_bench.py", "--json", str(out / "kernel_bench_minblocks4.json")],
                              150, {"DALI_MESH_KERNELS_LIB": str(mb4 / "libdali_mesh_kernels.so")},
                              needs=("build-kernels-minblocks4",)))
    else:
        steps.append(Step("kernel-bench", "the kernel alone vs device-to-device copy", None, 0,
                          reason=f"benchmarks/kernel_bench.py times with torch, which {py} cannot import"))
    dali_steps = [
        ("dali-tests", "tests/gpu/test_gpu_dali.py: the GPU operators, sources, decoder and loader in DALI"),
        ("demo-1rank", "dali-mesh demo, 1 rank on the GPU"),
        ("demo-2ranks", "dali-mesh demo, 2 ranks sharing one GPU"),
        ("gpu-bench", "benchmarks/gpu_bench.py: samples/s into GPU memory"),
    ]
    if dali:
        cmd, junit = _pytest(py, out, "dali", ["tests/gpu/test_gpu_dali.py"])
        steps.append(Step(dali_steps[0][0], dali_steps[0][1], cmd, 240, junit=junit, needs=dali_needs))
        demo = [py, "-m", "dali_mesh.cli", "demo", "--samples", "16", "--timeout", "100"]
        steps.append(Step(dali_steps[1][0], dali_steps[1][1], demo + ["--nproc", "1", "--mesh", "model_parallel=1",
                                                                        "--shard", "model_parallel=1"],
                          120, cwd=str(out), needs=dali_needs))
        steps.append(Step(dali_steps[2][0], dali_steps[2][1], demo + ["--nproc", "2", "--mesh", "model_parallel=2",
                                                                        "--shard", "model_parallel=1"],
                          120, cwd=str(out), needs=dali_needs))
        steps.append(Step(dali_steps[3][0], dali_steps[3][1],
                          [py, "benchmarks/gpu_bench.py", "--runs", "3", "--dir", str(out / "gpu_bench_data"),
                           "--out", str(out / "gpu_bench.md"), "--json", str(out / "gpu_bench.json")], 240,
                          needs=dali_needs))
    else:
        why = f"DALI is not importable by {py} ({info.get('dali_error', 'not installed')})"
        steps += [Step(n, w, None, 0, reason=why) for n, w in dali_steps]
    sanitizer = tools.get("compute-sanitizer")
    if sanitizer:
        cmd, junit = _pytest(py, out, "memcheck", list(MEMCHECK_TESTS), ["-k", MEMCHECK_SELECT])
        steps.append(Step("memcheck", "a subset of tests/gpu under compute-sanitizer --tool memcheck",
                          [sanitizer, "--tool", "memcheck", "--error-exitcode", "97", "--print-limit", "20", *cmd],
                          240, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, junit=junit, last=True,
                          needs=kernel_needs))
    else:
        steps.append(Step("memcheck", "a subset of tests/gpu under compute-sanitizer --tool memcheck", None, 0,
                          reason="compute-sanitizer is not installed (CUDA_HOME/bin or PATH)", last=True))
    return steps


# ---- running ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    name: str
    what: str
    status: str  # passed | failed | skipped
    seconds: float = 0.0
    command: str = ""
    detail: str = ""
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failed_tests: list = dataclasses.field(default_factory=list)
    skipped_tests: list = dataclasses.field(default_factory=list)


def parse_junit(path: str) -> dict:
    """Counts and names of failed and skipped tests from a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    out = {"passed": 0, "failed": 0, "skipped": 0, "failed_tests": [], "skipped_tests": []}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out["failed"] += 1
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            message = (bad.get("message") or "").splitlines()
            out["failed_tests"].append(f"{name}: {message[0][:300] if message else ''}")
        elif case.find("skipped") is not None:
            out["skipped"] += 1
            out["skipped_tests"].append(f"{name}: {(case.find('skipped').get('message') or '')[:300]}")
        else:
            out["passed"] += 1
    return out


def run_step(step: Step, log, budget_left: float) -> Result:
    res = Result(step.name, step.what, "skipped", command="" if step.cmd is None else shlex.join(step.cmd))
    if step.cmd is None:
        res.detail, res.skipped = step.reason, 1
        return res
    if budget_left < min(20, step.timeout):
        res.detail, res.skipped = f"only {budget_left:.0f} s of the check's budget left", 1
        return res
    timeout = min(step.timeout, budget_left)
    env = dict(os.environ, **step.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if step.junit and os.path.exists(step.junit):
        os.remove(step.junit)
    log.write(f"\n===== {step.name}: {step.what}\n$ {res.command}\n  (cwd {step.cwd or ROOT}, timeout {timeout:.0f} s, "
              f"env {' '.join(f'{k}={v}' for k, v in step.env.items())})\n")
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.Popen(step.cmd, cwd=step.cwd or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the step's whole process group (DALI workers, ranks)
        rc = proc.wait()
    res.seconds = time.monotonic() - t0
    log.write(f"----- {step.name}: exit {rc}{' (timed out)' if timed_out else ''} after {res.seconds:.1f} s\n")
    log.flush()
    counts = None
    if step.junit and os.path.exists(step.junit):
        try:
            counts = parse_junit(step.junit)
        except ET.ParseError as e:
            res.detail = f"unreadable {step.junit}: {e}"
    if counts is not None:
        for k, v in counts.items():
            setattr(res, k, v)
    if timed_out:
        res.status = "failed"
        res.detail = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        res.status = "failed"
        res.detail = res.detail or f"exit status {rc}" + (" (compute-sanitizer found errors)" if rc == 97 else "")
    else:
        res.status = "passed"
    if counts is None or (res.status == "failed" and res.failed == 0):
        # a build, a benchmark, or a test run that died before reporting: the step counts once
        res.passed += res.status == "passed"
        res.failed += res.status == "failed"
    return res


def step_output(log_path: Path, name: str) -> str:
    """The logged output of one step (to parse the demo's backend line)."""
    text = log_path.read_text(errors="replace")
    m = re.search(rf"^===== {re.escape(name)}:.*?$(.*?)^----- {re.escape(name)}:", text, re.S | re.M)
    return m.group(1) if m else ""


# ---- summarising ------------------------------------------------------------------------------------------
def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _cuda_match(info: dict) -> str:
    """Whether the DALI wheel's CUDA major is the toolkit's (the plugin's GPU code needs the driver
    of the toolkit it was built with)."""
    m = re.search(r"cuda(\d+?)0$", info.get("dali_wheel", ""))
    if not m or not info.get("nvcc"):
        return "CUDA majors not compared"
    same = m.group(1) == info["nvcc"].split(".")[0]
    return (f"CUDA {m.group(1)} as the toolkit's {info['nvcc']}" if same else
            f"CUDA {m.group(1)}, toolkit {info['nvcc']}: the plugin's GPU code needs the toolkit's driver")


def last_line(totals: dict, kernel_fraction, loader_rate) -> str:
    rate = "n/a" if loader_rate is None else f"{loader_rate:.1f}"
    return (f"gpu-check: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped; "
            f"kernel {_pct(kernel_fraction)} of D2D copy; {HEADLINE_LOADER} {rate} samples/s into GPU memory")


def totals_of(results: list[Result]) -> dict:
    return {k: sum(getattr(r, k) for r in results) for k in ("passed", "failed", "skipped")}


def kernel_figures(path: Path) -> tuple[float | None, list[dict]]:
    """(the headline fraction, one row per case with its target) from kernel_bench's JSON."""
    if not path.exists():
        return None, []
    cases = json.loads(path.read_text()).get("cases", {})
    rows = []
    for name, c in cases.items():
        target = KERNEL_TARGETS.get(name)
        rows.append({"case": name, "window": c.get("window", ""), "GBps": c.get("kernel_GBps"),
                     "copy_GBps": c.get("d2d_copy_GBps"), "fraction": c.get("fraction_of_copy"), "target": target,
                     "met": None if target is None or c.get("fraction_of_copy") is None
                     else c["fraction_of_copy"] >= target})
    head = cases.get(HEADLINE_KERNEL_CASE, {}).get("fraction_of_copy")
    return head, rows


def loader_figure(path: Path) -> tuple[float | None, str]:
    """(warm samples/s of dali_mesh's loader on the first shape, gpu_bench's markdown)."""
    if not path.exists():
        return None, ""
    data = json.loads(path.read_text())
    return data.get("headline_samples_per_s"), data.get("markdown", "")


def summary_markdown(info: dict, setting: str, results: list[Result], kernel_rows: list[dict], bench_md: str,
                     demo_backends: dict, line: str, command: str) -> str:
    gpu = info.get("smi_gpu") or info.get("gpu_name") or "no GPU"
    lines = [
        "# GPU check", "",
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"- GPU: {gpu}, driver {info.get('driver', '?')}, {info.get('gpu_memory', '?')}; {info.get('cpus')} CPUs",
        f"- CUDA toolkit (nvcc) {info.get('nvcc', 'none')}; torch {info.get('torch', 'none')} (CUDA "
        f"{info.get('torch_cuda', '-')}), cupy {info.get('cupy', 'none')}, DALI {info.get('dali', 'none')}, "
        f"numpy {info.get('numpy', '?')}, Python {info.get('python', '?')} ({info.get('python_path')})",
        f"- DALI wheel {info.get('dali_wheel', '-')}: {_cuda_match(info)}",
        f"- setting: **{setting}** ({SETTING_WORDS[setting]})",
    ]
    if info.get("no_gpu"):
        lines.append(f"- {info['no_gpu']}: nothing ran")
    lines += [
        "", "| step | result | tests passed / failed / skipped | seconds | notes |", "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.passed} / {r.failed} / {r.skipped} | {r.seconds:.0f} | "
                     f"{r.detail or r.what} |")
    findings = [f"- {r.name}: FAILED {t}" for r in results for t in r.failed_tests]
    findings += [f"- {r.name}: failed ({r.detail})" for r in results if r.status == "failed" and not r.failed_tests]
    findings += [f"- {r.name}: skipped test {t}" for r in results for t in r.skipped_tests]
    findings += [f"- {r.name}: not run ({r.detail})" for r in results if r.status == "skipped"]
    findings += [f"- kernel {k['case']}: {_pct(k['fraction'])} of D2D copy, target {_pct(k['target'])}: MISSED"
                 for k in kernel_rows if k["met"] is False]
    lines += ["", "## Findings", ""] + (findings or ["- none: every step ran and passed"])
    if kernel_rows:
        lines += ["", "## Kernel vs device-to-device copy (`benchmarks/kernel_bench.py`)", "",
                  "| case | window | kernel GB/s | D2D copy GB/s | fraction | target | fraction, 4 blocks/SM |",
                  "|---|---|---|---|---|---|---|"]
        for k in kernel_rows:
            met = "" if k["met"] is None else (" met" if k["met"] else " **missed**")
            gbs = "-" if k["GBps"] is None else f"{k['GBps']:.0f}"
            cgbs = "-" if k["copy_GBps"] is None else f"{k['copy_GBps']:.0f}"
            lines.append(f"| {k['case']} | {k['window']} | {gbs} | {cgbs} | {_pct(k['fraction'])} | "
                         f"{_pct(k['target']) if k['target'] else '-'}{met} | {_pct(k.get('fraction_minblocks4'))} |")
    if demo_backends:
        lines += ["", "## dali-mesh demo on one GPU", ""]
        lines += [f"- {name}: {text}" for name, text in demo_backends.items()]
    if bench_md:
        lines += ["", "## GPU throughput (`benchmarks/gpu_bench.py`)", "", bench_md.strip()]
    lines += ["", "```", line, "```", ""]
    return "\n".join(lines)


def print_plan(info: dict, setting: str, steps: list[Step], out: Path, budget: float) -> None:
    print(f"gpu-check plan: setting {setting}; output {out}; budget {budget:.0f} s; Python {info['python_path']}")
    print(f"  GPU: {info.get('smi_gpu') or info.get('gpu_name') or 'none visible to torch or cupy'}; "
          f"torch {info.get('torch', 'no')}, cupy {info.get('cupy', 'no')}, DALI {info.get('dali', 'no')}; "
          f"nvcc {info['tools'].get('nvcc') or 'no'}, "
          f"compute-sanitizer {info['tools'].get('compute-sanitizer') or 'no'}")
    for s in steps:
        if s.cmd is None:
            print(f"  - {s.name}: not run ({s.reason})")
        else:
            env = " ".join(f"{k}={v}" for k, v in s.env.items())
            print(f"  - {s.name} (<= {s.timeout:.0f} s): {(env + ' ') if env else ''}{shlex.join(s.cmd)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="detect the setting, print the plan, run nothing")
    ap.add_argument("--setting", choices=("auto", "kernels", "dali"), default="auto",
                    help="plan for this setting instead of the detected one")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                    help=f"seconds for the whole check (default {DEFAULT_BUDGET})")
    ap.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT") or str(DEFAULT_OUT),
                    help="output folder (default $GPU_CHECK_OUT or build/gpu-check)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    given = argv if argv is not None else sys.argv[1:]
    command = shlex.join([Path(sys.executable).name, "benchmarks/gpu_check.py", *given])
    info = detect(sys.executable)
    detected = setting_of(info)
    setting = detected if args.setting == "auto" else args.setting
    steps = plan(info, ("dali" if info.get("dali") else "kernels") if setting == "none" else setting, out, args.jobs)
    if args.dry_run:
        print_plan(info, setting, steps, out, args.budget)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log"
    results: list[Result] = []
    if detected == "none" and args.setting == "auto":
        torch = info.get("torch", info.get("torch_error", "missing"))
        why = (f"no CUDA GPU visible to {sys.executable} (torch: {torch}; "
               f"cupy: {info.get('cupy', info.get('cupy_error', 'missing'))})")
        print(f"gpu-check: {why}: nothing to check", file=sys.stderr)
        info["no_gpu"] = why
        results = [Result(s.name, s.what, "skipped", detail="no CUDA GPU", skipped=1) for s in steps]
    else:
        t_end = time.monotonic() + args.budget
        for stale in ("kernel_bench.json", "kernel_bench_minblocks4.json", "gpu_bench.json",
                      "gpu_bench.md"):  # never report a past run
            (out / stale).unlink(missing_ok=True)
        with open(log_path, "w") as log:
            log.write(f"{command}\n{json.dumps(info, indent=2)}\n")
            ordered = [s for s in steps if not s.last] + [s for s in steps if s.last]
            status: dict[str, str] = {}
            for s in ordered:
                failed_needs = [n for n in s.needs if status.get(n, "passed") != "passed"]
                if failed_needs and s.cmd is not None:
                    res = Result(s.name, s.what, "skipped", command=shlex.join(s.cmd),
                                 detail=f"{', '.join(failed_needs)} did not pass", skipped=1)
                else:
                    print(f"gpu-check: {s.name} ...", flush=True)
                    res = run_step(s, log, t_end - time.monotonic())
                status[s.name] = res.status
                print(f"gpu-check: {s.name}: {res.status} ({res.passed} passed, {res.failed} failed, "
                      f"{res.skipped} skipped; {res.seconds:.0f} s){' - ' + res.detail if res.detail else ''}",
                      flush=True)
                results.append(res)
    kernel_fraction, kernel_rows = kernel_figures(out / "kernel_bench.json")
    _, kernel_rows_mb4 = kernel_figures(out / "kernel_bench_minblocks4.json")
    for row in kernel_rows:  # the same case, bounded to 4 blocks per SM
        row["fraction_minblocks4"] = next((r["fraction"] for r in kernel_rows_mb4 if r["case"] == row["case"]), None)
    loader_rate, bench_md = loader_figure(out / "gpu_bench.json")
    demo_backends = {}
    for r in results:
        if r.name.startswith("demo") and r.status != "skipped":
            m = re.search(r"^\d+ ranks \(([^)]*)\)", step_output(log_path, r.name), re.M)
            demo_backends[r.name] = f"{r.status}; backend: {m.group(1) if m else 'not reported'}"
    totals = totals_of(results)
    line = last_line(totals, kernel_fraction, loader_rate)
    summary = summary_markdown(info, setting, results, kernel_rows, bench_md, demo_backends, line, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(summary)
    (out / "results.json").write_text(json.dumps({
        "command": command, "setting": setting, "machine": info, "steps": [dataclasses.asdict(r) for r in results],
        "totals": totals, "kernel": {"headline_case": HEADLINE_KERNEL_CASE, "fraction_of_copy": kernel_fraction,
                                     "cases": kernel_rows},
        "loader": {"name": HEADLINE_LOADER, "samples_per_s": loader_rate}, "demo": demo_backends,
        "last_line": line}, indent=2))
    print(f"gpu-check: log, results.json and summary.md in {out}"
          + ("" if detected == "none" else f" (to record the run: cp {out / 'summary.md'} benchmarks/gpu_results.md)"))
    print(line)
    if detected == "none" and args.setting == "auto":
        return 2
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
