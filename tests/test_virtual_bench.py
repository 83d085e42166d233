"""CI smoke run of benchmarks/virtual_bench.py (a file of its own beside tests/test_bench_scripts.py, which
another change edits now; to be moved there): tiny NetCDF4 files referenced by kerchunk, an Icechunk
repository of the same fields, and one of virtual chunks into the files, every reader's windows checked
against the fields written (the script fails otherwise), local and at 20 ms from the loopback S3 server."""
from __future__ import annotations

import pytest

from tests.test_bench_scripts import BENCH, _needs_plugin, _run

PYTHON_PATH = "dali_mesh (python path)"  # the label of dali_mesh's reader where the native one refuses a store


def test_virtual_bench_quick(tmp_path):
    _needs_plugin()
    for module in ("kerchunk", "xarray", "h5netcdf", "s3fs", "icechunk", "virtualizarr"):
        pytest.importorskip(module)
    r = _run([str(BENCH / "virtual_bench.py"), "--quick", "--dir", str(tmp_path / "data")], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith(("| kerchunk |", "| icechunk |", "| icechunk-virtual |"))]
    readers = {(row[0], row[3]) for row in rows}
    # the kerchunk set is read natively; the repository natively or by the python path (IcechunkStore is not native)
    assert ("kerchunk", PYTHON_PATH) not in readers, r.stdout + r.stderr
    assert {(row[0], row[1], row[2], row[3] != "xarray") for row in rows} == {
        (store, link, chunks, dali) for store in ("kerchunk", "icechunk", "icechunk-virtual")
        for link in ("local", "20 ms") for chunks in ("whole", "band") for dali in (True, False)}, r.stdout
    assert len(rows) == 24, r.stdout
    for row in (row for row in rows if row[1] == "20 ms"):  # what the server sent (locally the page cache
        # reads ahead of these small files: 1.5x-3x the chunks touched, whoever reads them)
        vs_xarray, vs_stored = float(row[9].rstrip("x")), float(row[8].rstrip("x"))
        if row[3] == "native":
            assert vs_xarray <= 1.02, row
        # every reader fetches the chunks its window touches, not the field (a band's chunks are 1/4 of it), and
        # the store's metadata (the repository's snapshot and manifests in each of the python path's workers)
        assert vs_stored <= 1.25, row
