"""The remote stores' clients against servers that answer wrongly on purpose (issue 40): redirects to
another host, bodies sent a byte at a time, bodies far longer than the range asked for, listings that
never end, answers that ignore If-Match and name no ETag, error messages that echo the request's
credentials, presigned URLs' queries. Each server is a loopback one of this file (nothing reaches beyond
127.0.0.1); keys with special characters are read from moto, uploaded with boto3.

Every test runs the one client of remote objects, libcurl's (csrc/storage/http_store.cc)."""
from __future__ import annotations

import http.server
import re
import socket
import threading
import time
import tracemalloc

import pytest

from dali_mesh.storage import DataFileError, FileChangedError, store_of
from dali_mesh.storage import listing as listing_module
from dali_mesh.storage.credentials import Credentials
from dali_mesh.storage.listing import LIST_PAGE_BYTES
from dali_mesh.storage.remote import RemoteStore, have_native_http
from tests.storage.s3_server import KEY, SECRET, client, options, s3_endpoint  # noqa: F401

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(60)]

TOKEN = "FwoGZXIvYXdzEJr-SESSION-TOKEN-OF-THE-TESTS-7f3a9c"
#: quick settings: every test ends in seconds
FAST = {"retries": 0, "retry_seconds": 5, "stall": 1, "timeout": 1.5}


# ---- a loopback server whose answers each test writes ----------------------------------------------------
class Loopback:
    """A threaded HTTP/1.1 server on 127.0.0.1 answering each request with ``answer(handler)``; it records
    ``(method, path, headers)`` of each request (header names in lower case) and counts the body bytes its answers wrote."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict]] = []
        self.sent = 0
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self.serve()

            def do_HEAD(self) -> None:  # noqa: N802
                self.serve()

            def serve(self) -> None:
                with owner.lock:
                    owner.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                try:
                    owner.answer(self)
                except OSError:  # the client went away
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Loopback":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def write(self, h, data: bytes) -> None:
        h.wfile.write(data)
        with self.lock:
            self.sent += len(data)


def send(h, status: int, headers: dict, body: bytes = b"") -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def s3_store(endpoint: str, key: str = "data/x.bin", **settings):
    """``(store, key)`` of ``s3://key`` at ``endpoint``, signed with the tests' key, secret and a session
    token, with :data:`FAST` settings (``settings`` override them)."""
    return store_of(f"s3://{key}", options(endpoint, token=TOKEN, **{**FAST, **settings}))


def no_secret(text: str) -> str:
    for secret in (SECRET, TOKEN, KEY):
        assert secret not in text, text
    assert "Signature=" not in text and "AWS4-HMAC-SHA256" not in text, text
    return text


# ---- finding 4: no redirect is followed --------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 307])
@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_a_redirect_to_another_host_is_an_error_and_that_host_gets_nothing(status, method):
    with Loopback(lambda h: send(h, 200, {"Content-Length": "0"})) as other:
        def redirect(h):
            send(h, status, {"Location": f"{other.endpoint}{h.path}", "Content-Length": "0"})

        with Loopback(redirect) as first:
            store, key = s3_store(first.endpoint)
            with pytest.raises(DataFileError) as info:
                store.stat(key) if method == "HEAD" else store.read_range(key, 0, 100)
            msg = no_secret(str(info.value))
            assert [m for m, _, _ in first.requests] == [method]
            assert "authorization" in first.requests[0][2]  # it was signed, with the session token
            assert first.requests[0][2].get("x-amz-security-token") == TOKEN
            assert other.requests == []  # neither the request nor its Authorization went there
            assert f"HTTP {status}" in msg and "s3://data/x.bin" in msg
            assert "redirects are not followed" in msg


# ---- finding 13: one deadline per request, bodies capped ---------------------------------------------------
@pytest.mark.parametrize("slow", ["body", "headers"])
def test_a_server_sending_a_byte_at_a_time_is_stopped_at_the_timeout(slow):
    """A byte every 0.2 s never trips stall=1 (each read of the socket gets one); timeout=1.5 bounds the
    whole request, headers and body."""
    size = 400

    def trickle(h):
        head = (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {size}\r\nContent-Range: bytes 0-{size - 1}/{size}"
                f"\r\nETag: \"v1\"\r\n\r\n").encode()
        if slow == "body":
            h.wfile.write(head)
        for b in (head if slow == "headers" else b"") + b"\0" * size:
            h.wfile.write(bytes([b]))
            h.wfile.flush()
            if server.stopped.wait(0.2):
                return

    with Loopback(trickle) as server:
        store, key = s3_store(server.endpoint)
        t0 = time.monotonic()
        with pytest.raises(DataFileError) as info:
            store.read_range(key, 0, size)
        elapsed = time.monotonic() - t0
        msg = no_secret(str(info.value))
    assert elapsed < 4, elapsed  # 80 s of trickle
    assert "bytes 0-399" in msg and "after 1 attempt" in msg
    # libcurl's stall watch counts body bytes only: silent headers are a stall
    assert "Timeout" in msg or "stalled" in msg, msg


@pytest.mark.parametrize("length", [8 << 30, None])  # a Content-Length of 8 GiB, or none (till closed)
def test_a_200_with_a_huge_body_to_a_ranged_get_is_read_no_further_than_the_range(length):
    """The server ignores the Range and streams zeros (at most 256 MiB, then it closes): the client stops
    after the range's length, keeps no more than that in memory, and says why."""
    cap = 256 << 20

    def huge(h):
        h.send_response(200)
        h.send_header("ETag", '"v1"')
        if length is not None:
            h.send_header("Content-Length", str(length))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        zeros = b"\0" * (1 << 20)
        while server.sent < cap and not server.stopped.is_set():
            server.write(h, zeros)
        h.close_connection = True

    with Loopback(huge) as server:
        store, key = s3_store(server.endpoint, timeout=20)
        tracemalloc.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(DataFileError) as info:
                store.read_range(key, 0, 1000)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        msg = no_secret(str(info.value))
        time.sleep(0.2)  # the server sees the connection gone
        sent = server.sent
    assert "more bytes than the range asked for" in msg and "HTTP 200" in msg and "bytes 0-999" in msg
    assert sent < 64 << 20, sent  # what loopback's socket buffers took, not the body
    assert peak < 8 << 20, peak
    assert time.monotonic() - t0 < 10


def test_a_listing_page_without_end_is_capped():
    """A listing answer (no Range) streams without end: the client reads at most LIST_PAGE_BYTES bytes
    (csrc/storage/http_store.h kListPageBytes)."""
    MAX_BODY = LIST_PAGE_BYTES

    def endless(h):
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        server.write(h, b"<ListBucketResult>")
        while server.sent < 4 * MAX_BODY and not server.stopped.is_set():
            server.write(h, b" " * (1 << 20))

    with Loopback(endless) as server:
        store, _ = s3_store(server.endpoint)
        with pytest.raises(DataFileError) as info:
            store.list("data/x/")
        time.sleep(0.2)
        assert server.sent < MAX_BODY + (48 << 20), server.sent
    assert f"more bytes than {MAX_BODY}" in str(info.value) and "listing page" in str(info.value)


# ---- finding 8: listings that never end ----------------------------------------------------------------------
def listing(token: str, n: int) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>data</Name><Prefix>x/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
            f"<Contents><Key>x/{n}.bin</Key><Size>10</Size><ETag>&quot;e{n}&quot;</ETag></Contents>"
            f"</ListBucketResult>").encode()


@pytest.mark.parametrize("tokens", ["same", "new"])
def test_a_listing_that_never_ends_is_an_error(tokens, monkeypatch):
    """Every page says IsTruncated=true: with the same continuation token (stopped at its second page),
    or with a new one each time (stopped at LIST_PAGES pages, made 30 here)."""
    monkeypatch.setattr(listing_module, "LIST_PAGES", 30)
    pages = []

    def answer(h):
        pages.append(h.path)
        body = listing("same-token" if tokens == "same" else f"token-{len(pages)}", len(pages))
        send(h, 200, {"Content-Length": str(len(body)), "Content-Type": "application/xml"}, body)

    with Loopback(answer) as server:
        store, _ = s3_store(server.endpoint)
        t0 = time.monotonic()
        with pytest.raises(DataFileError) as info:
            store.list("data/x/")
        assert time.monotonic() - t0 < 20
    msg = no_secret(str(info.value))
    assert "s3://data/x/" in msg
    if tokens == "same":
        assert "continuation token given before" in msg and len(pages) == 2
        assert "continuation-token=same-token" in pages[1]
    else:
        assert "goes on after 30 pages" in msg and len(pages) == 30


def test_a_listing_truncated_without_a_token_is_an_error_not_the_whole_listing():
    """A page that says IsTruncated=true but names no NextContinuationToken (a ListObjects V1 answer, from
    a gateway that ignores list-type=2): the rest cannot be asked for. Before, the page was taken as the
    whole listing, and a Zarr array's chunks past it read as missing (fill values)."""
    pages = []

    def answer(h):
        pages.append(h.path)
        body = listing("", 1).replace(b"<NextContinuationToken></NextContinuationToken>", b"<NextMarker>x/1.bin</NextMarker>")
        send(h, 200, {"Content-Length": str(len(body)), "Content-Type": "application/xml"}, body)

    with Loopback(answer) as server:
        store, _ = s3_store(server.endpoint)
        with pytest.raises(DataFileError, match="truncated .* names no NextContinuationToken") as info:
            store.list("data/x/")
    assert "s3://data/x/" in no_secret(str(info.value)) and len(pages) == 1


def test_a_listing_larger_than_its_byte_bound_is_an_error(monkeypatch):
    monkeypatch.setattr(listing_module, "LIST_BYTES", 5000)

    def answer(h):
        body = listing(f"token-{len(server.requests)}", len(server.requests))
        send(h, 200, {"Content-Length": str(len(body))}, body)

    with Loopback(answer) as server:
        store, _ = s3_store(server.endpoint)
        with pytest.raises(DataFileError, match="list a narrower prefix"):
            store.list("data/x/")
        page = len(listing("token-1", 1))
        assert 5000 // page <= len(server.requests) <= 5000 // page + 2  # no further than the bound


def _one_page(body: bytes):
    """What ``store.list("data/x/")`` gives, or the DataFileError it raises, when every listing page is ``body``."""
    with Loopback(lambda h: send(h, 200, {"Content-Length": str(len(body))}, body)) as server:
        store, _ = s3_store(server.endpoint)
        try:
            return store.list("data/x/")
        except DataFileError as e:
            return e


def test_a_listing_page_is_read_as_xml_reads_it():
    """The C++ reader of a ListObjectsV2 page (csrc/storage/http_text.cc ReadListing) against ElementTree's
    reading of the same page: references, CDATA, a namespace prefix, comments, empty elements, keys
    percent-encoded where the page says EncodingType url (a truncated page without a token is refused: below)."""
    import xml.etree.ElementTree as ET
    import urllib.parse

    pages = [
        '<?xml version="1.0"?><!-- a comment --><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<IsTruncated>false</IsTruncated><Contents><Key>x/a&amp;b&lt;c&gt;&quot;d&apos;&#233;&#x2603;.bin</Key>"
        "<Size> 12 </Size><ETag>&quot;e1&quot;</ETag></Contents><Contents><Key><![CDATA[x/<cdata>&amp;.bin]]></Key>"
        "<Size>0</Size><ETag/></Contents><CommonPrefixes><Prefix>x/sub/</Prefix></CommonPrefixes></ListBucketResult>",
        '<s3:ListBucketResult xmlns:s3="http://s3.amazonaws.com/doc/2006-03-01/"><s3:EncodingType>url</s3:EncodingType>'
        "<s3:Contents><s3:Key>x/sp%20ace%2Bplus%25.bin</s3:Key><s3:Size>3</s3:Size><s3:ETag>\"e2\"</s3:ETag>"
        "</s3:Contents><s3:CommonPrefixes><s3:Prefix>x/%C3%A9/</s3:Prefix></s3:CommonPrefixes>"
        "<s3:IsTruncated>false</s3:IsTruncated></s3:ListBucketResult>",
    ]
    for page in pages:
        root = ET.fromstring(page)
        ns = root.tag[: root.tag.index("}") + 1]
        url = root.findtext(f"{ns}EncodingType") == "url"
        name = (lambda t: urllib.parse.unquote(t or "")) if url else (lambda t: t or "")
        want = ([(f"data/{name(c.findtext(f'{ns}Key'))}", (int(c.findtext(f"{ns}Size")), c.findtext(f"{ns}ETag") or ""))
                 for c in root.iter(f"{ns}Contents")],
                [f"data/{name(p.findtext(f'{ns}Prefix'))}" for p in root.iter(f"{ns}CommonPrefixes")])
        got = _one_page(page.encode())
        assert ([(k, (v.size, v.tag)) for k, v in got[0]], got[1]) == want


@pytest.mark.parametrize("page, why", [
    ("<ListBucketResult><Contents><Key>x/a&#0;b</Key></Contents></ListBucketResult>", "a reference that is not XML"),
    ("<ListBucketResult><EncodingType>url</EncodingType><Contents><Key>x/a%00b</Key></Contents></ListBucketResult>",
     "a key holds a NUL"),
    ('<!DOCTYPE x [<!ENTITY e "x/evil">]><ListBucketResult><Contents><Key>&e;</Key></Contents></ListBucketResult>',
     "a document type"),
    ("<ListBucketResult><Contents><Key>x/a</Key><Size>-1</Size></Contents></ListBucketResult>", "a Size that is not"),
    ("<ListBucketResult><Contents><Key>x/a</Key></ListBucketResult>", "closes no element open"),
    ("<ListBucketResult><Contents>", "is not closed"),
    ("<Error><Code>x</Code></Error>", "its root is <Error>"),
    ("<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>x/a</Key><Size>1</Size></Contents>"
     "</ListBucketResult>", "names no NextContinuationToken"),
    ("", "no <ListBucketResult>"),
])
def test_a_listing_page_that_is_no_listing_is_refused_whole(page, why):
    """A page the reader cannot take whole is an error naming the listing and why; nothing of it is used (a
    key cut at a NUL would name another object)."""
    got = _one_page(page.encode())
    assert isinstance(got, DataFileError), got
    assert "s3://data/x/" in str(got) and why in str(got) and "not a ListObjectsV2 page" in str(got)


_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
           + "".join(f'<!ENTITY lol{i + 1} "{f"&lol{i};" * 10 if i else "&lol;" * 10}">' for i in range(9))
           + ']><ListBucketResult><Contents><Key>&lol9;</Key></Contents></ListBucketResult>')


@pytest.mark.parametrize("page, why", [
    (_LAUGHS, "a document type"),  # a billion laughs: 10**9 "lol"s, never expanded
    ('<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><ListBucketResult><Contents><Key>&e;</Key></Contents>'
     "</ListBucketResult>", "a document type"),  # an external entity: never read
    ('<!DOCTYPE x [<!ENTITY % p SYSTEM "http://127.0.0.1:9/x.dtd"> %p;]><ListBucketResult/>', "a document type"),
    ('<!DOCTYPE ListBucketResult><ListBucketResult/>', "a document type"),
    ("<ListBucketResult><Contents><Key>x/&e;</Key></Contents></ListBucketResult>", "a reference that is not XML's"),
    ("<ListBucketResult><Contents><Key>x/&#xD800;</Key></Contents></ListBucketResult>", "a reference that is not XML"),
    ("<ListBucketResult/><ListBucketResult/>", "after its root"),
    ("<ListBucketResult><Contents><Key>x/a\x01b</Key></Contents></ListBucketResult>", "not XML"),
    ("<ListBucketResult>" + "<a>" * 64 + "</a>" * 64 + "</ListBucketResult>", "nested more than 64 deep"),
    ("<ListBucketResult>" + "<a>" * 400_000, "nested more than 64 deep"),
    ("<ListBucketResult><Contents><Key>x/a</Key><Size>1</Size></Contents><![CDATA[", "not XML"),
])
def test_a_listing_page_with_xmls_hazards_is_refused_by_its_parser(page, why):
    """expat reads the pages (csrc/storage/http_text.cc): a document type is refused where it starts, so that
    no entity is declared or expanded (a billion laughs, an external entity or DTD: nothing is fetched or read),
    references to entities not XML's and to no character are refused, and elements nest at most 64 deep
    (a ListObjectsV2 page nests 4); each refusal names where expat stopped."""
    t0 = time.monotonic()
    got = _one_page(page.encode())
    assert time.monotonic() - t0 < 10
    assert isinstance(got, DataFileError), got
    assert "not a ListObjectsV2 page" in str(got) and why in str(got) and "line 1, column " in str(got), str(got)


def test_a_listing_page_nested_and_encoded_as_its_declaration_says_is_read_as_xml_reads_it():
    """Elements S3 nests in a page that the listing does not read (Owner, RestoreStatus: within the depth
    bound), one 63 deep, and a page in the encoding its declaration names (ISO-8859-1 bytes), against
    ElementTree's reading of the same bytes."""
    import xml.etree.ElementTree as ET

    body = ('<?xml version="1.0" encoding="ISO-8859-1"?><ListBucketResult><Contents><Key>x/caf\xe9.bin</Key>'
            "<Size>5</Size><ETag>\"e\"</ETag><Owner><ID>o</ID><DisplayName>d</DisplayName></Owner><RestoreStatus>"
            "<IsRestoreInProgress>false</IsRestoreInProgress></RestoreStatus></Contents>" + "<a>" * 63 + "</a>" * 63
            + "</ListBucketResult>").encode("latin-1")
    root = ET.fromstring(body)
    want = [(f"data/{c.findtext('Key')}", (int(c.findtext("Size")), c.findtext("ETag"))) for c in root.iter("Contents")]
    assert want == [("data/x/caf\xe9.bin", (5, '"e"'))]
    got = _one_page(body)
    assert [(k, (v.size, v.tag)) for k, v in got[0]] == want and got[1] == []


# ---- finding 9: an answer to If-Match that names no ETag ------------------------------------------------------
def test_an_object_replaced_mid_read_by_a_server_ignoring_if_match_is_an_error():
    """The server ignores If-Match and its 206 answers name no ETag; between two reads of an opened object
    it replaces the object by another of the same size: the second read must fail, never give the new
    bytes."""
    size = 1000
    versions = [(b"A" * size, '"v1"'), (b"B" * size, '"v2"')]
    state = {"now": 0, "heads": 0, "replace_after_heads": None}

    def answer(h):
        data, etag = versions[state["now"]]
        if h.command == "HEAD":
            send(h, 200, {"Content-Length": str(size), "ETag": etag})
            state["heads"] += 1
            if state["heads"] == state["replace_after_heads"]:
                state["now"] = 1  # replaced, same size
            return
        first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers["Range"]).groups())
        last = min(last, size - 1)
        send(h, 206, {"Content-Length": str(last - first + 1), "Content-Range": f"bytes {first}-{last}/{size}"},
             data[first:last + 1])

    with Loopback(answer) as server:
        store, key = s3_store(server.endpoint)
        # opened at a HEAD's version, so that every read reaches the server (an open by GET keeps its first
        # bytes, and reads within them send nothing)
        o = store.open_version(key, store.stat(key))
        assert o.pread(100, 0) == b"A" * 100 and o.pread(100, 500) == b"A" * 100  # unchanged: read
        # each read checked: its GET, then the version asked again (a GET of one byte, which names no ETag here,
        # then a HEAD)
        assert [m for m, _, _ in server.requests] == ["HEAD"] + ["GET", "GET", "HEAD"] * 2
        # open (HEAD 4), the first read (GET, GET, HEAD 5): then the object is replaced
        state["replace_after_heads"] = 5
        o = store.open_version(key, store.stat(key))
        assert o.pread(100, 0) == b"A" * 100
        with pytest.raises(FileChangedError, match="replaced"):
            o.pread(100, 500)
        assert [m for m, _, _ in server.requests[-3:]] == ["GET", "GET", "HEAD"]  # the B bytes came, were not returned


# ---- finding 16: a server's words are stripped of credentials -------------------------------------------------
ECHOES = ["Authorization: {auth}", "The signature {sig} does not match; token {token}",
          "wrong key {key} or secret {secret}", "signature={sig}&token={token}"]


@pytest.mark.parametrize("status", [403, 503])
@pytest.mark.parametrize("echo", ECHOES)
def test_a_servers_message_echoing_the_request_shows_no_credential(status, echo):
    """The <Message> of an error (shown: it says what went wrong) echoes what the request carried."""
    def answer(h):
        auth = h.headers["Authorization"]
        said = echo.format(auth=auth[:150], sig=auth.rsplit("Signature=", 1)[1], token=TOKEN, key=KEY,
                           secret=SECRET)
        body = (f"<Error><Code>AccessDenied</Code><Message>{said}</Message><Resource>{h.path}</Resource>"
                f"</Error>").encode()
        send(h, status, {"Content-Length": str(len(body))}, body)

    with Loopback(answer) as server:
        store, key = s3_store(server.endpoint)
        with pytest.raises(DataFileError) as info:
            store.read_range(key, 0, 100)
        signature = server.requests[0][2]["authorization"].rsplit("Signature=", 1)[1]
    msg = no_secret(str(info.value))
    assert signature not in msg and signature[:16] not in msg
    assert f"HTTP {status} AccessDenied: " in msg and "withheld]" in msg  # "[withheld]", "[credentials withheld]"


# ---- contract A: an http store's query is a credential ---------------------------------------------------------
def _refs(text: str) -> str:
    """``text`` written as XML character references (&#NN;)."""
    return "".join(f"&#{ord(c)};" for c in text)


@pytest.mark.parametrize("body, shown, hidden", [
    # the message echoes the secret and the token written as character references: read as the text they
    # are, so that they are found and withheld
    (f"<Error><Code>AccessDenied</Code><Message>secret {_refs(SECRET)} token {_refs(TOKEN)}</Message></Error>",
     "AccessDenied: secret [withheld] token [withheld]", [SECRET, TOKEN, _refs(SECRET), _refs(TOKEN)[:40]]),
    ('<?xml version="1.0"?><s3:Error xmlns:s3="urn:x"><s3:Code>Slow&amp;Down</s3:Code>'
     "<s3:Message><![CDATA[a <b>]]> &lt;c&gt;</s3:Message></s3:Error>", "Slow&Down: a <b> <c>", []),
    # a body cut off (at 4 KiB, or by the server): what was read is shown
    ("<Error><Code>InternalError</Code><Message>We encountered an internal", "InternalError: We encountered an "
     "internal", []),
    # entities declared by the body are never read: no code, the status alone
    ('<!DOCTYPE e [<!ENTITY c "Forged">]><Error><Code>&c;</Code><Message>m</Message></Error>', "HTTP 403)",
     ["Forged"]),
    ("<html><body>403 Forbidden</body></html>", "HTTP 403)", ["Forbidden"]),
])
def test_a_servers_error_body_is_read_as_xml_reads_it(body, shown, hidden):
    """The <Code> and <Message> of an error body are read by expat (csrc/storage/http_text.cc ErrorCode):
    references and CDATA as XML reads them, credentials withheld from the text they are, a document type
    never read."""
    with Loopback(lambda h: send(h, 403, {"Content-Length": str(len(body.encode()))}, body.encode())) as server:
        store, key = s3_store(server.endpoint)
        with pytest.raises(DataFileError) as info:
            store.read_range(key, 0, 100)
    msg = no_secret(str(info.value))
    assert shown in msg and not any(h in msg for h in hidden), msg


def test_an_http_stores_query_goes_with_every_request_and_never_into_a_message():
    query = "X-Amz-Signature=0123456789abcdef0123456789abcdef&X-Amz-Security-Token=" + TOKEN
    data = bytes(range(256)) * 4

    def answer(h):
        if h.path.startswith("/missing"):
            body = f"<Error><Code>NoSuchKey</Code><Message>{h.path}</Message></Error>".encode()
            send(h, 404, {"Content-Length": str(len(body))}, body)
        elif h.path.startswith("/moved"):
            send(h, 307, {"Location": f"http://127.0.0.1:1{h.path}", "Content-Length": "0"})
        else:
            first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers["Range"]).groups())
            send(h, 206, {"Content-Length": str(last - first + 1), "Content-Range": f"bytes {first}-{last}/1024",
                          "ETag": '"e"'}, data[first:last + 1])

    with Loopback(answer) as server:
        store = RemoteStore("http", settings=dict(FAST), credentials=Credentials("", "", query), scheme="http")
        assert store.read_range(f"{server.endpoint}/a.bin", 10, 20) == data[10:30]
        assert server.requests[-1][1] == f"/a.bin?{query}"
        for path in ("missing.bin", "moved.bin"):
            with pytest.raises(DataFileError) as info:
                store.read_range(f"{server.endpoint}/{path}", 0, 10)
            msg = no_secret(str(info.value))
            assert "X-Amz" not in msg and "0123456789abcdef" not in msg and path in msg
            assert server.requests[-1][1] == f"/{path}?{query}"


# ---- finding 7: S3 keys are opaque bytes -------------------------------------------------------------------
KEYS = ["k/a.bin", "k/sub/../a.bin", "k/./a.bin", "k//a.bin", "k/q?x=1#frag.bin", "k/sp ace+plus.bin",
        "k/ünïcödé €.bin", "k/pct%41%2F.bin", "k/tilde~*'()!$&,;=@:.bin", "k/..", "k/."]


def test_keys_with_special_characters_and_dot_segments_are_read_as_named(s3_endpoint):
    """Each key holds other bytes (boto3 uploaded them); the client reads each by its own name:
    '?', '#', ' ', '+', unicode and '%' in the key, '..' and '.' never resolved."""
    s3 = client(s3_endpoint)
    want = {}
    for i, k in enumerate(KEYS):
        want[k] = f"object {i}: {k}".encode() * 7
        s3.put_object(Bucket="data", Key=f"special/{k}", Body=want[k])
    store, _ = store_of("s3://data/special/k/a.bin", options(s3_endpoint))
    for k in KEYS:
        key = f"data/special/{k}"
        assert store.read_range(key, 0, 10_000) == want[k], k
        o = store.open(key)
        assert o.version.size == len(want[k]) and o.pread(9, 3) == want[k][3:12], k
    listed = {name.removeprefix("data/special/") for name, _ in store.list("data/special/", delimiter=False)[0]}
    assert listed == set(KEYS)


def test_keys_with_special_characters_are_signed_as_a_checking_server_computes_it():
    """moto checking every SigV4 signature against an IAM user's key: each key's request is signed over
    the bytes sent (a wrong secret is refused, so the check is real)."""
    from tests.storage.s3_server import start_checking_server

    proc, endpoint, key, secret = start_checking_server()
    try:
        s3 = client(endpoint, key, secret)
        s3.create_bucket(Bucket="data")
        for k in KEYS:
            s3.put_object(Bucket="data", Key=f"special/{k}", Body=k.encode())
        store, _ = store_of("s3://data/x", {"key": key, "secret": secret, "endpoint_url": endpoint, **FAST})
        assert [store.read_range(f"data/special/{k}", 0, 1000) for k in KEYS] == [k.encode() for k in KEYS]
        wrong, _ = store_of("s3://data/x", {"key": key, "secret": secret + "x", "endpoint_url": endpoint, **FAST})
        with pytest.raises(DataFileError, match="SignatureDoesNotMatch"):
            wrong.read_range(f"data/special/{KEYS[1]}", 0, 10)
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_a_native_listing_page_over_its_bound_is_an_error(monkeypatch):
    """The native client returns a page's length when the buffer is too small: a page over
    LIST_PAGE_BYTES (made 1,000 here; a page here is 1.5 MiB, past the first 1 MiB buffer) is refused."""
    monkeypatch.setattr(listing_module, "LIST_PAGE_BYTES", 1000)
    body = listing("t", 1).replace(b"</ListBucketResult>", b" " * (3 << 19) + b"</ListBucketResult>")
    body = body.replace(b"<IsTruncated>true", b"<IsTruncated>false")  # one page: the bound alone stops it

    with Loopback(lambda h: send(h, 200, {"Content-Length": str(len(body))}, body)) as server:
        store, _ = s3_store(server.endpoint)
        with pytest.raises(DataFileError, match=f"a listing page of {len(body)} bytes, more than 1000"):
            store.list("data/x/")
