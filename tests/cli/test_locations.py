"""Issue 40 (the command line): a location's credentials never show, a presigned URL's format is found on
its path, and ``convert`` refuses a destination it cannot write instead of a local folder named after a URL."""
from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from dali_mesh.cli import main
from dali_mesh.cli.options import data_kind, find_data
from dali_mesh.cli.locations import format_of_location, name_of, scrub, shown
from tests.helpers import run_python

zarr = pytest.importorskip("zarr")

SECRETS = ("SECRETSIG", "SECRETTOK", "AKIDSECRET", "SECRETKEY")
PRESIGNED = "a.h5?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=SECRETSIG&X-Amz-Security-Token=SECRETTOK"
MESH = ["--mesh", "mp=2", "--shard", "mp=1"]


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in: {text[-1500:]}"


# ---- finding 6: the format of a presigned URL, from its path ------------------------------------------------
@pytest.mark.parametrize("location,kind", [
    (f"https://host/{PRESIGNED}", "hdf5"),
    ("https://host/era5/p.zarr?X-Amz-Signature=SECRETSIG#part", "zarr"),
    ("http://host/x/s.npy#frag", "npy"),
    ("https://host/get?key=b.npy", None),  # the path names no format: the query is not the name
    ("s3://bucket/odd?.h5", "hdf5"),  # an s3:// key is opaque bytes: '?' is part of its name
    ("s3://bucket/a.h5?v=1", None),
    ("gs://bucket/a#b.zarr", "zarr"),
    ("local/dir/a.h5?x", None),  # a local file name may hold '?'
])
def test_format_is_detected_on_the_url_path_without_its_query(location, kind):
    assert data_kind(location) == kind
    assert (format_of_location(location) and format_of_location(location).name) == kind


def test_find_data_takes_a_presigned_url_as_one_file_by_its_path():
    """No listing (a plain HTTPS location cannot be listed) and no request: the URL itself, query kept for the read."""
    location = f"https://127.0.0.1:1/d/{PRESIGNED}"
    fmt, files = find_data(location)
    assert (fmt.name, files) == ("hdf5", [location])


# ---- finding 5 and 16: no query, no user info in anything the command line prints ----------------------------
@pytest.mark.parametrize("location,want", [
    (f"https://host/{PRESIGNED}", "https://host/a.h5?\u2026"),
    ("http://host:8080/a.zarr#tok", "http://host:8080/a.zarr#\u2026"),
    ("http://user:pw@host/a.npy?q=1", "http://\u2026@host/a.npy?\u2026"),
    ("s3://AKIDSECRET:SECRETKEY@bucket/x.zarr", "s3://\u2026@bucket/x.zarr"),
    ("s3://AKIDSECRET:SECRET/KEY@bucket/x.zarr", "s3://\u2026@bucket/x.zarr"),  # a secret with a raw '/'
    ("gs://AKIDSECRET@bucket/k", "gs://\u2026@bucket/k"),
    ("s3://bucket/a?b#c@d.zarr", "s3://bucket/a?b#c@d.zarr"),  # an opaque key: shown as it is
    ("http://host:80/a@b.npy", "http://host:80/a@b.npy"),
    ("http://[::1]/a@b.npy?sig", "http://[::1]/a@b.npy?\u2026"),
    ("dir/a.h5?x@y", "dir/a.h5?x@y"),
    # issue 52: a nested location's own query and user info
    (f"reference://https://host/{PRESIGNED}", "reference://https://host/a.h5?\u2026"),
    ("icechunk://s3://AKIDSECRET:SECRETKEY@bucket/repo", "icechunk://s3://\u2026@bucket/repo"),
    ("icechunk://reference://http://AKIDSECRET@h/refs.json#SECRETTOK", "icechunk://reference://http://\u2026@h/refs.json#\u2026"),
    ("reference://s3://bucket/refs?.json", "reference://s3://bucket/refs?.json"),  # an opaque key, nested
    # a repository at a bucket's root pinned to a snapshot: bucket@<snapshot id> is no user info
    ("icechunk://s3://rootrepo@ABCDEFGHJKMNPQRSTVWX", "icechunk://s3://rootrepo@ABCDEFGHJKMNPQRSTVWX"),
    ("icechunk://s3://rootrepo@ABCDEFGHJKMNPQRSTVWX/t/c/0", "icechunk://s3://rootrepo@ABCDEFGHJKMNPQRSTVWX/t/c/0"),
    ("icechunk://s3://AKIDSECRET:SECRETKEY@rootrepo@ABCDEFGHJKMNPQRSTVWX/t",
     "icechunk://s3://\u2026@rootrepo@ABCDEFGHJKMNPQRSTVWX/t"),
    ("s3://AKIDSECRET:SECRETKEY@ABCDEFGHJKMNPQRSTVWX/x", "s3://\u2026@ABCDEFGHJKMNPQRSTVWX/x"),
    ("s3://AKIDSECRET:SECRET/KEY@ABCDEFGHJKMNPQRSTVWX/x", "s3://\u2026@ABCDEFGHJKMNPQRSTVWX/x"),
    ("s3://AKIDSECRET@bucket@ABCDEFGHJKMNPQRSTVWX/x", "s3://\u2026@bucket@ABCDEFGHJKMNPQRSTVWX/x"),
    ("s3://rootrepo@ABCDEFGHJKMNPQRSTVWXY/x", "s3://\u2026@ABCDEFGHJKMNPQRSTVWXY/x"),  # 21: no snapshot id
    ("https://AKIDSECRET@ABCDEFGHJKMNPQRSTVWX/x", "https://\u2026@ABCDEFGHJKMNPQRSTVWX/x"),  # a host, not a bucket
])
def test_shown_hides_the_query_and_user_info(location, want):
    assert shown(location) == want
    assert shown(want) == want
    assert scrub(f"--data {location!r} failed; then {location}: again", [location]) == \
        f"--data {want!r} failed; then {want}: again"
    assert scrub(f"a library said {location}") == f"a library said {want}"


def test_name_of_a_url_has_no_query_or_user_info():
    assert name_of(f"https://u:p@host/d/{PRESIGNED}") == "https://host/d/a.h5"


class _Echo(BaseHTTPRequestHandler):
    """A hostile server: every request is refused (403) with its request line, query included, echoed in
    the error body, as some servers do."""

    def _refuse(self, body: bool) -> None:
        text = (f"<Error><Code>AccessDenied</Code><Message>denied {self.command} {self.path} "
                f"auth={self.headers.get('Authorization')}</Message></Error>").encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if body:
            self.wfile.write(text)

    def do_GET(self):  # noqa: N802
        self._refuse(True)

    def do_HEAD(self):  # noqa: N802
        self._refuse(False)

    def log_message(self, *args):
        pass


@pytest.fixture()
def echo_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", [["plan", "--data"], ["convert"]])
def test_a_presigned_url_never_shows_in_the_command_lines_output(echo_server, tmp_path, capsys, monkeypatch, command):
    """``plan --data`` and ``convert SRC`` of a presigned URL that the server refuses: the error names the URL
    without its query; stdout, stderr and the exit show no signature or token."""
    monkeypatch.chdir(tmp_path)
    location = f"{echo_server}/bucket/{PRESIGNED}"
    argv = command + [location] + (["out.zarr"] if command == ["convert"] else []) + MESH
    assert main(argv) == 2
    out, err = capsys.readouterr()
    _no_secret(out, err)
    assert f"{echo_server}/bucket/a.h5" in err  # the error still says which object


@pytest.mark.parametrize("command", [["plan", "--data"], ["demo", "--data"]])
def test_a_nested_presigned_url_never_shows_in_the_command_lines_output(echo_server, tmp_path, capsys, monkeypatch,
                                                                        command):
    """Issue 52: ``plan --data 'reference://https://host/refs.json?X-Amz-Signature=...'`` printed the query
    (a nested location was not hidden)."""
    monkeypatch.chdir(tmp_path)
    location = f"reference://{echo_server}/bucket/refs.json?X-Amz-Signature=SECRETSIG&X-Amz-Security-Token=SECRETTOK"
    assert main(command + [location] + MESH + (["--nproc", "2"] if command[0] == "demo" else [])) == 2
    out, err = capsys.readouterr()
    _no_secret(out, err)
    assert f"reference://{echo_server}/bucket/refs.json" in err and "Traceback" not in err


def test_user_info_never_shows_in_the_command_lines_output(echo_server, tmp_path):
    """``s3://KEY:SECRET@bucket/...``: in a process of its own (a library's background task may log its error
    at exit), against a server that refuses every request."""
    proc = run_python("""
        import sys
        from dali_mesh.cli import main
        sys.exit(main(sys.argv[1:]))
    """, "plan", "--data", "s3://AKIDSECRET:SECRETKEY@bucket/x.zarr", *MESH, cwd=str(tmp_path),
        env={"AWS_ENDPOINT_URL": echo_server, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    _no_secret(proc.stdout, proc.stderr)
    assert proc.stderr.startswith("dali-mesh: error: ") and "bucket/x.zarr" in proc.stderr


def test_an_unexpected_error_is_shown_scrubbed(monkeypatch, capsys):
    """An error no check foresaw: its traceback, for a report, with the location's secrets hidden."""
    import dali_mesh.cli.advice as advice

    def broken(path, dataset=None, **kw):
        raise KeyError(f"no entry for {path}")

    monkeypatch.setattr(advice, "open_layout_target", broken)
    assert main(["plan", "--data", f"https://host/{PRESIGNED}", *MESH]) == 1
    out, err = capsys.readouterr()
    _no_secret(out, err)
    assert "Traceback" in err and "KeyError: 'no entry for https://host/a.h5?\u2026'" in err


def test_argparse_errors_do_not_echo_a_presigned_url(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", f"https://host/{PRESIGNED}", *MESH])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    _no_secret(out, err)
    assert "unrecognized arguments: https://host/a.h5?\u2026" in err


@pytest.mark.slow
def test_a_presigned_url_on_a_closed_port_never_shows(tmp_path):
    """The brief's case: nothing listens (the store retries, then fails); the whole output is clean."""
    proc = run_python("""
        import sys
        from dali_mesh.cli import main
        sys.exit(main(sys.argv[1:]))
    """, "plan", "--data", "http://127.0.0.1:1/a.h5?X-Amz-Signature=SECRETSIG&X-Amz-Security-Token=SECRETTOK", *MESH,
        cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2
    _no_secret(proc.stdout, proc.stderr)
    assert "http://127.0.0.1:1/a.h5" in proc.stderr


# ---- finding 11: convert never writes a local folder named after a URL ---------------------------------------
@pytest.mark.parametrize("dst", ["s3://data/out.zarr", "gs://data/out.h5", "https://host/out.zarr?X-Amz-Signature=SECRETSIG",
                                 "s3://AKIDSECRET:SECRETKEY@data/out.zarr"])
def test_convert_refuses_a_remote_destination_before_any_work(tmp_path, capsys, monkeypatch, dst):
    monkeypatch.chdir(tmp_path)
    np.save("a.npy", np.arange(24, dtype="f4").reshape(4, 6))
    before = sorted(os.listdir(tmp_path))

    def read_nothing(*a, **kw):  # refused before SRC is even opened
        raise AssertionError("SRC was read")

    import dali_mesh.cli.convert as convert

    monkeypatch.setattr(convert, "open_samples", read_nothing)
    assert main(["convert", "a.npy", dst, *MESH, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "is not local" in err and "writes only to local paths" in err
    _no_secret(out, err)
    assert sorted(os.listdir(tmp_path)) == before  # no s3:/, gs:/, https:/ folder, no partial copy


def test_convert_writes_a_file_url_destination_as_its_local_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = np.arange(48, dtype="f4").reshape(4, 12)
    np.save("a.npy", a)
    dst = tmp_path / "out.zarr"
    assert main(["convert", "a.npy", f"file://{dst}", *MESH, "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {dst} ")
    np.testing.assert_array_equal(zarr.open_array(str(dst), path="data", mode="r")[0], a)
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "out.zarr"]


# ---- finding 17: the message of a store without the array -----------------------------------------------------
def test_plan_of_a_store_without_an_array_says_so_in_plain_words(tmp_path, capsys):
    (tmp_path / "nothing.zarr").mkdir()
    assert main(["plan", "--data", str(tmp_path / "nothing.zarr"), *MESH]) == 2
    err = capsys.readouterr().err
    assert "has no array at the store's root" in err and "has no the" not in err
