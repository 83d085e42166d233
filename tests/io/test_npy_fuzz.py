"""Bounded fuzz of the ``.npy`` header parser and reader (issue 9, "Done when").

Valid files (versions 1.0/2.0/3.0, C and Fortran order, several dtypes and shapes) are mutated in
their header bytes, header length, version, text tokens and file length, a few thousand times with a
fixed seed. Every outcome must be one of:

- the header and a random window read, both equal to numpy's ``np.load(..., allow_pickle=False)``
  (``take_window`` of it for the window); numpy must accept every file the reader accepts;
- a :class:`DataFileError` whose ``path`` is the file and whose message starts with it.

Anything else raised, or a case that runs past its guard (an interval timer), fails the test.
"""
from __future__ import annotations

import ast
import io
import signal
import time
import warnings

import numpy as np
import pytest

from dali_mesh.formats.npy import read_npy_header, read_npy_window
from dali_mesh.io import DataFileError
from dali_mesh.partition import BOUNDARIES, Region, take_window
from tests.helpers import random_region

CASES = 3000
SEED = 20261130
CASE_GUARD_S = 5.0  # per case; a case takes about a millisecond
INTERESTING = b"(),:'\" 0123456789-+eEjL{}[]\n\x00\xff<>|=.#\\"
DESCRS = ["<f4", ">f8", "|b1", "<i2", ">u4", "|u1", "<f2", "<c8", "<M8[s]", ",<f4", "(1e9,)f4", "O", "<U4",
          "V8", "(2,)<i4", "float32", "f", "<f16", "", "<i0", "i", "S0", "a", "<f4,<i4", "<m8"]
VALID_DESCRS = ["<f4", ">f8", "|b1", "<i2", ">u4", "|u1", "<f2", ">i8"]
VALID_SHAPES = ["(3,)", "(2, 3)", "(3, 2, 2)", "(1, 1, 1, 1)", "(5, 1)", "(2, 1, 3, 1, 2)"]
SHAPES = ["()", "(0,)", "(1,)", "(3,)", "(2, 3)", "(3, 2, 2)", "(1, 1, 1, 1)", "(-1,)", "(True, 2)", "(2.0,)",
          "(1048576, 1048576)", "(" + "1, " * 70 + ")", "[2, 3]", "(2, 3, )", "None", "(0x10,)", "(1_0,)"]


def _bases():
    rng = np.random.default_rng(SEED)
    arrays = [
        rng.standard_normal((3, 4, 5)).astype("<f4"),
        rng.standard_normal((6, 7)).astype(">f8"),
        rng.integers(-100, 100, (5, 3)).astype(">i2"),
        rng.integers(0, 2, (4, 4)).astype("?"),
        rng.integers(0, 255, (9,)).astype("u1"),
        np.asfortranarray(rng.integers(0, 1000, (4, 3, 2)).astype("<u4")),
        np.array(3.5, "<f8"),
        np.zeros((0, 3), "<i4"),
    ]
    out = []
    for i, a in enumerate(arrays):
        version = [(1, 0), (2, 0), (3, 0)][i % 3]
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, version=version, allow_pickle=False)
        out.append((buf.getvalue(), version))
    return out


def _header_bounds(data: bytes, version) -> tuple[int, int]:
    """(start of the header text, end of the header = data offset) of a valid file."""
    size = 2 if version[0] == 1 else 4
    hlen = int.from_bytes(data[8 : 8 + size], "little")
    return 8 + size, 8 + size + hlen


def _set_hlen(b: bytearray, version, hlen: int) -> None:
    size = 2 if version[0] == 1 else 4
    b[8 : 8 + size] = (hlen % (1 << (8 * size))).to_bytes(size, "little")


def _mutate(rng: np.random.Generator, data: bytes, version) -> bytes:
    b = bytearray(data)
    start, end = _header_bounds(data, version)
    if rng.random() < 0.25:  # a valid file of another dtype, order and shape, with flipped data bytes
        b, end = _swap_token(rng, b, version, start, end, which=4)
        for i in rng.integers(end, len(b), 3) if len(b) > end else ():
            b[int(i)] ^= 0x5A
        return bytes(b)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 10))
        end = min(end, len(b))
        if op == 0 and end:  # flip a bit of the magic, version, length or header text
            i = int(rng.integers(0, end))
            b[i] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and end > start:  # an interesting byte in the header text
            b[int(rng.integers(start, end))] = INTERESTING[int(rng.integers(0, len(INTERESTING)))]
        elif op == 2:  # the header length field
            hlen = end - start
            choice = int(rng.integers(0, 4))
            new = [hlen + int(rng.integers(-16, 17)), 0, 0xFFFFFFFF, int(rng.integers(0, 70000))][choice]
            _set_hlen(b, version, new)
        elif op == 3 and len(b) > 7:  # the version bytes
            b[6 + int(rng.integers(0, 2))] = int(rng.choice([0, 1, 2, 3, 4, 9, 255]))
        elif op == 4:  # cut the file anywhere
            del b[int(rng.integers(0, len(b) + 1)) :]
        elif op == 5:  # extend it
            b += bytes(rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8))
        elif op in (6, 7) and end > start:  # insert or delete header bytes, keeping the length field right or not
            i = int(rng.integers(start, end))
            if op == 6:
                piece = bytes(INTERESTING[int(k)] for k in rng.integers(0, len(INTERESTING), int(rng.integers(1, 5))))
                b[i:i] = piece
                delta = len(piece)
            else:
                n = int(rng.integers(1, 5))
                del b[i : i + n]
                delta = -min(n, end - i)
            if rng.random() < 0.5:
                _set_hlen(b, version, end - start + delta)
            end += delta
        elif op in (8, 9) and end > start:  # swap a token of the dict, resizing the data to match or not
            b, end = _swap_token(rng, b, version, start, end)
    return bytes(b)


def _swap_token(rng, b: bytearray, version, start: int, end: int, which: int | None = None) -> tuple[bytearray, int]:
    """Rewrite the header dict with one value swapped for a strange one (or a key renamed, dropped or
    added), the length field fixed, and often the data resized to what the new header claims."""
    try:
        meta = ast.literal_eval(bytes(b[start:end]).decode("latin1").strip())
        descr, fortran, shape = repr(meta["descr"]), repr(meta["fortran_order"]), repr(meta["shape"])
    except Exception:  # an earlier mutation broke the dict: nothing to swap
        return b, end
    which = int(rng.integers(0, 5)) if which is None else which
    if which == 4:  # a valid header of another dtype, order and shape (the data resized below)
        descr = repr(VALID_DESCRS[int(rng.integers(0, len(VALID_DESCRS)))])
        fortran = str(rng.choice(["True", "False"]))
        shape = VALID_SHAPES[int(rng.integers(0, len(VALID_SHAPES)))]
    elif which == 0:
        descr = repr(DESCRS[int(rng.integers(0, len(DESCRS)))])
    elif which == 1:
        fortran = str(rng.choice(["True", "False", "1", "None", "'False'"]))
    elif which == 2:
        shape = SHAPES[int(rng.integers(0, len(SHAPES)))]
    text = "{" + f"'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, " + "}"
    if which == 3:
        key = str(rng.choice(["'descr'", "'shape'", "'fortran_order'"]))
        text = text.replace(key, str(rng.choice(["'Descr'", "'descr '", "(1,)", key])), 1)
        text = text.replace("{", "{" + str(rng.choice(["'extra': 1, ", "1: 2, ", ""])), 1)
    text += " " * int(rng.integers(0, 20)) + "\n"
    data = bytes(b[end:])
    if which == 4 or rng.random() < 0.6:  # the data size the new header claims, if it names one
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                new = ast.literal_eval(text.strip())
                n = int(np.prod(new["shape"])) * np.dtype(new["descr"]).itemsize
            if 0 <= n <= 1 << 16:
                data = (data * (n // max(len(data), 1) + 1))[:n] if data else bytes(n)
        except Exception:
            pass
    encoded = text.encode("utf8" if version == (3, 0) else "latin1", "replace")
    out = bytearray(b[:start]) + bytearray(encoded) + bytearray(data)
    _set_hlen(out, version, len(encoded))
    return out, start + len(encoded)


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::SyntaxWarning", "ignore::UserWarning")
def test_mutated_npy_files_read_like_numpy_or_raise_data_file_error(tmp_path):
    rng = np.random.default_rng(SEED)
    bases = _bases()
    path = str(tmp_path / "fuzz.npy")
    outcomes = {"read": 0, "refused": 0}
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.monotonic()
    try:
        for case in range(CASES):
            data, version = bases[case % len(bases)]
            mutated = _mutate(rng, data, version)
            with open(path, "wb") as f:
                f.write(mutated)
            signal.setitimer(signal.ITIMER_REAL, CASE_GUARD_S)
            try:
                outcome = _one_case(rng, path, mutated)
            except CaseTimeout:
                pytest.fail(f"case {case} ran past {CASE_GUARD_S} s; file bytes: {mutated[:300]!r}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcomes[outcome] += 1
    finally:
        signal.signal(signal.SIGALRM, old)
    elapsed = time.monotonic() - t0
    # both kinds occurred, so the fuzz reached past the header checks and into them
    assert outcomes["read"] > CASES // 10 and outcomes["refused"] > CASES // 4, outcomes
    assert elapsed < 120, f"{CASES} cases took {elapsed:.1f} s"
    print(f"{CASES} mutated files in {elapsed:.1f} s: {outcomes}")


def _one_case(rng, path: str, mutated: bytes) -> str:
    def check_error(e: DataFileError, what: str) -> str:
        assert e.path == path and str(e).startswith(path + ": "), f"{what}: error does not name the file: {e}"
        return "refused"

    try:
        header = read_npy_header(path)
    except DataFileError as e:
        check_error(e, "header")
        # the window reader refuses the same file, naming it
        region = Region((0,), (1,), (0,), (1,), (0,), (1,), "constant")
        try:
            read_npy_window(path, region)
        except DataFileError as e2:
            return check_error(e2, "window")
        raise AssertionError(f"header refused ({e}) but a window read succeeded: {mutated[:300]!r}")
    except Exception as e:  # anything else is the bug this test looks for
        raise AssertionError(f"{type(e).__name__} (not a DataFileError) from {mutated[:300]!r}: {e}") from e
    try:
        ref = np.load(path, allow_pickle=False, max_header_size=65536)
    except Exception as e:
        raise AssertionError(f"accepted a file numpy refuses ({type(e).__name__}: {e}): {mutated[:300]!r}") from e
    assert header.shape == ref.shape and header.native_dtype == ref.dtype.newbyteorder("="), (header, ref.dtype)
    if ref.size == 0 or ref.ndim == 0:
        return "read"
    mode = BOUNDARIES[int(rng.integers(0, len(BOUNDARIES)))]
    region = random_region(rng, ref.shape, mode, max_halo=3, fill_value=1)
    try:
        for kw in ({}, {"method": "mmap"}, {"merge_gap": 0, "page_merge": False}):
            out = read_npy_window(path, region, **kw)
            np.testing.assert_array_equal(out, take_window(ref, region), err_msg=f"{kw} {mutated[:300]!r}")
    except DataFileError as e:
        raise AssertionError(f"header accepted, window refused: {e}") from e
    return "read"
