"""The reader core's tests drive the kernels library (dali_mesh._kernels): skipped when it is not built."""
import pytest


@pytest.fixture(autouse=True)
def _library():
    from dali_mesh import _kernels

    try:
        _kernels.load()
    except _kernels.KernelsError as e:
        pytest.skip(f"the kernels library is not built: {e}")
