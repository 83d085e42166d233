"""Bounded fuzz of the chunk decoder (csrc/codecs/) under AddressSanitizer and
UndefinedBehaviorSanitizer (issue 15, "bad data never becomes data").

Valid chunks of every codec the reader decodes (numcodecs' Blosc with each compressor and shuffle,
Zstd with and without its checksum, LZ4, Zlib, GZip; HDF5 chunks of deflate, LZF or szip with
shuffle and Fletcher-32 as h5py writes them) are mutated a few thousand times with a fixed seed: bit flips, overwritten runs,
truncations, garbage appended, header fields set to extremes, and coders whose decoded size is off
by one or far too large. A harness (tests/io/codec_fuzz_main.cc) built with ``-fsanitize=address,
undefined`` decodes each from a buffer of exactly its size. Every case must end in a decoded chunk
or a reason, never a sanitizer report, a crash or a hang; the unmutated chunks must decode to the
data they were made from (numpy's bytes). The codec libraries themselves are not instrumented
(they are fuzzed upstream, by OSS-Fuzz); the sanitizers check this project's code around them and
every copy it makes.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from tests.helpers import ROOT, codec_rows, codec_sources

numcodecs = pytest.importorskip("numcodecs")
h5py = pytest.importorskip("h5py")

SEED = 20261201
MUTANTS_PER_CHUNK = 60
IDS = {row.name: row.id for row in codec_rows()}  # the codec table's ids (csrc/codecs/codec_table.inc)


def _fnv(data: bytes) -> str:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) % 2**64
    return f"{h:016x}"


def _storage_sources() -> tuple[str, ...]:
    """Every file of csrc/storage/: the stores register themselves (DM_REGISTER_STORE), so a store's
    file is linked in whole and a new one needs no line here."""
    folder = os.path.join(ROOT, "csrc", "storage")
    return tuple(f"csrc/storage/{name}" for name in sorted(os.listdir(folder)) if name.endswith(".cc"))


#: the sanitized harnesses of the fuzz tests: (main, sources, optimisation)
CODEC_HARNESS = ("tests/io/codec_fuzz_main.cc", (*codec_sources(), "csrc/reader/fetch_plan.cc"), "-O1")
PLAN_HARNESS = ("tests/io/plan_fuzz_main.cc", ("csrc/plan/plan_file.cc", "csrc/plan/canonical_json.cc",
                                               "csrc/reader/open_file.cc", "csrc/reader/read_units.cc",
                                               "csrc/reader/tasks.cc", "csrc/reader/finish.cc", "csrc/reader/fetch_plan.cc",
                                               *codec_sources(),
                                               *_storage_sources()), "-O0")
_EARLY: dict = {}  # harness -> (Popen, exe, -D flags): compiles started when the tests were collected


def start_builds(out_dir: str, harnesses) -> None:
    """Start compiling ``harnesses`` into ``out_dir`` now (tests/conftest.py does it at collection, so
    that the compiles run beside the tests before the fuzz tests); :func:`build_sanitized` waits."""
    for h in harnesses:
        made = _sanitized_command(out_dir, *h)
        if made is not None and h not in _EARLY:
            cmd, exe, defs = made
            _EARLY[h] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), exe, defs)


def stop_builds() -> None:
    for proc, _, _ in _EARLY.values():
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    _EARLY.clear()


def build_sanitized(tmp_path, main: str = CODEC_HARNESS[0], sources=CODEC_HARNESS[1],
                    opt: str = CODEC_HARNESS[2]) -> tuple[str, list[str]]:
    """``main`` and the project's ``sources`` built with AddressSanitizer and UBSan (at ``opt``),
    linked with the codec libraries this machine has (the ``-D`` flags say which); a compile started
    early (:func:`start_builds`) is waited for."""
    early = _EARLY.get((main, tuple(sources), opt))
    if early is not None:
        proc, exe, defs = early
        _, stderr = proc.communicate(timeout=300)
        returncode = proc.returncode
    else:
        made = _sanitized_command(str(tmp_path), main, tuple(sources), opt)
        if made is None:
            pytest.skip("no C++ compiler")
        cmd, exe, defs = made
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        stderr, returncode = done.stderr, done.returncode
    if returncode != 0 and "sanitize" in stderr and "cannot find" in stderr:
        pytest.skip(f"the compiler has no sanitizer runtime: {stderr[-300:]}")
    assert returncode == 0, stderr[-3000:]
    return exe, defs


def _sanitized_command(out_dir: str, main: str, sources, opt: str):
    """``(compile command, executable, -D flags)``, or None without a C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    defs, incs, libs = [], [], []
    spec = importlib.util.find_spec("blosc2")
    if spec and spec.submodule_search_locations:
        b2 = list(spec.submodule_search_locations)[0]
        if os.path.exists(os.path.join(b2, "include", "blosc2.h")):
            defs.append("-DDALI_MESH_HAVE_BLOSC2=1")
            incs.append(f"-I{b2}/include")
            libs += [f"-L{b2}/lib", "-lblosc2", f"-Wl,-rpath,{b2}/lib"]
    spec = importlib.util.find_spec("google_crc32c")  # libcrc32c from the google-crc32c wheel
    if spec and spec.submodule_search_locations:
        libs_dir = os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), "google_crc32c.libs")
        found = sorted(f for f in os.listdir(libs_dir) if f.startswith("libcrc32c")) if os.path.isdir(libs_dir) else []
        if found:
            defs.append("-DDALI_MESH_HAVE_CRC32C=1")
            libs += [os.path.join(libs_dir, found[0]), f"-Wl,-rpath,{libs_dir}"]
    # libdeflate, where found, inflates zlib and gzip chunks in zlib's place, as in the plugin
    for name, header, lib in (("ZSTD", "zstd.h", "zstd"), ("LZ4", "lz4.h", "lz4"), ("ZLIB", "zlib.h", "z"),
                              ("DEFLATE", "libdeflate.h", "deflate"), ("LZF", "liblzf/lzf.h", "lzf"),
                              ("SZIP", "szlib.h", "sz")):
        if os.path.exists(f"/usr/include/{header}"):
            defs.append(f"-DDALI_MESH_HAVE_{name}=1")
            libs.append(f"-l{lib}")
            if name == "LZF":
                incs.append("-I/usr/include/liblzf")
    exe = os.path.join(out_dir, os.path.basename(main).removesuffix("_main.cc"))
    cmd = [cxx, "-std=c++20", opt, "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=all", *defs, f"-I{ROOT}/csrc", *incs, *(f"{ROOT}/{s}" for s in sources),
           f"{ROOT}/{main}", "-o", exe, *libs, "-lpthread"]
    return cmd, exe, defs


def _valid_chunks(have):
    """``(steps, data bytes, stored bytes)`` of valid chunks of each codec this build has."""
    rng = np.random.default_rng(SEED)
    out = []
    arrays = [rng.standard_normal(700).astype("f4"), rng.integers(-9, 9, 1500).astype("i2"),
              np.arange(300, dtype="f8"), rng.integers(0, 255, 513).astype("u1"), np.zeros(64, "i8")]
    for a in arrays:
        raw = a.tobytes()
        if "blosc" in have:
            for cname in ("lz4", "zstd", "blosclz", "zlib", "lz4hc"):
                for shuffle in (0, 1, 2):
                    c = numcodecs.Blosc(cname, 5, shuffle, blocksize=0 if shuffle else 256)
                    out.append((((IDS["blosc"], a.itemsize),), raw, c.encode(a)))
        if "zstd" in have:
            out.append((((IDS["zstd"], 0),), raw, numcodecs.Zstd(3).encode(a)))
            out.append((((IDS["zstd"], 0),), raw, numcodecs.Zstd(1, checksum=True).encode(a)))
        if "lz4" in have:
            out.append((((IDS["lz4"], 0),), raw, numcodecs.LZ4().encode(a)))
        if "zlib" in have:
            out.append((((IDS["zlib"], 0),), raw, zlib.compress(raw, 6)))
            out.append((((IDS["gzip"], 0),), raw, numcodecs.GZip(5).encode(a)))
        if "crc32c" in have:  # Zarr v3 [bytes, crc32c] and [bytes, zstd, crc32c], as zarr-python writes them
            crc = numcodecs.CRC32C()
            out.append((((IDS["crc32c"], 0),), raw, bytes(crc.encode(a))))
            if "zstd" in have:
                out.append((((IDS["crc32c"], 0), (IDS["zstd"], 0)), raw, bytes(crc.encode(numcodecs.Zstd(3).encode(a)))))
    return out


def _hdf5_chunks(tmp_path, have):
    """Raw chunks (stored bytes) of h5py datasets with deflate, LZF or szip, shuffle and Fletcher-32,
    and their decode steps."""
    rng = np.random.default_rng(SEED + 1)
    # smooth fields: LZF, an optional filter, skips chunks it cannot shrink (the mask says so)
    data = (np.sin(np.arange(4 * 33 * 17) / 40.0) * 100).round().reshape(4, 33, 17).astype(">f4")
    data[:, ::7] += rng.integers(0, 3, data[:, ::7].shape)
    p = str(tmp_path / "f.h5")
    filters = [dict(compression="gzip", shuffle=True, fletcher32=True), dict(shuffle=True, fletcher32=True),
               dict(compression="gzip", shuffle=True)]
    filters += [dict(compression="lzf", shuffle=True, fletcher32=True)] if "lzf" in have else []
    filters += [dict(compression="szip", shuffle=True)] if "szip" in have else []
    out = []
    with h5py.File(p, "w") as f:
        for i, kw in enumerate(filters):
            ds = f.create_dataset(f"d{i}", data=data, chunks=(1, 33, 17), **kw)
            steps = []
            if kw.get("fletcher32"):
                steps.append((IDS["fletcher32"], 0))
            if kw.get("compression"):
                steps.append(_compressor_step(ds))
            steps.append((IDS["shuffle"], 4))
            for t in range(2):
                mask, stored = ds.id.read_direct_chunk((t, 0, 0))
                assert mask == 0
                out.append((tuple(steps), data[t].tobytes(), bytes(stored)))
    return out


def _compressor_step(ds):
    """The coder step of a dataset's compression filter, as dali_mesh.formats.hdf5 makes it."""
    dcpl = ds.id.get_create_plist()
    for i in range(dcpl.get_nfilters()):
        code, _, values, _ = dcpl.get_filter(i)
        if code == 1:
            return (IDS["zlib"], 0)
        if code == 32000:
            return (IDS["lzf"], 0)
        if code == 4:
            mask, ppb, bpp, pps = (int(v) for v in values[:4])
            return (IDS["szip"], mask | ppb << 16 | bpp << 24 | pps << 32)
    raise AssertionError("no compression filter")


def _mutants(rng, stored: bytes):
    n = len(stored)
    yield stored
    for _ in range(MUTANTS_PER_CHUNK):
        kind = int(rng.integers(0, 6))
        b = bytearray(stored)
        if kind == 0 and n:  # a few bit flips
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, n))] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1 and n:  # a run overwritten
            at = int(rng.integers(0, n))
            ln = int(rng.integers(1, 32))
            b[at:at + ln] = bytes(rng.integers(0, 256, min(ln, n - at)).astype(np.uint8))
        elif kind == 2:  # truncated
            b = b[:int(rng.integers(0, n + 1))]
        elif kind == 3:  # garbage appended
            b += bytes(rng.integers(0, 256, int(rng.integers(1, 64))).astype(np.uint8))
        elif kind == 4 and n >= 16:  # a 32-bit header field set to an extreme
            at = int(rng.integers(0, 4)) * 4
            b[at:at + 4] = struct.pack("<I", int(rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, n, n - 1])))
        else:  # a small header field byte
            if n:
                b[int(rng.integers(0, min(n, 16)))] = int(rng.integers(0, 256))
        yield bytes(b)


def test_corrupted_chunks_never_crash_under_sanitizers(tmp_path):
    exe, defs = build_sanitized(tmp_path)
    have = {n for n, d in (("blosc", "BLOSC2"), ("zstd", "ZSTD"), ("lz4", "LZ4"), ("zlib", "ZLIB"), ("lzf", "LZF"),
                           ("szip", "SZIP"), ("crc32c", "CRC32C")) if f"-DDALI_MESH_HAVE_{d}=1" in defs}
    valid = _valid_chunks(have) + (_hdf5_chunks(tmp_path, have) if "zlib" in have else [])
    rng = np.random.default_rng(SEED)
    records, expect = [], []
    for steps, raw, stored in valid:
        for k, m in enumerate(_mutants(rng, stored)):
            sizes = [len(raw)]
            if k % 7 == 3:
                sizes.append(int(rng.choice([0, len(raw) - 1, len(raw) + 1, 1 << 24])))
            for size in sizes:
                ids = [s[0] for s in steps]
                args = [s[1] for s in steps]
                records.append(struct.pack(f"<q{len(ids)}q{len(args)}qqq", len(ids), *ids, *args, size, len(m)) + m + struct.pack("<q", -1))
                expect.append(_fnv(raw) if (k == 0 and size == len(raw)) else None)
    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(b"".join(records))
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=98")
    proc = subprocess.run([exe, str(corpus)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == len(records) > 3000
    for line, want in zip(lines, expect):
        if want is not None:  # an unmutated chunk: its data, exactly, and two ranges of it alone alike
            assert line.startswith(f"ok {want} same parts-") and line.split()[3] in ("parts-same", "parts-whole"), line
            assert line.split()[4] in ("guess-same", "guess-whole"), line
    # a chunk that decodes whole: its ranges decode alike (a Blosc chunk's blocks alone), and from only
    # the stored bytes a read in parts takes, alike too or refused (never other values, never bad ranges)
    oks = [line.split() for line in lines if line.startswith("ok ")]
    assert all(w[2] == "same" and w[3] in ("parts-same", "parts-whole", "parts-refused") for w in oks), oks
    assert sum(w[3] == "parts-same" for w in oks) > 100  # Blosc chunks read in parts
    # and so from a guess of the chunk's layout (the last one's, or one of any values): the guess decides
    # only what is fetched first
    assert all(w[4] in ("guess-same", "guess-whole", "guess-refused") for w in oks), oks
    assert sum(w[4] == "guess-same" for w in oks) > 100
    errors = sum(line.startswith("err ") for line in lines)
    assert errors > len(lines) // 4  # the mutations are mostly refused, with a reason
