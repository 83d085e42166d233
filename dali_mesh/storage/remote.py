"""Remote object stores: ``s3://bucket/key`` (S3 and S3-compatible stores), ``gs://bucket/key`` (GCS's
S3-interoperable XML API) and ``https://host/path``, read by ranged GETs through the one libcurl client
(``csrc/storage/http_store.cc``) with ``If-Match`` on the version opened. Credentials come from s3fs-named
``storage_options`` or the environment, and stay in memory on the store (never in its spec, repr or
pickle). Options, credentials and what a build without libcurl does: docs/remote-storage.md.
"""
from __future__ import annotations

import ctypes
import os
import re
import urllib.parse

from dali_mesh.storage.byte_store import Version, is_etag, write_spec
from dali_mesh.storage.credentials import (CLIENT_SETTINGS, Credentials, checked_endpoint, checked_region,
                                           client_settings, environment_credentials, has_control_char, profile_region,
                                           query_id, signer)
from dali_mesh.storage.errors import DataFileError, FileChangedError, MissingFileError
from dali_mesh.storage.names import shown
# fetch_counters, store_api and store_settings: the C binding's, named here too (tests and benchmarks import them)
from dali_mesh.storage.native_store import (NativeObject, NativeStore, fetch_counters, give_credentials,
                                            have_native_http, store_api, store_settings)

__all__ = ["RemoteObject", "RemoteStore", "fetch_counters", "have_native_http", "resolve_gs", "resolve_http",
           "resolve_s3", "store_api", "store_settings"]

#: a read of unknown size up to this many bytes is one GET (larger ones are read at one version)
ONE_READ = 1 << 20
#: the first bytes an open fetches and keeps (a format's header is read from them): as
#: HttpStore::kOpenBytes (csrc/storage/http_store.h)
OPEN_BYTES = 64 << 10
_S3_OPTIONS = {"anon", "key", "secret", "token", "endpoint_url", "client_kwargs", "config_kwargs", "profile",
               "region", "addressing", "use_ssl", *CLIENT_SETTINGS}
_GS_OPTIONS = {"anon", "key", "secret", "token", "endpoint_url", "project", *CLIENT_SETTINGS}
_HTTP_OPTIONS = set(CLIENT_SETTINGS)


# ---- the store ------------------------------------------------------------------------------------------
class RemoteObject(NativeObject):
    """One object opened at its version (size and ETag from the GET of its first bytes, or a listing's);
    every read sends ``If-Match``; reads inside ``first`` (those first bytes) cost no request."""

    def __init__(self, store: "RemoteStore", key: str, version: Version, first: bytes = b"") -> None:
        super().__init__(store, key, version)
        self._first = first

    def _read(self, dst, n: int, offset: int) -> int:
        if 0 <= offset and offset + n <= len(self._first):  # inside the first bytes: no request
            dst[:n] = memoryview(self._first)[offset:offset + n]
            return n
        tag = self._version.tag
        if has_control_char(tag):  # a NUL would not even reach the C client whole
            raise DataFileError(self.name, "the If-Match header's value (the version's ETag) holds a control "
                                "character, which would end the header and start another; it is not sent (a broken "
                                "or hostile listing): list the objects again")
        return super()._read(dst, n, offset)

    def check_unchanged(self) -> None:
        # by a GET of one byte, not a HEAD (refused on a URL presigned for GET)
        found = self.store.open_range(self.key, 1)
        if found is None or found[1] != self._version.size or found[2] != self._version.tag:
            raise FileChangedError(self.name, "changed while it was read (it was replaced: its ETag or size "
                                              "differs); the window is not returned")


class RemoteStore(NativeStore):
    """Objects of one remote service read by ranged GETs. ``kind`` is ``"s3"`` (keys ``bucket/path``)
    or ``"http"`` (keys are URLs)."""


    def __init__(self, kind: str, *, endpoint: str = "", region: str = "us-east-1", addressing: str = "path",
                 anon: bool = False, settings: dict | None = None, credentials: Credentials | None = None,
                 scheme: str = "s3") -> None:
        self.kind = kind
        self.scheme = scheme
        fields: dict = {}
        if kind == "s3":
            fields.update(endpoint=endpoint, region=region, addressing=addressing, anon=anon)
            if credentials and not anon:  # other keys, another store (the native store of a spec has one set)
                fields["signer"] = signer(credentials)
        elif credentials and credentials.token:
            # an https URL's query (a presigned URL's signature): a credential of this store, appended to
            # each request by the client; the spec (what plans and the cache name) has its hash only
            fields["q"] = query_id(credentials.token)
        for name in CLIENT_SETTINGS:
            if settings and settings.get(name) is not None:
                fields["cache" if name == "cache_dir" else name] = settings[name]
        self.spec = write_spec(kind, fields)
        self.anon = anon
        self._credentials = None if anon else credentials
        self._give_credentials()
        #: what an open read (an array's metadata objects and the first page of its folder's listing, at the
        #: versions their answers named), by prefix, kept for the plan that follows (zarr_store.OpenedObjects)
        self.opened: dict = {}

    @property
    def supports_listing(self) -> bool:  # type: ignore[override]
        """S3 and GCS (XML) prefixes list (ListObjectsV2); a plain HTTP(S) server does not."""
        return self.kind == "s3"

    #: every remote store is the native reader's (a build without libcurl resolves none: need_native_http)
    opens = RemoteObject

    def _give_credentials(self) -> None:
        """Gives the native store of this spec this store's credentials, when it is made or in a worker
        when it takes them. Without credentials it leaves that store as it is: a spec names one set (its
        signer, or its query's hash), which another store object of the spec may have given already."""
        if self._credentials is not None and have_native_http():
            give_credentials(self.spec, self._credentials)

    def child_key(self, key: str, steps: list[str]) -> str:
        # an http(s) store's key is its URL, sent as it is: each step is a name, percent-encoded (a '#' would
        # end the path and read the parent, a '?' start a query); an S3 key is opaque bytes (EscapeKey)
        if self.kind == "http":
            steps = [urllib.parse.quote(step, safe="") for step in steps]
        return super().child_key(key, steps)

    def name_of(self, key: str) -> str:
        if self.kind == "s3":
            return f"{self.scheme}://{key}"
        parts = urllib.parse.urlsplit(key)
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))

    def stat(self, key: str) -> Version | None:
        if self.kind == "http" and self.credentials is not None and self.credentials.token:
            # a presigned URL (its query a credential): S3 refuses HEAD on a URL presigned for GET, so
            # its version comes from a one-byte GET
            found = self.open_range(key, 1)
            return None if found is None else Version(found[1], -1, found[2])
        return super().stat(key)

    def open_range(self, key: str, n: int) -> tuple[bytes, int, str] | None:
        """One GET of the first ``n`` (>= 1) bytes of ``key``, no If-Match: ``(bytes, size, tag)``, or None
        when it does not exist. No HEAD: S3 refuses HEAD on a URL presigned for GET."""
        buf, size, tag = ctypes.create_string_buffer(n), ctypes.c_int64(), ctypes.create_string_buffer(1024)
        got = self._call(key, "dali_mesh_store_open", self.encoded(key), n, buf, ctypes.byref(size), tag, 1024)
        if got == -2:
            return None
        # string_at copies the answer's bytes only: buf.raw[:got] copies the whole buffer first (1 MiB for a
        # metadata object's read: ~1 ms of CPU, three times an open)
        return ctypes.string_at(buf, got), size.value, tag.value.decode()

    def open(self, key: str, what: str = "file", *, direct: bool = False) -> RemoteObject:
        found = self.open_range(key, OPEN_BYTES)
        if found is None:
            raise MissingFileError(self.name_of(key), f"no such {what} (no such object); check the location")
        first, size, tag = found
        return RemoteObject(self, key, Version(size, -1, tag), first)

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """One GET of ``size`` bytes at ``offset`` (fewer where the object ends): no HEAD request first.
        :class:`~dali_mesh.storage.errors.MissingFileError` when it does not exist."""
        if size <= 0:
            return b""
        first = min(size, ONE_READ)  # a caller may ask for "all of it" with a large size
        buf = ctypes.create_string_buffer(first)
        # no If-Match, the object's size unknown (-1: the answer says where it ends)
        got = self._call(key, "dali_mesh_store_get", self.encoded(key), offset, first, b"", -1, buf)
        data = ctypes.string_at(buf, got)  # the bytes read, not the whole buffer (up to 1 MiB) first
        if len(data) < first or first == size:
            return data
        return super().read_range(key, offset, size)  # larger: at one version (its ETag), opened first

    def pins(self, version: Version | None) -> bool:
        """Only for an S3 (or GCS XML) ETag, which the service changes with the content and honours in
        If-Match; not a plain HTTP(S) server's (nginx's is the modification time and size: a copy that
        keeps both keeps it), nor a generation or a date."""
        return self.kind == "s3" and version is not None and is_etag(version.tag)

    def list_pages(self, prefix: str, delimiter: bool = True,
                   pages: int | None = None) -> tuple[list[tuple[str, Version]], list[str], bool]:
        """S3 ListObjectsV2 of ``prefix`` (``bucket/path/``), as :meth:`NativeStore.list_pages`."""
        if self.kind != "s3":
            raise DataFileError(self.name_of(prefix), "plain HTTP(S) locations cannot be listed: give the object's "
                                "own URL, or its s3:// or gs:// location")
        return super().list_pages(prefix, delimiter, pages)

    @property
    def credentials(self) -> Credentials | None:
        """The credentials it was resolved with, or was given in a worker; ``None``: unsigned requests."""
        return self._credentials

    def credentials_state(self):
        """:meth:`ByteStore.credentials_state`."""
        cred = self._credentials
        return None if cred is None or self.anon else (self.spec, tuple(cred))

    def take_credentials(self, credentials) -> None:
        """Makes this store sign with ``credentials`` (``(key, secret, token)``)."""
        if self.anon:
            return
        self._credentials = Credentials(*credentials)
        self._give_credentials()

    def __reduce__(self):
        # no credentials in the pickle: the source carries them (carry_credentials)
        return (_unpickle, (self.kind, self.spec, self.scheme, self.anon))

    def __repr__(self) -> str:
        return f"RemoteStore({self.spec!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemoteStore) and other.spec == self.spec and other.scheme == self.scheme

    def __hash__(self) -> int:
        return hash((self.spec, self.scheme))


def need_native_http(location: str) -> None:
    """Refuses the remote ``location`` (shown by its scheme only) where this build has no libcurl or expat, or
    where ``DALI_MESH_HTTP=python`` asks for the Python client that is gone, naming the fix."""
    where = location.split("://", 1)[0] + "://…"
    if os.environ.get("DALI_MESH_HTTP", "").strip().lower() == "python":
        raise DataFileError(where, "DALI_MESH_HTTP=python is no longer taken: the Python HTTP client is gone, remote "
                                   "objects are read by libcurl alone (the native stores); unset DALI_MESH_HTTP")
    if not have_native_http():
        raise DataFileError(where, "cannot be read: this build of dali_mesh has no libcurl or no libexpat (it reads "
                                   "remote objects through libcurl alone, and S3's listings with expat); install "
                                   "libcurl4-openssl-dev and libexpat1-dev and rebuild (make install)")


def _unpickle(kind: str, spec: str, scheme: str, anon: bool) -> RemoteStore:
    store = RemoteStore.__new__(RemoteStore)
    store.kind, store.spec, store.scheme, store.anon = kind, spec, scheme, anon
    store._credentials = None  # the source that holds the store gives them (take_credentials)
    store.opened = {}  # what an open read is not pickled: a worker's plan reads afresh
    return store


# ---- locations and options ------------------------------------------------------------------------------
def _check_options(options: dict, known: set, scheme: str) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"storage_options for {scheme}:// locations do not take {unknown}; known: {sorted(known)}")


def _bucket_and_key(location: str, scheme: str) -> str:
    """``bucket/key`` of ``scheme://bucket/key``, the key opaque bytes as S3 takes them (``?``, ``#``,
    ``..`` are parts of it); user info is refused unshown."""
    rest = location.split("://", 1)[1]
    bucket = rest.split("/", 1)[0]
    if "@" in bucket or ":" in bucket:  # shown without it (also a secret holding '/' or '@': names.shown)
        raise DataFileError(shown(location), "holds user info (credentials in a location are not taken: they would "
                                             "show in plans, checkpoints and logs); give them in storage_options "
                                             "(key=, secret=)")
    if has_control_char(rest):
        raise DataFileError(f"{scheme}://{bucket}/…", "holds a control character (NUL, CR, LF, ...): no object key is "
                                                       "read with one")
    if not _BUCKET.fullmatch(bucket):
        raise DataFileError(f"{scheme}://{bucket}/…", f"is not a {scheme}://BUCKET/KEY location (a bucket's name is "
                                                       "letters, digits, '.', '-' and '_')")
    return rest


#: S3's bucket names (and the legacy ones with capitals and '_' that some stores keep)
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
def resolve_s3(location: str, options: dict) -> tuple[RemoteStore, str]:
    """The store and key of ``s3://bucket/key`` with s3fs-named ``options``."""
    need_native_http(location)
    _check_options(options, _S3_OPTIONS, "s3")
    key = _bucket_and_key(location, "s3")
    client = dict(options.get("client_kwargs") or {})
    profile = options.get("profile")
    region = (options.get("region") or client.get("region_name") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or profile_region(profile) or "us-east-1")
    endpoint = (options.get("endpoint_url") or client.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or "")
    addressing = options.get("addressing") or ((options.get("config_kwargs") or {}).get("s3") or {}).get(
        "addressing_style")
    region = checked_region(region)
    if not endpoint:
        endpoint = f"https://s3.{region}.amazonaws.com"
        addressing = addressing or "virtual"
    addressing = addressing or "path"  # a custom endpoint (MinIO, Ceph, a local server): path-style
    if addressing not in ("path", "virtual"):
        raise ValueError(f"storage_options addressing must be 'path' or 'virtual', got {addressing!r}")
    endpoint = checked_endpoint(endpoint)
    anon = bool(options.get("anon", False))
    cred = None
    if not anon:
        if options.get("key") or options.get("secret"):
            if not (options.get("key") and options.get("secret")):
                raise ValueError("storage_options needs both key and secret (or neither)")
            cred = Credentials(str(options["key"]), str(options["secret"]), str(options.get("token") or ""))
        else:
            cred = environment_credentials(profile)
        anon = cred is None  # no credentials anywhere: unsigned requests (a public bucket)
    store = RemoteStore("s3", endpoint=endpoint, region=region, addressing=addressing, anon=anon,
                        settings=client_settings(options), credentials=cred, scheme="s3")
    return store, key


def resolve_gs(location: str, options: dict) -> tuple[RemoteStore, str]:
    """The store and key of ``gs://bucket/key``: GCS's XML API (``https://storage.googleapis.com``),
    anonymous (public buckets) or signed with HMAC keys (``key``, ``secret``)."""
    need_native_http(location)
    _check_options(options, _GS_OPTIONS, "gs")
    key = _bucket_and_key(location, "gs")
    token = options.get("token")
    if token not in (None, "anon"):
        raise DataFileError(location, "GCS OAuth tokens and service-account files are not supported yet: give HMAC "
                            "keys (storage_options key=..., secret=...) or read a public bucket anonymously "
                            "(anon=True or token='anon')")
    endpoint = checked_endpoint(str(options.get("endpoint_url") or "https://storage.googleapis.com"))
    cred = None
    if options.get("key") and options.get("secret") and not options.get("anon") and token != "anon":
        cred = Credentials(str(options["key"]), str(options["secret"]), "")
    store = RemoteStore("s3", endpoint=endpoint, region="auto", addressing="path", anon=cred is None,
                        settings=client_settings(options), credentials=cred, scheme="gs")
    return store, key


def resolve_http(location: str, options: dict) -> tuple[RemoteStore, str]:
    """The store and key of an ``http(s)://`` URL: anonymous GETs of the URL itself."""
    need_native_http(location)
    _check_options(options, _HTTP_OPTIONS, "http(s)")
    if has_control_char(location):
        raise DataFileError(location.split("?", 1)[0].split("://", 1)[0] + "://…",
                            "holds a control character (NUL, CR, LF, ...): no URL is read with one")
    parts = urllib.parse.urlsplit(location)
    try:
        parts.port
    except ValueError:  # "https://KEY:SEC/RET@host": a secret with a '/' ends the authority early
        raise DataFileError(shown(location), "is not an http(s):// URL with a host and a numeric port (user info "
                                             "in a URL is not taken)") from None
    if not parts.hostname:
        raise DataFileError(f"{parts.scheme}://…", "is not an http(s):// URL with a host")
    if parts.username or parts.password or "@" in parts.netloc:
        raise DataFileError(shown(location),
                            "credentials in a URL are not taken (they would show in plans and logs)")
    # the query (a presigned URL's signature) is a credential of the store, never part of the key; the
    # fragment is not sent by HTTP clients, so it is dropped
    key = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    cred = Credentials("", "", parts.query) if parts.query else None
    store = RemoteStore("http", settings=client_settings(options), scheme=parts.scheme, credentials=cred)
    return store, key
