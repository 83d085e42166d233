"""The folders are the architecture: each room of ``dali_mesh`` imports only the rooms below it, and
no module imports itself through others (no import circle).

The picture, top-down: cli -> torch / pipeline (fn) -> weather -> datasets -> source -> formats (one
folder per format) -> io (what the readers share) -> plan -> storage; plan -> partition -> mesh. Read from
the source text (``ast``), so it holds for imports inside functions too.

In C++ (csrc/): only the operators include DALI (the reader, plans, codecs, stores and kernels are the
DALI-free core), and a codec id is written in one place, the codec table.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dali_mesh"

#: room -> the rooms it may import (besides itself). Modules of the package root that are not a room
#: (``_checks``, ``_kernels``, ``_build_info``, ``mesh``) are rooms of their own.
ALLOWED = {
    "_checks": set(),
    "_build_info": set(),
    "plugin_registry": set(),  # the entry-point registry of formats and stores
    "mesh": {"_checks"},
    "partition": {"mesh", "_checks"},
    "storage": {"_kernels", "plugin_registry"},  # the remote stores call libcurl through the kernels library
    "_kernels": {"partition", "mesh", "_checks"},
    "plan": {"storage", "partition", "mesh", "_checks", "_kernels"},
    "io": {"plan", "storage", "partition", "mesh", "_checks", "_kernels"},
    "formats": {"io", "plan", "storage", "partition", "mesh", "_checks", "_kernels", "plugin_registry"},
    "source": {"formats", "io", "plan", "storage", "partition", "mesh", "_checks"},
    "datasets": {"source", "formats", "io", "plan", "storage", "partition", "mesh", "_checks"},
    "weather": {"datasets", "source", "formats", "io", "plan", "storage", "partition", "mesh", "_checks"},
    "dataset": {"weather"},  # the weather sources' former module, kept for ``from dali_mesh.dataset import``
    "pipeline": {"weather", "datasets", "source", "formats", "io", "plan", "storage", "partition", "mesh", "_checks",
                 "_kernels", "_build_info"},
    "fn": {"pipeline"},
    "image": {"pipeline"},
    "torch": {"pipeline", "source", "partition", "mesh", "_checks"},
    "cli": {"torch", "pipeline", "fn", "weather", "datasets", "source", "formats", "io", "plan", "storage", "partition",
            "mesh", "_checks", "_kernels"},
    "physicsnemo": {"torch", "pipeline", "datasets", "source", "formats", "io", "partition", "mesh", "storage",
                    "_checks"},
    "__init__": {"pipeline", "weather", "source", "partition", "mesh"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _imports(path: Path, typing_too: bool = False) -> set[str]:
    """Every ``dali_mesh`` module ``path`` imports (``from dali_mesh.x import y`` counts as
    ``dali_mesh.x.y`` when that is a module, else ``dali_mesh.x``); with ``typing_too`` those under
    ``if TYPE_CHECKING:`` as well."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only and not typing_too:  # annotations only: never imported at run time
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "dali_mesh" or n.startswith("dali_mesh."))
    return out


def _is_module(name: str) -> bool:
    p = PACKAGE.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_the_rooms_of_the_design():
    rooms = {_room(_module_name(p)) for p in MODULES}
    assert {"partition", "storage", "plan", "io", "formats", "pipeline", "torch", "cli", "source", "mesh", "fn"} <= rooms
    for folder in ("partition", "storage", "plan", "io", "formats", "source", "pipeline", "torch", "cli"):
        assert (PACKAGE / folder / "__init__.py").is_file(), folder


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_each_room_imports_only_the_rooms_below_it(path):
    me = _module_name(path)
    room = _room(me)
    assert room in ALLOWED, f"{me}: room {room!r} is not in the picture (add it to ALLOWED and the README)"
    bad = sorted(m for m in _imports(path) if m != "dali_mesh" and _room(m) != room and _room(m) not in ALLOWED[room])
    assert not bad, f"{me} (room {room!r}) imports {bad}; {room!r} may import only {sorted(ALLOWED[room])}"


def _circle(typing_too: bool) -> list[str] | None:
    """An import circle among the package's modules (``typing_too``: imports under ``TYPE_CHECKING``
    counted), or None."""
    graph = {_module_name(p): {m for m in _imports(p, typing_too) if _is_module(m)} for p in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            # a package's __init__ imported by its own modules' parents is not an edge back
            if n == m or m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if state.get(n) is None:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_circle():
    circle = _circle(typing_too=False)
    assert circle is None, "import circle: " + " -> ".join(circle or ())


def test_no_import_circle_through_annotations_either():
    """An import under ``TYPE_CHECKING`` is not run, but a circle through it is still a circle of the
    design (a mixin that needs the class it is mixed into, say): none either."""
    circle = _circle(typing_too=True)
    assert circle is None, "import circle (annotations counted): " + " -> ".join(circle or ())


#: the largest module, and class, a reader should have to hold in mind (issue 30)
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 400


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_modules_and_classes_stay_small(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, (
        f"{_module_name(path)} has {text.count(chr(10))} lines (at most {MAX_MODULE_LINES}): cut it by job")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_CLASS_LINES, (f"{_module_name(path)}.{node.name} has {n} lines (at most "
                                          f"{MAX_CLASS_LINES}): split it by job")


# ---- the C++ rooms (csrc/) ----------------------------------------------------------------------------
CSRC = PACKAGE.parent / "csrc"
CXX_FILES = sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cc", ".cu", ".cuh", ".inc"))
#: a C++ or Python codec id written down outside the codec table: an enum value (kCodecX = 3), a row of
#: the table's form, or a name given its id ("blosc": 1; "shuffle" is left out in Python, where it is
#: mostly the sample order's)
_CODEC_NAMES = r"blosc|zstd|lz4|zlib|gzip|fletcher32|lzf|szip|crc32c"
_CXX_CODEC_ID = re.compile(r"\bkCodec[A-Z]\w*\s*=\s*\d|^\s*DM_CODEC\(\d", re.M)
_PY_CODEC_ID = re.compile(rf"[\"']({_CODEC_NAMES})[\"']\s*:\s*\d+\b|\b({_CODEC_NAMES.upper()})\s*=\s*\d+\b")


def _rel(p: Path) -> str:
    return p.relative_to(PACKAGE.parent).as_posix()


def test_only_the_operators_include_dali():
    """The reader, plans, codecs, stores and kernels are DALI-free (the kernels library builds them
    without DALI, and the tests drive them so): only csrc/operators/ includes DALI's headers."""
    assert CXX_FILES
    include = re.compile(r'^\s*#\s*include\s*[<"]dali/', re.M)
    bad = [_rel(p) for p in CXX_FILES if not _rel(p).startswith("csrc/operators/") and include.search(p.read_text())]
    assert not bad, f"{bad} include DALI headers; only csrc/operators/ may (the rest is the DALI-free core)"


def test_the_codec_table_is_the_only_place_a_codec_id_is_defined():
    table = CSRC / "codecs" / "codec_table.inc"
    assert _CXX_CODEC_ID.search(table.read_text())
    bad = [_rel(p) for p in CXX_FILES if p != table and _CXX_CODEC_ID.search(p.read_text())]
    tests = PACKAGE.parent / "tests"
    py = [p for p in [*MODULES, *tests.rglob("*.py")] if p != Path(__file__).resolve()]
    bad += [f"{_rel(p)}: {m.group(0)}" for p in py for m in [_PY_CODEC_ID.search(p.read_text())] if m]
    assert not bad, (f"codec ids written outside csrc/codecs/codec_table.inc: {bad}; take them from the table "
                     "(C++: codec_table.h; Python: dali_mesh.plan.CODECS; tests: tests.helpers.codec_rows)")


def test_no_two_modules_share_a_name():
    """A module's name says which one it is (``args`` twice, in ``cli`` and in ``source``, made every
    traceback and import a question): ``__init__`` and ``__main__`` aside, each name is used once."""
    seen: dict[str, list[str]] = {}
    for p in MODULES:
        if p.stem not in ("__init__", "__main__"):
            seen.setdefault(p.stem, []).append(_module_name(p))
    twice = {name: mods for name, mods in seen.items() if len(mods) > 1}
    assert not twice, f"modules of one name: {twice}; name each by its job"


@pytest.mark.parametrize("path", CXX_FILES, ids=_rel)
def test_cxx_files_stay_small(path):
    n = path.read_text().count("\n")
    assert n <= MAX_MODULE_LINES, f"{_rel(path)} has {n} lines (at most {MAX_MODULE_LINES}): cut it by job"


#: ``store.local`` or ``x.store.local`` read as an attribute (a store "being local")
_LOCAL_BRANCH = re.compile(r"\.local\b(?!\s*\()")


@pytest.mark.parametrize("path", [p for p in MODULES if _room(_module_name(p)) != "storage"],
                         ids=lambda p: _module_name(p))
def test_no_branch_on_a_store_being_local_outside_storage(path):
    """Outside ``storage/`` code asks a store what it can do (``local_path(key)``: the file of this
    machine that holds a key, or None; ``supports_listing``), never whether it "is local": a store of
    another kind (memory://, a cache) then works everywhere a file does."""
    bad = [f"{_module_name(path)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
           if _LOCAL_BRANCH.search(line.split("#")[0]) and "threading.local" not in line
           and not re.search(r"storage\.local\b", line)]
    assert not bad, f"{bad} branch on a store being local; ask store.local_path(key) instead"


#: a format's name where code would switch on it: ``== "npy"``, ``kind ==`` / ``!=`` / ``in`` a name, or a
#: dict keyed by a name (``{"hdf5": ...}``)
_FORMAT_NAME = r"""["'](npy|hdf5|zarr)["']"""
_FORMAT_SWITCH = re.compile(rf"""(==|!=|\bin)\s*\(?\s*{_FORMAT_NAME}|{_FORMAT_NAME}\s*(==|!=|:)""")


@pytest.mark.parametrize("path", [p for p in MODULES if _room(_module_name(p)) == "cli"], ids=lambda p: _module_name(p))
def test_the_cli_never_switches_on_a_format_name(path):
    """The CLI asks the format object (``open``, ``read_whole``, ``info``, ``create``, ``advice_target``),
    as xarray's backends are asked: a format registered from another package then works in every command."""
    bad = [f"{_module_name(path)}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
           if _FORMAT_SWITCH.search(line.split("#")[0])]
    assert not bad, f"{bad} switch on a format's name; ask the format (dali_mesh.formats.ArrayFormat) instead"


def test_the_format_switch_check_sees_a_switch():
    for line in ('if kind == "npy":', "if 'hdf5' == fmt.name:", '_TARGETS = {"npy": A, "zarr": B}',
                 'if kind in ("hdf5", "zarr"):'):
        assert _FORMAT_SWITCH.search(line), line
    for line in ('kind = fmt.name', 'help="a folder of .npy files"', 'return "dataset"'):
        assert not _FORMAT_SWITCH.search(line), line


#: the stores of dali_mesh/storage/ (a module or a folder each): peers, none importing another's module
STORES = ("local", "remote", "memory", "references", "icechunk")


@pytest.mark.parametrize("path", [p for p in MODULES if _module_name(p).split(".")[:2] == ["dali_mesh", "storage"]
                                  and len(_module_name(p).split(".")) > 2
                                  and _module_name(p).split(".")[2] in STORES], ids=_module_name)
def test_stores_are_peers(path):
    """A store reaches what it shares with the others (the C binding: native_store; credentials, endpoints and
    the client's settings: credentials; listings: listing; the seam: byte_store, errors, names) through
    modules of their own, never through another store's module (issue 53: references/, icechunk/ and
    memory/ imported remote.py, one for its private names). The package's own __init__ (the registry of
    schemes) may be asked to resolve a location."""
    mine = _module_name(path).split(".")[2]
    others = sorted(m for m in _imports(path) if m.split(".")[:2] == ["dali_mesh", "storage"] and len(m.split(".")) > 2
                    and m.split(".")[2] in STORES and m.split(".")[2] != mine)
    assert not others, f"{_module_name(path)} imports {others}, another store's module"
