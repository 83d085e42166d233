"""The reader core's tests drive the kernels library (dali_mesh._kernels): skipped when it is not built."""
import pytest


@pytest.fixture(autouse=True)
def _library(kernels_library):
    """Every test here: the kernels library loaded (tests/conftest.py's kernels_library)."""
