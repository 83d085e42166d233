"""Bounded fuzz of the remote stores' XML readers (csrc/storage/http_text.cc: ``ReadListing``, a
ListObjectsV2 page, and ``ErrorCode``, an error body's <Code> and <Message>; expat reads both) under
AddressSanitizer and UndefinedBehaviorSanitizer.

Valid pages (a default namespace, a prefix, EncodingType url, references and CDATA, nested elements the
listing does not read) and error bodies are mutated a few thousand times with a fixed seed: bit flips,
bytes overwritten by XML's own tokens (``<``, ``&#0;``, ``]]>``, a document type, ``%00``), truncations,
slices repeated, character data put in after tags (references, CDATA, ``%00``, a Size, an element),
elements nested deep. A harness (tests/storage/listing_fuzz_main.cc) built with
``-fsanitize=address,undefined`` reads each from a buffer of exactly its size. Every case must end in a
page or a reason, never a sanitizer report; and each page must equal ElementTree's reading of the same
bytes (the listing's rules applied to its tree: a page ElementTree refuses is refused, one it reads is
read to the same keys, sizes, tags, prefixes and continuation). expat itself is not instrumented (it is
fuzzed upstream, by OSS-Fuzz)."""
from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
import urllib.parse
import xml.etree.ElementTree as ET

import pytest

from dali_mesh.storage.listing import read_page
from tests.helpers import ROOT

SEED = 20261207
MUTANTS_PER_SEED = 400
SECRET = "SECRET-OF-THE-FUZZ-0123456789"  # as listing_fuzz_main.cc gives ErrorCode
NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'

SEEDS = [
    f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult {NS}><Name>data</Name><Prefix>x/</Prefix>'
    "<KeyCount>2</KeyCount><IsTruncated>true</IsTruncated><NextContinuationToken>1ab/cd+ef=</NextContinuationToken>"
    "<Contents><Key>x/a&amp;b&lt;c&gt;&#233;.bin</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
    "<ETag>&quot;e1&quot;</ETag><Size> 12 </Size><Owner><ID>o</ID></Owner><StorageClass>STANDARD</StorageClass>"
    "</Contents><Contents><Key><![CDATA[x/<c>&.bin]]></Key><Size>0</Size><ETag/></Contents>"
    "<CommonPrefixes><Prefix>x/sub/</Prefix></CommonPrefixes></ListBucketResult>",
    '<s3:ListBucketResult xmlns:s3="http://s3.amazonaws.com/doc/2006-03-01/"><s3:EncodingType>url</s3:EncodingType>'
    "<s3:Contents><s3:Key>x/sp%20ace%2Bplus%25.bin</s3:Key><s3:Size>3</s3:Size><s3:ETag>\"e2\"</s3:ETag>"
    "</s3:Contents><s3:CommonPrefixes><s3:Prefix>x/%C3%A9/</s3:Prefix></s3:CommonPrefixes>"
    "<s3:IsTruncated>TRUE</s3:IsTruncated><s3:NextContinuationToken>t%00</s3:NextContinuationToken>"
    "</s3:ListBucketResult>",
    "<ListBucketResult>\n  <IsTruncated>false</IsTruncated>\n  <Contents>\n    <Key>x/1</Key>\n    <Size>1</Size>\n"
    "  </Contents>\n  <!-- a comment --><?pi x?>\n</ListBucketResult>\n",
    f"<Error><Code>AccessDenied</Code><Message>no {SECRET} &amp; sig=abcdefabcdef0123456789</Message>"
    "<Resource>/data/x</Resource></Error>",
]
TOKENS = [b"<", b">", b"&", b"&#0;", b"&#x10FFFF;", b"&e;", b"]]>", b"<![CDATA[", b"</", b"/>", b":", b"%00",
          b"<!DOCTYPE x>", b'<!DOCTYPE x [<!ENTITY e "y">]>', b"<?xml?>", b"\x00", b"\xff", b"\r", b"<a>" * 70]

TEXT = [b"%00", b"%2", b"%41%c3%a9", b"%zz", b"&amp;", b"&#x1F600;", b"&#13;", b" ", b"\r\n", b"\t",
        b"<![CDATA[&<]]>", b"<!--c-->", b"9", b"-1", b"true", b"url", b"<x/>", b"<Size>7</Size>", b"\xc3\xa9"]


def _mutants(rng: random.Random, seed: bytes):
    for _ in range(MUTANTS_PER_SEED):
        b = bytearray(seed)
        kind = rng.randrange(7)
        if kind == 0:  # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a token of XML's over a run, or put in
            i = rng.randrange(len(b) + 1)
            b[i:i + rng.randrange(3)] = rng.choice(TOKENS)
        elif kind == 2:  # cut
            del b[rng.randrange(len(b)):]
        elif kind == 3:  # a slice repeated
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randint(1, 80))
            b[j:j] = b[i:j] * rng.randint(1, 3)
        elif kind in (4, 5):  # character data put in after a tag (most such pages stay XML)
            ends = [i + 1 for i, c in enumerate(b) if c == ord(">")]
            for _ in range(rng.randint(1, 3)):
                i = rng.choice(ends)
                b[i:i] = rng.choice(TEXT)
        else:  # two mutations of kinds 0 and 1
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice(TOKENS)
        yield bytes(b)


class _Tree(ET.TreeBuilder):
    """ElementTree's builder, noting a document type (the C++ reader refuses one; ElementTree reads it)."""

    doctype_seen = False

    def doctype(self, name, pubid, system) -> None:
        self.doctype_seen = True


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _depth(e) -> int:
    return 1 + max((_depth(c) for c in e), default=0)


def _text(e) -> bytes:
    """The element's character data since its last tag (a leaf's text), as the C++ reader takes it."""
    return ((e[-1].tail if len(e) else e.text) or "").encode("utf-8")


def _expected(body: bytes):
    """ElementTree's reading of ``body`` with the listing's rules: ``None`` (refused), a page
    ``(objects, prefixes, next)``, or ``"skip"`` (an encoding only Python's codecs know)."""
    declared = re.match(rb"<\?xml[^>]*encoding=[\"']([^\"']*)", body)
    if declared and declared.group(1).lower() not in (b"utf-8", b"utf-16", b"iso-8859-1", b"us-ascii"):
        return "skip"  # an encoding expat does not know, which Python's codecs may
    tree = _Tree()
    try:
        parser = ET.XMLParser(target=tree)
        parser.feed(body)
        root = parser.close()
    except ET.ParseError:
        return None
    if tree.doctype_seen or _depth(root) > 64 or _local(root.tag) != "ListBucketResult":
        return None
    objects, prefixes, token, truncated, url = [], [], b"", False, False
    for child in root:
        name = _local(child.tag)
        if name == "Contents":
            key, size, tag = b"", -1, b""
            for leaf in child:
                value = _text(leaf)
                if _local(leaf.tag) == "Key":
                    key = value
                elif _local(leaf.tag) == "ETag":
                    tag = value
                elif _local(leaf.tag) == "Size":
                    digits = value.strip(b" \t\r\n")
                    if not digits or len(digits) > 18 or not digits.isdigit():
                        return None
                    size = int(digits)
            objects.append([key, size, tag])
        elif name == "CommonPrefixes":
            prefixes += [_text(p) for p in child if _local(p.tag) == "Prefix"]
        elif name == "IsTruncated":
            truncated = bytes(c for c in _text(child) if c not in b" \t\n\v\f\r").lower() == b"true"
        elif name == "NextContinuationToken":
            token = _text(child)
        elif name == "EncodingType":
            url = _text(child) == b"url"
        # a Size anywhere deeper is not the listing's
    decode = urllib.parse.unquote_to_bytes if url else (lambda t: t)
    for o in objects:
        o[0] = b"data/" + decode(o[0])
    prefixes = [b"data/" + decode(p) for p in prefixes]
    if any(b"\0" in o[0] for o in objects) or any(b"\0" in p for p in prefixes) or b"\0" in token:
        return None
    if truncated and not token:  # the rest cannot be asked for: refused, never taken as the whole listing
        return None
    return [tuple(o) for o in objects], prefixes, token if truncated else b""


def _build(tmp_path) -> str:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    for header in ("expat.h", "curl/curl.h"):
        if not any(os.path.exists(os.path.join(d, header)) for d in ("/usr/include", "/usr/include/x86_64-linux-gnu")):
            pytest.skip(f"no <{header}>: the remote stores are not built here")
    exe = str(tmp_path / "listing_fuzz")
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=all", "-DDALI_MESH_HAVE_CURL=1", f"-I{ROOT}/csrc",
           f"{ROOT}/csrc/storage/http_text.cc", f"{ROOT}/csrc/storage/byte_store.cc",
           f"{ROOT}/tests/storage/listing_fuzz_main.cc", "-o", exe, "-lexpat", "-lcurl", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "sanitize" in done.stderr and "cannot find" in done.stderr:
        pytest.skip(f"the compiler has no sanitizer runtime: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return exe


def _answers(out: bytes):
    at = 0
    while at < len(out):
        (n,) = struct.unpack_from("<I", out, at)
        yield out[at + 4:at + 4 + n]
        at += 4 + n


@pytest.mark.timeout(600)
def test_the_xml_readers_take_mutated_pages_as_elementtree_does_without_a_sanitizer_report(tmp_path):
    exe = _build(tmp_path)
    rng = random.Random(SEED)
    cases = [s.encode() for s in SEEDS]
    for seed in list(cases):
        cases += _mutants(rng, seed)
    cases.append(b"<ListBucketResult>" + b"<a>" * 200_000)  # deep: refused at 64, nothing kept of the rest
    cases.append(b"<ListBucketResult>" + b"<Contents><Key>x/k</Key><Size>1</Size></Contents>" * 20_000
                 + b"</ListBucketResult>")  # a long page
    path = tmp_path / "cases"
    path.write_bytes(b"".join(struct.pack("<I", len(c)) + c for c in cases))
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86", UBSAN_OPTIONS="print_stacktrace=1")
    done = subprocess.run([exe, str(path)], capture_output=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    answers = list(_answers(done.stdout))
    assert len(answers) == 2 * len(cases)
    read = refused = 0
    for body, page, error in zip(cases, answers[0::2], answers[1::2]):
        assert SECRET.encode() not in error and len(error) < 1000, (body, error)
        want = _expected(body)
        if want == "skip":
            continue
        if want is None:
            assert page[:1] == b"R", (body, page)
            refused += 1
            continue
        assert page[:1] == b"A", (body, page)
        got = read_page(page[1:])
        assert got.received == len(body)
        key = lambda k: k.encode("utf-8", "surrogateescape")  # noqa: E731 - read_page's keys back to bytes
        assert ([(key(k), v.size, v.tag.encode()) for k, v in got.objects], [key(p) for p in got.prefixes],
                got.next) == want, body
        read += 1
    # the seeds are read as they say; the error body gives its code, its secret withheld
    assert answers[2 * 3 + 1] == b"AccessDenied: no [withheld] & [withheld]"
    assert read > 200 and refused > 200, (read, refused)
    print(f"{len(cases)} cases: {read} read as ElementTree reads them, {refused} refused as it refuses them")
