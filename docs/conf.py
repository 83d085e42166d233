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


def _section_headers(app, what, name, obj, options, lines):
    """Napoleon knows a section by a bare header ("Args:"); a header with a remark, as
    ERA5HDF5Datapipe's "Args (dali_mesh's):", becomes the bare header after a line that keeps the
    remark. (Until the docstring says it that way itself.)"""
    for i, line in enumerate(lines):
        m = re.fullmatch(r"(\s*)Args \((.+)\):\s*", line)
        if m:
            lines[i:i + 1] = [f"{m[1]}Arguments ({m[2]}):", "", f"{m[1]}Args:"]


def _pending_pages(app, docname, source):
    """index.md's toctree names install.md, which is written separately (issue 30): until it is in
    the repository the entry is left out, so that the build does not fail on it. Once it is, this
    hook does nothing and can go."""
    if docname == "index" and not (Path(app.srcdir) / "install.md").exists():
        source[0] = re.sub(r"(?m)^install\n", "", source[0], count=1)


def setup(app):
    app.connect("source-read", _pending_pages)
    app.connect("source-read", _repository_links)
    app.connect("autodoc-process-docstring", _section_headers, priority=400)  # before napoleon's (500)
    return {"parallel_read_safe": True}
