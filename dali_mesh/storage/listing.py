"""A store's listing as the native stores give it: one page of ``dali_mesh_store_list``
(csrc/c_api/store_api.cc, ``EncodedListing``) read into values (:func:`read_page`), and a whole listing
read page by page within bounds (:func:`list_all`). The remote stores and the memory store list through
it; S3's XML is read once, in C++ (csrc/storage/http_text.cc ``ReadListing``).

A page is records, each a letter and length-prefixed fields (``<decimal length>:<bytes>``), so a key may
hold any byte::

    o key size tag    an object (size: decimal text)
    p prefix          a prefix one level down (ends with '/')
    n next            the next page's continuation (absent: the last page)
    r received        the bytes of the store's answer (decimal text)
"""
from __future__ import annotations

import ctypes
from typing import Callable, NamedTuple

from dali_mesh.storage.byte_store import Version
from dali_mesh.storage.errors import DataFileError

__all__ = ["LIST_BYTES", "LIST_PAGES", "LIST_PAGE_BYTES", "Page", "list_all", "read_page"]

#: the most one listing's pages and bytes may be (S3 pages hold 1,000 keys of ~300 bytes: 13 million objects), and
#: the most bytes of one page (as csrc/storage/http_store.h HttpStore::kListPageBytes, which stops an answer there)
LIST_PAGES = 100_000
LIST_BYTES = 4 << 30
LIST_PAGE_BYTES = 16 << 20


class Page(NamedTuple):
    """One page: ``objects`` (key, version), ``prefixes``, ``next`` (the continuation, ``b""`` on the last
    page) and ``received`` (the bytes of the store's answer, or of the page where it received none)."""

    objects: list[tuple[str, Version]]
    prefixes: list[str]
    next: bytes
    received: int


def _key(raw: bytes) -> str:
    # surrogateescape: a key of bytes that are not UTF-8 is given back to the store as those bytes
    return raw.decode("utf-8", "surrogateescape")


def read_page(data: bytes) -> Page:
    """The page ``data`` (see the module's doc); a ``ValueError`` for bytes that are not one."""
    fields: list[bytes] = []
    objects, prefixes, nxt, received = [], [], b"", 0
    arity = {b"o": 3, b"p": 1, b"n": 1, b"r": 1}
    at, end = 0, len(data)
    while at < end:
        kind = data[at:at + 1]
        if kind not in arity:
            raise ValueError(f"a listing page holds a record {kind!r} at byte {at}")
        at += 1
        fields.clear()
        for _ in range(arity[kind]):
            colon = data.find(b":", at, at + 21)
            if colon < 0 or not data[at:colon].isdigit():
                raise ValueError(f"a listing page's field at byte {at} has no length")
            at, n = colon + 1, int(data[at:colon])
            if at + n > end:
                raise ValueError(f"a listing page's field at byte {at} runs past its end")
            fields.append(data[at:at + n])
            at += n
        if kind == b"o":
            objects.append((_key(fields[0]), Version(int(fields[1]), -1, fields[2].decode("utf-8", "replace"))))
        elif kind == b"p":
            prefixes.append(_key(fields[0]))
        elif kind == b"n":
            nxt = fields[0]
        else:
            received = int(fields[0])
    return Page(objects, prefixes, nxt, received or len(data))


def fetch_page(call: Callable, most_bytes: int) -> Page:
    """One page through ``call(out, size)`` (``dali_mesh_store_list`` of a store, its other arguments
    given: the page's length n, written to ``out`` when ``size > n``; a store's error raised by
    ``call``), in a buffer grown as the page asks, up to ``most_bytes``."""
    size = 1 << 20
    while True:
        out = ctypes.create_string_buffer(size)
        n = call(out, size)
        if n < size:
            page = read_page(ctypes.string_at(out, n))
            break
        if n > most_bytes:
            raise OverflowError(n)
        size = n + 1
    if page.received > most_bytes:
        raise OverflowError(page.received)
    return page


def list_all(call: Callable, name: str, *, pages: int | None = None, most_pages: int = LIST_PAGES,
             most_bytes: int = LIST_BYTES,
             page_bytes: int = LIST_PAGE_BYTES) -> tuple[list[tuple[str, Version]], list[str], bool]:
    """The objects and prefixes of a listing of at most ``pages`` pages (``None``: every one), read through
    ``call(continuation, out, size)`` (``dali_mesh_store_list`` of a store for one page, see
    :func:`fetch_page`): ``(objects, prefixes, complete)``, ``complete`` False when it goes on past them.
    A listing that would never end is a :class:`~dali_mesh.storage.errors.DataFileError` naming ``name``:
    a continuation given before, more than ``most_pages`` pages or ``most_bytes`` bytes, a page of more
    than ``page_bytes``."""
    objects, prefixes, token = [], [], b""
    tokens: set[bytes] = set()
    done, got = 0, 0
    while True:
        try:
            page = fetch_page(lambda out, size: call(token, out, size), page_bytes)
        except OverflowError as e:
            raise DataFileError(name, f"a listing page of {e.args[0]} bytes, more than {page_bytes} (the most one "
                                      "page may be): a broken server; nothing of the listing is used") from None
        except ValueError as e:
            raise DataFileError(name, f"{e}: nothing of the listing is used") from None
        done, got = done + 1, got + page.received
        objects += page.objects
        prefixes += page.prefixes
        token = page.next
        if not token:
            return objects, prefixes, True
        if pages is not None and done >= pages:
            return objects, prefixes, False
        # a server that never ends its listing would hold this loop and its memory for ever
        if token in tokens:
            raise DataFileError(name, f"the listing's page {done} gives a continuation token given before: it "
                                      "would never end (a broken server); nothing of it is used")
        if done >= most_pages or got >= most_bytes:
            raise DataFileError(name, f"the listing goes on after {done} pages and {got} bytes (the most read: "
                                      f"{most_pages} pages, {most_bytes} bytes); list a narrower prefix")
        tokens.add(token)
