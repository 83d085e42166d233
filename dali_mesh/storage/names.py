"""How a location is shown: user info (any scheme) and an http(s) URL's query and fragment hidden, in a
nested location too (``reference://https://host/refs.json?X-Amz-Signature=...``).

A location may carry a credential: a presigned ``https://`` URL's query (``X-Amz-Signature``,
``X-Amz-Security-Token``) and user info (``s3://KEY:SECRET@bucket/...``). The stores' refusals and the
command line's output name locations through :func:`shown`. Only ``http(s)`` URLs have a query: an
``s3://`` or ``gs://`` key is opaque bytes and may hold a literal ``?`` or ``#``. A bucket followed by ``@`` and
a snapshot id (20 characters of Crockford base32: ``icechunk://s3://rootrepo@YJXNR2Q6WMH5PC80YF9G``, a
repository at a bucket's root, pinned) is no user info; no bucket name holds capitals.
"""
from __future__ import annotations

import os
import re

__all__ = ["HIDDEN", "PINNED_BUCKET", "name_of", "scheme_of", "shown", "split_location"]

#: what stands where a query, a fragment or user info was
HIDDEN = "\u2026"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_HTTP = ("http", "https")
#: ``<bucket>@<snapshot id>``: an Icechunk repository at a bucket's root, pinned (icechunk/repository.py's _PINNED)
PINNED_BUCKET = re.compile(r"(?P<bucket>.*)@[0-9A-HJKMNP-TV-Z]{20}")


def scheme_of(location) -> str | None:
    """The lower-case scheme of a ``scheme://...`` location, else ``None`` (a local path)."""
    scheme, sep, _ = os.fspath(location).partition("://")
    return scheme.lower() if sep and _SCHEME.fullmatch(scheme) else None


def split_location(location: str) -> tuple[str, str, str, str]:
    """``(scheme://, user info with its '@' or '', the rest up to any query, '?query' / '#fragment' or '')``
    of a URL; the query only for http(s). A nested location (``reference://https://host/refs.json?sig``,
    ``icechunk://s3://KEY:SECRET@bucket/repo``: a scheme whose rest is a location) is split at its innermost
    one: ``("reference://https://", "", "host/refs.json", "?sig")``."""
    scheme, _, rest = location.partition("://")
    head = scheme + "://"
    if scheme_of(rest) is not None:
        inner = split_location(rest)
        return (head + inner[0],) + inner[1:]
    query = ""
    if scheme.lower() in _HTTP:
        cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
        if cut >= 0:
            rest, query = rest[:cut], rest[cut:]
    authority = rest.split("/", 1)[0]
    pinned = PINNED_BUCKET.fullmatch(authority) if scheme.lower() not in _HTTP else None
    # a bucket's snapshot (rootrepo@<snapshot id>) is no user info: what is before it may be
    owner = pinned["bucket"] if pinned else authority
    if "@" in owner:  # KEY:SECRET@host: user info ends at the authority's last '@' (before a bucket's snapshot)
        at = owner.rindex("@") + 1
        return head, rest[:at], rest[at:], query
    host, colon, port = authority.rpartition(":")
    if colon and not port.isdigit() and not authority.startswith("[") and "@" in rest:  # [IPv6]: no user info
        # KEY:SECR/ET@bucket: a secret holding an unescaped '/' (AWS secrets often do) ends the authority
        # early; no bucket or host:port has such a ':', so the user info runs to the last '@'
        at = rest.rindex("@") + 1
        return head, rest[:at], rest[at:], query
    return head, "", rest, query


def shown(location) -> str:
    """``location`` as messages show it: user info (any scheme) and an http(s) URL's query and
    fragment replaced by ``\u2026`` (``https://host/a.h5?\u2026``, ``s3://\u2026@bucket/x.zarr``); a local
    path as it is."""
    location = os.fspath(location)
    if scheme_of(location) is None:
        return location
    head, userinfo, rest, query = split_location(location)
    return head + (HIDDEN + "@" if userinfo else "") + rest + (query[0] + HIDDEN if query else "")


def _innermost_scheme(location: str) -> str | None:
    scheme = scheme_of(location)
    rest = location.partition("://")[2]
    return scheme if scheme is None or scheme_of(rest) is None else _innermost_scheme(rest)


def name_of(location) -> str:
    """The name a location's format is detected on: an http(s) URL's path (also nested, as in
    ``reference://https://...``), without its query and fragment (``https://host/a.h5?X-Amz-...`` is an
    HDF5 file); any other location as it is."""
    location = os.fspath(location)
    if _innermost_scheme(location) not in _HTTP:
        return location
    head, _, rest, _ = split_location(location)
    return head + rest
