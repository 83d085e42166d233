"""An Icechunk repository: its location (``icechunk://<repository>[@<snapshot id>][/<key>]``), its options, and
the library's calls that open it and its sessions, each under the source's ``timeout``
(:mod:`~dali_mesh.storage.icechunk.deadline`).

Which part of a location is a snapshot id (``@`` and 20 Crockford base32 characters), and when a local
folder of that name wins: docs/remote-storage.md, "Icechunk repositories".
"""
from __future__ import annotations

import hashlib
import importlib
import math
import os
import re
import socket
import urllib.parse
from typing import Callable

from dali_mesh.storage.errors import DataFileError, needed
from dali_mesh.storage.icechunk.deadline import call, timeout_of
from dali_mesh.storage.icechunk.forks import check_process
from dali_mesh.storage.icechunk.virtual import VIRTUAL_OPTION, virtual_access
from dali_mesh.storage.names import PINNED_BUCKET, shown

__all__ = ["SECRETS", "VERSION_OPTIONS", "check_options", "normal_repository", "open_repository",
           "readonly_session", "short", "split_location", "why_of"]

#: the storage_options that choose the version (the rest configure the repository's storage)
VERSION_OPTIONS = ("branch", "tag", "snapshot")
#: the storage_options of an s3:// repository, named as s3fs names them (as the s3:// store takes them), and
#: the bounds of the library's calls (``timeout``: any repository's; ``stall``: an object store's)
S3_OPTIONS = ("endpoint_url", "region", "anon", "key", "secret", "token", "timeout", "stall")
LOCAL_OPTIONS = ("timeout",)
SECRETS = ("key", "secret", "token")
#: ``<repository>@<snapshot id>[/<key>]``
_PINNED = re.compile(r"(?P<repo>.+)@(?P<snapshot>[0-9A-HJKMNP-TV-Z]{20})(?:/(?P<key>.*))?")
#: how long ``why_of``'s look at an endpoint waits for a connection
_LOOK_S = 1.0
#: why ``retries`` is refused (checked with icechunk 1.1.21 against a server answering 500 or 503: 10 requests
#: whatever the repository config's ``StorageRetriesSettings(max_tries=...)``)
_NO_RETRIES = ("the icechunk library retries each request of a repository itself (10 tries, with backoff) and "
               "its S3 client takes no retry setting (1.1.21 makes it at the repository's open with its default "
               "settings): bound each call of the library, its retries included, with timeout= (seconds) instead")


def icechunk_module():
    """The ``icechunk`` module, imported when a repository is read, or an error naming its extra."""
    icechunk = needed("reading Icechunk repositories (icechunk:// locations) needs the icechunk library",
                      lambda: importlib.import_module("icechunk"))
    # a local repository warns "not safe for concurrent commits" at every open: this store never commits
    icechunk.set_logs_filter("error")
    return icechunk


#: a cause in the library's chain that says nothing of its own
_VAGUE = {"error", "service error", "io error", "dispatch failure", "unhandled error", "response error"}


def short(e: BaseException) -> str:
    """An icechunk error's message on one line: its headline, without the Rust span trace after it
    (``context:``), and the innermost cause of its chain (``-> Connection refused (os error 111)``, an S3
    error's code and message), which the headline does not say."""
    headline, chain, in_trace = [], [], False
    for raw in str(e).strip().splitlines():
        line = raw.strip()
        if line.startswith(("|->", "`->")):
            chain.append(line[3:].strip())
            continue
        line = line.lstrip("x|").strip()
        if line.startswith("context:"):
            in_trace = True
        if not in_trace:
            headline.extend(line.split())
    text = " ".join(headline) or type(e).__name__
    cause = ""
    for item in reversed(chain):
        coded = re.search(r'code: "([^"]+)"(?:, message: "([^"]*)")?', item)
        if coded:
            cause = coded[1] + (f": {coded[2]}" if coded[2] else "")
            break
        if item.lower() not in _VAGUE and item.lower() not in text.lower():
            cause = item
            break
    return (text + (f" ({cause})" if cause else ""))[:400]


def _repository_name(repository: str) -> str:
    return shown(f"icechunk://{repository}")


def normal_repository(repository: str) -> str:
    """``repository`` with an ``s3://`` scheme in lower case (schemes are case-insensitive)."""
    scheme, sep, rest = repository.partition("://")
    return f"s3://{rest}" if sep and scheme.lower() == "s3" else repository


def split_location(location: str) -> tuple[str, str | None, str]:
    """``(repository, snapshot id or None, key)`` of ``icechunk://<repository>[@<snapshot id>][/<key>]``
    (see the module's doc); an ``s3://`` repository's location with user info (``KEY:SECRET@bucket``) is
    refused without showing it."""
    rest = normal_repository(location.split("://", 1)[1])
    if rest.startswith("s3://"):
        bucket = rest[len("s3://"):].split("/", 1)[0]
        pinned_bucket = PINNED_BUCKET.fullmatch(bucket)  # rootrepo@<snapshot id>: no user info
        bucket = pinned_bucket["bucket"] if pinned_bucket else bucket
        if "@" in bucket or ":" in bucket:  # a secret holding '/' ends the bucket early: ':' is there then
            raise DataFileError(shown(location), "holds user info (credentials in a location are not taken: they "
                                                 "would show in plans, checkpoints, logs and the library's requests); "
                                                 "give them in storage_options (key=, secret=)")
    pinned = _PINNED.fullmatch(rest)
    if pinned and "://" not in rest and os.path.isdir(rest.rstrip("/") or "/"):
        if os.path.isdir(pinned["repo"]):
            raise DataFileError(location, f"is ambiguous: the folder {rest.rstrip('/')!r} exists, and so does "
                                          f"{pinned['repo']!r}, whose snapshot {pinned['snapshot']} the name would "
                                          f"pin; rename the folder whose name ends in '@' and a snapshot id, or "
                                          f"give that snapshot as storage_options snapshot=")
        pinned = None  # a folder of that name: not a snapshot
    if pinned:
        return pinned["repo"], pinned["snapshot"], pinned["key"] or ""
    return rest.rstrip("/"), None, ""


def check_options(repository: str, options: dict, name: str) -> None:
    """Refuses ``options`` that are not a repository's (``retries`` saying why), ``timeout`` and ``stall`` that
    are no numbers of seconds, an ``endpoint_url`` with user info (unshown) and a ``region`` that is no region's
    name: a ValueError naming ``name``."""
    remote = normal_repository(repository).startswith("s3://")
    if "retries" in options:
        raise ValueError(f"{name}: storage_options retries is not taken for an Icechunk repository: {_NO_RETRIES}")
    if "stall" in options and not remote:
        raise ValueError(f"{name}: storage_options stall bounds the silence of an object store's answer: a local "
                         f"repository has none (timeout= bounds each call of the library)")
    known = (S3_OPTIONS if remote else LOCAL_OPTIONS) + VERSION_OPTIONS + (VIRTUAL_OPTION,)
    unknown = sorted(set(options) - set(known))
    if unknown:
        kind = "an s3://" if remote else "a local"
        raise ValueError(f"{name}: storage_options {unknown} are not options of {kind} Icechunk repository "
                         f"(known: {', '.join(known)})")
    # what the library is given and the store's spec (written into plan files) keeps: no user info in the
    # endpoint (refused unshown), no region that is no region's name (it becomes part of the endpoint's host)
    from dali_mesh.storage.credentials import checked_endpoint, checked_region  # noqa: PLC0415

    try:
        if options.get("endpoint_url") is not None:
            checked_endpoint(options["endpoint_url"])
        if options.get("region") is not None:
            checked_region(options["region"])
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    timeout_of(options, name)
    _stall_of(options, name)


def _stall_of(options: dict, name: str) -> int | None:
    """``stall`` as the library's ``network_stream_timeout_seconds`` (whole seconds, at least 1), or None."""
    value = options.get("stall")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1e6:
        raise ValueError(f"{name}: storage_options stall must be a number of seconds > 0 (an answer that sends "
                         f"nothing for this long is dropped and retried by the library), got {value!r}")
    return max(1, math.ceil(value))


def why_of(options: dict) -> Callable[[], str | None] | None:
    """For a call that timed out, a look at an s3:// repository's ``endpoint_url`` (one connection, at most
    :data:`_LOOK_S`; the library says nothing of the failures it retried); None without an endpoint."""
    endpoint = options.get("endpoint_url")
    if not endpoint:
        return None
    parts = urllib.parse.urlsplit(str(endpoint))
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        return None
    if not host:
        return None
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def why() -> str | None:
        try:
            socket.create_connection((host, port), timeout=_LOOK_S).close()
        except ConnectionRefusedError:
            return (f"its endpoint {where} refuses connections (Connection refused: the library retried them "
                    f"until then)")
        except socket.timeout:
            return (f"its endpoint {where} took no connection within {_LOOK_S:g} s (a server or a network that drops "
                    f"them)")
        except OSError as e:
            return f"its endpoint {where} cannot be reached ({e.strerror or type(e).__name__})"
        return (f"the repository's storage did not answer in time: its endpoint {where} takes connections, but its "
                f"server did not answer the library's requests in time, or kept failing them (the library retries "
                f"them), or the network stalls")

    return why


def open_repository(repository: str, options: dict):
    """``icechunk.Repository.open`` of a local folder or ``s3://bucket/prefix``, under ``options``' timeout."""
    icechunk = icechunk_module()
    repository = normal_repository(repository)
    name = _repository_name(repository)
    if "://" in repository and not repository.startswith("s3://"):
        raise DataFileError(name, "names a repository neither local nor s3://: give icechunk:///path/to/repo or "
                                  "icechunk://s3://bucket/prefix")
    check_options(repository, options, name)
    timeout = timeout_of(options, name)
    why = None
    if repository.startswith("s3://"):
        bucket, _, prefix = repository[len("s3://"):].partition("/")
        endpoint = options.get("endpoint_url")
        stall = _stall_of(options, name)
        why = why_of(options)
        check_process(name)  # a storage object starts the library's runtime
        storage = icechunk.s3_storage(
            bucket=bucket, prefix=prefix or None, region=options.get("region"), endpoint_url=endpoint,
            allow_http=bool(endpoint and endpoint.lower().startswith("http://")), force_path_style=bool(endpoint),
            access_key_id=options.get("key"), secret_access_key=options.get("secret"),
            session_token=options.get("token"), anonymous=bool(options.get("anon")) or None,
            from_env=None if options.get("key") or options.get("anon") else True,
            **({"network_stream_timeout_seconds": stall} if stall is not None else {}))
    else:
        # the library's open makes the folders of a path that is not there: a mistyped path must not
        # leave a tree of empty folders behind
        if not os.path.isdir(repository):
            raise DataFileError(name, "cannot be opened as an Icechunk repository (the repository doesn't exist), "
                                      "no such folder; check the location after icechunk://")
        check_process(name)  # a storage object starts the library's runtime
        storage = icechunk.local_filesystem_storage(repository)

    def fetch_config():
        return call(lambda: icechunk.Repository.fetch_config_async(storage), name, "reading the repository's config",
                    timeout, why=why)

    try:
        access = virtual_access(icechunk, fetch_config, name, options.get(VIRTUAL_OPTION))
        return call(lambda: icechunk.Repository.open_async(storage, authorize_virtual_chunk_access=access), name,
                    "opening the repository", timeout, why=why)
    except DataFileError:
        raise
    except Exception as e:  # noqa: BLE001 - IcechunkError
        raise DataFileError(name, f"cannot be opened as an Icechunk repository ({short(e)}); check the location "
                                  "after icechunk:// and its storage_options") from None


def readonly_session(repo, repository: str, timeout: float, *, why: Callable[[], str | None] | None = None,
                     **version):
    """``repo.readonly_session(**version)`` under ``timeout``; an error names a version not found."""
    (kind, value), = version.items()
    what = {"snapshot_id": "snapshot"}.get(kind, kind)
    name = _repository_name(repository)
    try:
        return call(lambda: repo.readonly_session_async(**version), name, f"opening the {what} {value!r}", timeout,
                    why=why)
    except DataFileError:
        raise
    except Exception as e:  # noqa: BLE001 - IcechunkError
        hint = (": a snapshot id never in the repository, or one expired (Repository.expire_snapshots) and "
                "garbage-collected since it was recorded; such a snapshot cannot be read again"
                if what == "snapshot" else "")
        raise DataFileError(name, f"has no {what} {value!r} ({short(e)}){hint}") from None


def _spec_text(text: str) -> str:
    """``text`` as a spec's value: ``%``, ``;`` and control characters %-encoded (a folder may be named
    ``a;b``; write_spec takes no ``;``), one spec per text."""
    return "".join(f"%{ord(c):02X}" if c in "%;" or ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)


def spec_fields(repository: str, snapshot: str, options: dict) -> dict:
    """The fields of a store's spec: the repository (:func:`_spec_text`), the snapshot, and what reads it: an
    s3:// repository's endpoint, region, anonymity and keys (a hash of them: credentials.signer, as the remote
    stores name theirs), the bounds of the library's calls given, and the virtual chunk containers authorised
    (and how)."""
    from dali_mesh.storage.credentials import Credentials, signer  # noqa: PLC0415

    fields: dict = {"repo": _spec_text(repository), "snapshot": snapshot}
    for k in ("endpoint_url", "region"):
        if options.get(k):
            fields[k] = _spec_text(str(options[k]))
    if options.get("anon"):
        fields["anon"] = True
    if any(options.get(k) for k in SECRETS):
        fields["signer"] = signer(Credentials(options.get("key") or "", options.get("secret") or "",
                                                options.get("token") or ""))
    for k in ("timeout", "stall"):
        if options.get(k) is not None:
            fields[k] = f"{float(options[k]):g}"
    given = options.get(VIRTUAL_OPTION)
    if given:
        # a hash: a container's prefix may hold what a spec may not (";"), and the options are checked later
        what = ("all" if given is True else repr(sorted((str(k), str(v)) for k, v in given.items()))
                if isinstance(given, dict) else repr(sorted(map(str, given))))
        fields["virtual"] = hashlib.sha256(what.encode()).hexdigest()[:16]
    return fields
