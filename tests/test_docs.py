"""The documentation cannot rot: the Sphinx build passes with warnings as errors, every ```python block
of README.md and docs/*.md runs, and the README stays a front door (at most 15,000 bytes).

Snippets: each block runs in a fresh Python process with an empty temporary folder as its working
directory, and must exit cleanly. Two HTML comments, on the line right before a block's fence,
change that:

* ``<!-- docs-test: continue -->``: run this block after the one before it in the same page, in the
  same process (a page may build a layout in one block and use it in the next);
* ``<!-- docs-test: skip (REASON) -->``: do not run it (it needs a GPU, several ranks, ...); it must
  still compile, and the reason is the skip message. Keep these few.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_LIMIT = 15_000
SNIPPET_TIMEOUT_S = 240

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<what>continue|skip)\s*(?:\((?P<reason>[^)]*)\))?\s*-->\s*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None = None  # "continue" | "skip" | None
    reason: str = ""


@dataclass
class Chain:
    """Blocks run one after another in one process: a block and the ``continue`` blocks after it."""
    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        first = self.blocks[0]
        return f"{first.path.relative_to(ROOT)}:{first.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The ```python fenced blocks of a Markdown file, with the docs-test marker before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        start = i
        i += 1
        body = []
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if info.split()[:1] not in (["python"], ["py"]):
            continue
        block = Block(path, start + 1, textwrap.dedent("\n".join(body)) + "\n")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and "docs-test" in lines[j]:
            mm = MARKER.match(lines[j].strip())
            if mm is None:
                raise ValueError(f"{path}:{j + 1}: unreadable marker {lines[j].strip()!r}; write "
                                 "<!-- docs-test: continue --> or <!-- docs-test: skip (reason) -->")
            block.marker = mm["what"]
            block.reason = (mm["reason"] or "").strip()
        blocks.append(block)
    return blocks


def chains() -> list[Chain]:
    out: list[Chain] = []
    for path in doc_files():
        previous: Chain | None = None
        for block in python_blocks(path):
            if block.marker == "continue":
                if previous is None:
                    raise ValueError(f"{path}:{block.line}: 'continue' with no block before it on the page")
                previous.blocks.append(block)
                continue
            previous = Chain([block])
            out.append(previous)
    return out


ALL_CHAINS = chains()


def test_readme_is_a_front_door():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, (f"README.md is {size} bytes, over {README_LIMIT}: move the detail "
                                  "into a page under docs/ and link it")


def test_snippets_are_found_and_the_quick_start_runs():
    assert ALL_CHAINS, "no ```python block found in README.md or docs/*.md"
    readme = [c for c in ALL_CHAINS if c.blocks[0].path.name == "README.md" and c.blocks[0].path.parent == ROOT]
    assert any(b.marker != "skip" for c in readme for b in c.blocks), "the README's quick start must run"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def test_relative_links_resolve():
    """A link from README.md or a page of docs/ to a file of the repository names a file that exists
    (Sphinx checks the links between pages again, with their anchors; this also covers the README)."""
    broken = []
    for path in doc_files():
        text = re.sub(r"(?s)```.*?```", "", path.read_text(encoding="utf-8"))  # not inside code blocks
        for m in LINK.finditer(text):
            target = m["target"].split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor, https:, mailto:, ...
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {m['target']}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_skipped_snippets_say_why_and_compile():
    for chain in ALL_CHAINS:
        for block in chain.blocks:
            if block.marker == "skip":
                assert block.reason, f"{block.path}:{block.line}: a skipped snippet needs a reason in ( )"
            compile(block.code, f"{block.path}:{block.line}", "exec")


def _script(chain: Chain) -> str:
    """One script for a chain: each block compiled with its own file name and line numbers, so that a
    traceback points at the page and line of the snippet that raised."""
    parts = ["import sys as _sys", "_ns = {'__name__': '__main__'}"]
    for block in chain.blocks:
        name = f"{block.path.relative_to(ROOT)}:{block.line}"
        code = "\n" * block.line + block.code  # the block's first line is the line after its fence
        parts.append(f"exec(compile({code!r}, {name!r}, 'exec'), _ns)")
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize("chain", ALL_CHAINS, ids=[c.id for c in ALL_CHAINS])
def test_snippet_runs(chain: Chain, tmp_path):
    if any(b.marker == "skip" for b in chain.blocks):
        skipped = next(b for b in chain.blocks if b.marker == "skip")
        pytest.skip(f"{chain.id}: {skipped.reason}")
    env = dict(os.environ)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "-c", _script(chain)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 0, (f"the snippet at {chain.id} ({len(chain.blocks)} block(s)) failed with exit code "
                                  f"{proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")


def test_sphinx_build_has_no_warnings(tmp_path):
    missing = [m for m in ("sphinx", "myst_parser") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: the docs build needs the pins of docs/conf.py's "
                    "header (sphinx, myst-parser)")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
           str(DOCS), str(tmp_path / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-12000:]}"
    assert (tmp_path / "html" / "index.html").is_file()
    assert (tmp_path / "html" / "api.html").is_file()
