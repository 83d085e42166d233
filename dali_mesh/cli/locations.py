"""Locations as the command line shows them, detects their format on, and writes to.

A location may carry a credential: a presigned ``https://`` URL's query (``X-Amz-Signature``,
``X-Amz-Security-Token``) and user info in any scheme (``s3://KEY:SECRET@bucket/...``). The CLI's
output (tables, messages, errors, tracebacks) is copied into tickets and chats, so every location it
prints goes through :func:`shown`, and every error text through :func:`scrub` before it is printed.
Only ``http(s)`` URLs have a query: an ``s3://`` or ``gs://`` key is opaque bytes and may hold a
literal ``?`` or ``#``, which is part of the object's name and shown as it is.
"""
from __future__ import annotations

import logging
import os
import re

from dali_mesh.storage.names import HIDDEN, name_of, scheme_of, shown, split_location

__all__ = ["HIDDEN", "scheme_of", "shown", "scrub", "scrub_logs", "name_of", "format_of_location"]

# a URL inside a message: from its scheme to the first blank, quote or bracket (a query may hold ':' and ',')
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")


def scrub(text: str, locations=()) -> str:
    """``text`` (an error message, a traceback) with each of ``locations`` replaced by :func:`shown`, then
    any other URL in it too (a library's message may name a location in its own way)."""
    text = str(text)
    known = {}  # each location, and as repr() writes it, -> how it is shown
    for loc in (os.fspath(x) for x in locations if x):
        known[loc] = known[repr(loc)[1:-1]] = shown(loc)
        for secret in _secrets_of(loc):  # echoed alone, or encoded (a server's message quoting the request)
            known[secret] = HIDDEN
    if not known:
        return _URL_IN_TEXT.sub(lambda m: shown(m.group()), text)
    # the known locations exactly (a query may hold ':', which the URL pattern cannot tell from the
    # text after it), then other URLs in the text between them
    parts = re.split("(" + "|".join(map(re.escape, sorted(known, key=len, reverse=True))) + ")", text)
    return "".join(known[p] if i % 2 else _URL_IN_TEXT.sub(lambda m: shown(m.group()), p)
                   for i, p in enumerate(parts))


def _secrets_of(location: str) -> set[str]:
    """The credentials a location carries, as they may be written elsewhere (raw, percent-encoded,
    decoded): its user info and each part of it, its query (http(s)) and each long value in it (a
    signature, a token; short ones such as ``X-Amz-Expires=60`` are no secret and too common to hide)."""
    from urllib.parse import parse_qsl, quote, quote_plus, unquote  # noqa: PLC0415

    if scheme_of(location) is None:
        return set()
    _, userinfo, _, query = split_location(location)
    found = set()
    if userinfo:
        found.add(userinfo[:-1])
        found.update(p for p in userinfo[:-1].split(":") if len(p) >= 4)
    if query[1:]:
        found.add(query[1:])
        found.update(v for _, v in parse_qsl(query[1:], keep_blank_values=True) if len(v) >= 8)
    out = set()
    for secret in found:
        out.update({secret, quote(secret, safe=""), quote_plus(secret, safe=""), unquote(secret)})
    return {s for s in out if s}


def format_of_location(location):
    """The registered format (:mod:`dali_mesh.formats`) that reads ``location``, by its name
    (:func:`name_of`), else ``None``."""
    from dali_mesh.formats import format_of  # noqa: PLC0415

    return format_of(name_of(location))


class _ScrubRecords(logging.Filter):
    """Rewrites a log record's message, traceback and stack with :func:`scrub` (for every handler after it)."""

    locations: tuple = ()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage(), self.locations), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.locations)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, self.locations)
        return True


_SCRUB_RECORDS = _ScrubRecords()


def scrub_logs(locations=()) -> None:
    """Scrub (:func:`scrub`, with ``locations``) every log record that reaches stderr through logging's
    last-resort handler or a handler of the root logger. Kept after the command returns: a library's
    background task may log its error later (asyncio's "Future exception was never retrieved", at exit)."""
    _SCRUB_RECORDS.locations = tuple(x for x in locations if x)
    for handler in [logging.lastResort, *logging.getLogger().handlers]:
        if handler is not None and _SCRUB_RECORDS not in handler.filters:
            handler.addFilter(_SCRUB_RECORDS)
