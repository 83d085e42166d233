"""CI smoke run of benchmarks/virtual_bench.py (a file of its own beside tests/test_bench_scripts.py, which
another change edits now; to be moved there): tiny NetCDF4 files referenced by kerchunk, both readers'
windows checked against the fields written, local and at 20 ms from the loopback S3 server."""
from __future__ import annotations

import pytest

from tests.test_bench_scripts import BENCH, _needs_plugin, _run


def test_virtual_bench_quick(tmp_path):
    _needs_plugin()
    for module in ("kerchunk", "xarray", "h5netcdf", "s3fs"):
        pytest.importorskip(module)
    r = _run([str(BENCH / "virtual_bench.py"), "--quick", "--dir", str(tmp_path / "data")], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("| local |") or line.startswith("| 20 ms |")]
    assert {(row[0], row[1], row[2]) for row in rows} == {(link, chunks, reader) for link in ("local", "20 ms")
                                                         for chunks in ("whole", "band")
                                                         for reader in ("native", "xarray")}, r.stdout
    for row in rows:
        if row[0] == "20 ms":  # what the server sent: the native reader fetches no more than xarray
            assert float(row[8].rstrip("x")) <= 1.02, row
