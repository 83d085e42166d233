"""Build and install dali_mesh.

Install with ``pip install --no-build-isolation .`` so that the plugin is built against the DALI
already installed in this environment (see README).
"""
from setuptools import find_packages, setup

setup(
    name="dali_mesh",
    version="0.1.0",
    description="Partition-aware data loading for model-parallel training with NVIDIA DALI",
    packages=find_packages(include=["dali_mesh", "dali_mesh.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.24"],
    extras_require={
        "dali": ["nvidia-dali-cuda120==2.4.0"],
        "torch": ["torch>=2.5"],
        "io": ["h5py>=3.10", "zarr>=2.16"],
        "gpu": ["cupy-cuda12x"],
        "test": ["pytest", "pytest-timeout", "hypothesis"],
    },
    entry_points={"console_scripts": ["dali-mesh=dali_mesh.cli:main"]},
)
