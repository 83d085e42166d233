"""Which referenced files a reference set may name, and with which ``storage_options`` each is read.

The source's ``storage_options`` are ONE service's: they sign the set's own file and the referenced files of
that scheme only (for a local set: its files' one object-store scheme, or the http(s) files' when they are
all there is); http(s) files are read anonymously (a presigned URL signs itself); another object store's
files get the client's settings only, or ``reference_options``, else the set is refused. A set not read from
a local file may name no local file and no non-public host (``allow_private_references``); no set names
another set or a repository. The rules and why: docs/remote-storage.md, "Kerchunk reference sets".
"""
from __future__ import annotations

import ipaddress
import socket
import urllib.parse

from dali_mesh.storage.errors import DataFileError
from dali_mesh.storage.names import scheme_of, shown

__all__ = ["ALLOW_PRIVATE", "REFERENCE_OPTIONS", "check_urls", "resolve_targets", "take_options"]

#: the storage_option that lets a set not read from a local file name private, loopback and link-local hosts
ALLOW_PRIVATE = "allow_private_references"
#: the storage_option that gives the referenced files of a scheme their own options: ``{scheme: {...}}``
REFERENCE_OPTIONS = "reference_options"
#: schemes of stores whose files a set may not name
_NOT_FILES = ("reference", "icechunk")
#: IPv6 prefixes that carry an IPv4 address in their low 32 bits (NAT64, RFC 6052 and RFC 8215)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def take_options(options: dict | None) -> tuple[dict, bool, dict]:
    """``(the options of the stores, allow_private_references, reference_options by scheme family)`` of a
    set's ``storage_options``; a :class:`ValueError` naming a value of the wrong kind."""
    options = dict(options or {})
    allow = options.pop(ALLOW_PRIVATE, False)
    if not isinstance(allow, bool):
        raise ValueError(f"storage_options {ALLOW_PRIVATE} must be True or False, got {allow!r}")
    given = options.pop(REFERENCE_OPTIONS, None) or {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in given.items()):
        raise ValueError(f"storage_options {REFERENCE_OPTIONS} must map a scheme of referenced files to their "
                         f"storage_options (e.g. {{'gs': {{'anon': True}}}}), got {given!r}")
    per_family: dict[str, dict] = {}
    for scheme, opts in given.items():
        fam = _family(scheme.lower().removesuffix("://") + "://")
        if fam == "file" or fam in _NOT_FILES:
            raise ValueError(f"storage_options {REFERENCE_OPTIONS}: {scheme!r} is no scheme of files read with "
                             "options (s3, gs, http, https...)")
        if fam in per_family:
            raise ValueError(f"storage_options {REFERENCE_OPTIONS} names the {fam} files twice ({sorted(given)})")
        per_family[fam] = dict(opts)
    return options, allow, per_family


def _scheme(location) -> str:
    """A location's scheme as the store seam reads it (``"file"`` for a local path)."""
    return scheme_of(location) or "file"


def _family(location) -> str:
    """The service a location's scheme names: http and https are one (one server's options serve both)."""
    scheme = _scheme(location)
    return "http" if scheme == "https" else scheme


def _where(url: str) -> str:
    """What a refusal shows of a referenced file's place: ``scheme://bucket`` or ``scheme://host``."""
    head, _, rest = url.partition("://")
    return f"{head}://{rest.split('/', 1)[0]}" if rest else shown(url)


def check_urls(refs: dict, location, name_of) -> list[str]:
    """The referenced URLs of ``refs`` (fsspec's ``references``), sorted. Raises :class:`DataFileError`
    naming the key of a URL that is no string, or the set (``location``) that names another set or repository."""
    urls = set()
    for key, ref in refs.items():
        if not isinstance(ref, list) or not ref or ref[0] is None:
            continue
        url = ref[0]
        if not isinstance(url, str):
            raise DataFileError(name_of(key), f"refers to {repr(url)[:80]}, which is no URL or path (of type "
                                              f"{type(url).__name__}); the reference set is corrupt")
        if _scheme(url) in _NOT_FILES:
            raise DataFileError(str(location), f"refers to {shown(url)}: a reference set's references are files, "
                                               "not other reference sets or repositories")
        urls.add(url)
    return sorted(urls)


def resolve_targets(urls: list[str], options: dict, location, *, allow_private: bool = False,
                    per_family: dict | None = None) -> dict:
    """``urls`` -> their locations, each resolved with the options the module's rule gives it (``options``:
    the set's own removed; ``per_family``: ``reference_options``). Raises :class:`DataFileError` naming the
    files the set may not name, whose options would go to another service, or that cannot take them."""
    from dali_mesh.storage import resolve_locations  # noqa: PLC0415 - the package imports this module
    from dali_mesh.storage.credentials import CLIENT_SETTINGS  # noqa: PLC0415

    per_family = per_family or {}
    own = _family(location)
    if own != "file":
        local = [u for u in urls if _family(u) == "file"]
        if local:
            raise DataFileError(str(location), f"refers to the local file {shown(local[0])}: a reference set read "
                                               f"from {_scheme(location)}:// may not name files of this machine (copy "
                                               "the set to a local path to read local files through it)")
        held = [u for u in urls if _family(u) == "memory"] if own != "memory" else []
        if held:  # objects this process keeps (memory://): as this machine's files, not a remote set's to read
            raise DataFileError(str(location), f"refers to {shown(held[0])}: a reference set read from "
                                               f"{_scheme(location)}:// may not name objects this process holds in "
                                               "memory (copy the set to a local path to read them through it)")
    # the client's settings (timeouts, retries, the range cache) and anonymity (no credential at all) are
    # every service's; the rest (keys, an endpoint, a region) one service's
    everyone = (*CLIENT_SETTINGS, "anon")
    common = {k: v for k, v in options.items() if k in everyone}
    service = {k: v for k, v in options.items() if k not in everyone and v is not None}
    families = {_family(u) for u in urls} - {"file"} - set(per_family)
    stores = sorted(families - {"http"})
    if own != "file":
        chosen = own  # the options read the set's own file: they are its service's
    else:
        chosen = stores[0] if len(stores) == 1 else None if stores else next(iter(families), None)
    wrong = sorted({_family(u) for u in urls} - {"file", "http", chosen} - set(per_family))
    if wrong and service:
        shown_files = sorted({_where(u) for u in urls if _family(u) in wrong})
        whose = (f"{_scheme(location)}://'s, where the set is read from, and" if own != "file" else
                 "one service's, and the set cannot say which; they")
        raise DataFileError(str(location), f"refers to files of {', '.join(f'{s}://' for s in wrong)} "
                                           f"({', '.join(shown_files[:3])}{', ...' if len(shown_files) > 3 else ''}): "
                                           f"the storage_options {sorted(service)} are {whose} never sign or send "
                                           f"another service's requests; give those files their own options in "
                                           f"storage_options {REFERENCE_OPTIONS}={{'{wrong[0]}': {{...}}}} "
                                           f"({{'anon': True}} reads them anonymously)")

    def options_of(fam: str) -> dict:
        if fam in per_family:
            return {**common, **per_family[fam]}
        return options if fam == chosen else common

    resolved = {}
    for fam in sorted({_family(u) for u in urls}):
        mine = [u for u in urls if _family(u) == fam]
        try:
            resolved.update(zip(mine, resolve_locations(mine, options_of(fam))))
        except DataFileError:
            raise
        except ValueError as e:  # options the files' store does not take: named, never "no such array"
            raise DataFileError(str(location), f"its {fam}:// files (such as {shown(mine[0])}) cannot be read with "
                                               f"the options they get ({e}); see storage_options "
                                               f"{REFERENCE_OPTIONS}") from None
    if own != "file" and not allow_private:
        _check_hosts([u for u in urls if _family(u) == "http"], location)
    return {u: resolved[u] for u in urls}


# ---- the hosts a set read from elsewhere may name ---------------------------------------------------------
def _check_hosts(urls: list[str], location) -> None:
    """Raises :class:`DataFileError` (naming the URL, the address and the option) for an http(s) URL whose
    host resolves to a non-public address. libcurl resolves it again when it connects: DNS rebinding is NOT
    caught here."""
    hosts: dict[tuple, str] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        hosts.setdefault((parts.hostname, parts.port), url)
    answers = _resolve_all(list(hosts))
    for (host, port), url in sorted(hosts.items(), key=lambda item: item[1]):
        found = answers.get((host, port))
        if not isinstance(found, set):
            why = found if found is not None else f"no answer within {LOOKUP_S:g} s"
            raise DataFileError(str(location), f"refers to {shown(url)}, whose host {host!r} cannot be resolved "
                                               f"({why}); a set read from {_scheme(location)}:// names only hosts "
                                               "whose addresses are checked") from None
        for address in sorted(found):
            kind = _not_public(address)
            if kind:
                raise DataFileError(str(location), f"refers to {shown(url)}, whose host {host!r} is {address}, "
                                                   f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address: a reference set read from "
                                                   f"{_scheme(location)}:// may not name loopback, link-local, "
                                                   "private or reserved hosts (its author could read this "
                                                   "machine's services, or a cloud's metadata at 169.254.169.254, "
                                                   "as data); if you trust the set, give storage_options "
                                                   f"{ALLOW_PRIVATE}=True")


#: seconds the look-ups of a set's hosts may take together (a set naming many hosts whose name servers never
#: answer would otherwise hold the source's construction for minutes: each look-up waits for its resolver)
LOOKUP_S = 30.0
#: look-ups at once
_LOOKUPS = 16


def _resolve_all(hosts: list) -> dict:
    """``(host, port)`` -> the set of its addresses, or the text of its look-up's error, for each of ``hosts``;
    at most :data:`_LOOKUPS` at once on daemon threads (a look-up cannot be cancelled: one still waiting on its
    resolver when :data:`LOOKUP_S` have passed is left behind, answerless, and holds up no exit)."""
    import queue  # noqa: PLC0415
    import threading  # noqa: PLC0415

    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in hosts:
        todo.put(item)
    answers: dict = {}
    done = threading.Event()
    lock = threading.Lock()

    def work():
        while True:
            try:
                host, port = todo.get_nowait()
            except queue.Empty:
                return
            try:
                found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
            except (OSError, UnicodeError, ValueError) as e:
                found = str(e)
            with lock:
                answers[(host, port)] = found
                if len(answers) == len(hosts):
                    done.set()

    if not hosts:
        return answers
    for _ in range(min(_LOOKUPS, len(hosts))):
        threading.Thread(target=work, name="dali-mesh-host-lookup", daemon=True).start()
    done.wait(LOOKUP_S)  # then answers holds all of them, or those that came within the bound
    with lock:
        return dict(answers)


def _not_public(address: str) -> str | None:
    """What kind of address that is not public ``address`` is (``"loopback"``, ``"private"``...), ``None`` for a
    public one. An IPv4 address carried in an IPv6 one (IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64)
    is judged as itself: that is where its packets go."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scope (fe80::1%eth0) is no part of the address
    if ip.version == 6:
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and (any(ip in net for net in _NAT64) or (int(ip) >> 32 == 0 and int(ip) > 1)):
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)  # NAT64, or ::a.b.c.d (IPv4-compatible)
        if inner is not None:
            ip = inner
    for kind in ("loopback", "link_local", "unspecified", "multicast", "reserved", "site_local", "private"):
        if getattr(ip, f"is_{kind}", False):
            return kind.replace("_", "-")
    return None if ip.is_global else "shared or special-purpose"
