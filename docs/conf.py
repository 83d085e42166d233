"""Sphinx configuration: the pages of docs/ are Markdown (MyST), the API reference comes from the
docstrings (autodoc, Google-style sections by napoleon).

Build (CI does it in tests/test_docs.py, with warnings as errors):

    pip install sphinx==8.2.3 myst-parser==4.0.1
    python -m sphinx -W --keep-going -b html docs build/docs
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package as checked out (an editable install gives the same)

import dali_mesh  # noqa: E402

project = "dali_mesh"
author = "dali_mesh authors"
release = version = dali_mesh.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# README.md is the folder's signpost on a code host; index.md is the same for Sphinx
exclude_patterns = ["_build", "README.md"]

myst_heading_anchors = 3  # [text](page.md#a-heading) as on GitHub
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"dali_mesh {release}"
html_static_path: list[str] = []

_OUTSIDE = re.compile(r"\]\(\.\./(?!docs/)(?P<path>[^)#\s]+)(?:#[^)\s]*)?\)")


def _repository_links(app, docname, source):
    """A page links files outside docs/ (benchmark results, examples, the README) by their path in the
    repository, which a code host renders. In the HTML build they are not pages: they become
    downloads (MyST's ``path:``), copied into the build, so that they still open."""
    source[0] = _OUTSIDE.sub(lambda m: f"](path:../{m['path']})", source[0])


def setup(app):
    app.connect("source-read", _repository_links)
    return {"parallel_read_safe": True}
