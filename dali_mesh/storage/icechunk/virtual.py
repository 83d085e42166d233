"""Virtual chunk containers of an Icechunk repository: which the source authorises, with what credentials, and
the local files their chunks name looked at once (docs/remote-storage.md, "Icechunk repositories")."""
from __future__ import annotations

import os
import stat
from urllib.parse import unquote

from dali_mesh.storage.errors import NotRegularFileError

#: the storage_option that authorises reads of virtual chunks: the URL prefixes of the repository's virtual
#: chunk containers the reader trusts (``True``: every container the repository declares)
VIRTUAL_OPTION = "authorize_virtual"

#: how a virtual chunk container is read: ``"anonymous"`` (the default), or ``"env"``: with the credentials of
#: the environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS), sent to the endpoint the REPOSITORY's config
#: names for the container, which the user then trusts
VIRTUAL_MODES = ("anonymous", "env")


#: the kinds of virtual chunk containers this reader authorises
KINDS = ("file", "http", "https", "s3", "tigris", "gs", "gcs")


def _declared(config) -> list[str]:
    """The URL prefixes of the virtual chunk containers a repository's ``config`` declares."""
    return [c.url_prefix for c in ((config.virtual_chunk_containers or {}) if config else {}).values()]


def _kind(prefix: str) -> str:
    """A container's kind: its URL prefix's scheme (``"file"`` without one)."""
    return prefix.partition("://")[0].lower() if "://" in prefix else "file"


def _container_credentials(icechunk, name: str, prefix: str, mode: str):
    """The credentials a virtual chunk container at ``prefix`` is read with: none for local files and plain
    http(s); anonymous, or the environment's (``mode``), for an object store's."""
    if mode not in VIRTUAL_MODES:
        raise ValueError(f"{name}: storage_options {VIRTUAL_OPTION}: the container {prefix!r} is read "
                         f"{' or '.join(map(repr, VIRTUAL_MODES))}, got {mode!r}")
    scheme = _kind(prefix)
    if scheme in ("file", "http", "https"):
        return None
    if scheme in ("s3", "tigris"):  # Tigris: S3's API and credentials
        return icechunk.s3_from_env_credentials() if mode == "env" else icechunk.s3_anonymous_credentials()
    if scheme in ("gs", "gcs"):
        return icechunk.gcs_credentials(from_env=True) if mode == "env" else icechunk.gcs_credentials(anonymous=True)
    raise ValueError(f"{name}: the virtual chunk container {prefix!r} is of a kind this reader does not authorise "
                     f"(file://, http(s)://, s3://, tigris:// and gs:// are)")


def virtual_access(icechunk, fetch_config, name: str, given) -> dict | None:
    """``authorize_virtual_chunk_access`` of the open: the virtual chunk containers ``given`` (URL prefixes,
    ``True``: every one the repository declares, its config read by ``fetch_config()``, or
    ``{prefix: "anonymous" | "env"}``). An object store's
    container is read ANONYMOUSLY unless the source says ``"env"`` for it: the repository's config, not the
    source, names each container's endpoint, and the library's default (the environment's credentials)
    would send the user's keys to whatever endpoint a repository declares. Nothing is authorised unless the
    source says so: a repository's virtual chunks name files anywhere."""
    if not given:
        return None
    if given is True:
        prefixes = _declared(fetch_config())
        # every container declared that this reader can authorise (one of another kind, az:// say, stays
        # unauthorised: its chunks' reads are refused, naming it, and the rest of the repository reads)
        given = {p: "anonymous" for p in prefixes if _kind(p) in KINDS}
    elif isinstance(given, dict):
        if not all(isinstance(p, str) for p in given):
            raise ValueError(f"{name}: storage_options {VIRTUAL_OPTION}: the keys are URL prefixes, got {given!r}")
    elif isinstance(given, str) or not all(isinstance(p, str) for p in given):
        raise ValueError(f"{name}: storage_options {VIRTUAL_OPTION} must be a list of the URL prefixes of virtual "
                         f"chunk containers to read (or True: all the repository declares; or a dict of them to "
                         f"'anonymous' or 'env'), got {given!r}")
    else:
        given = {p: "anonymous" for p in given}
    return icechunk.containers_credentials({p: _container_credentials(icechunk, name, p, mode)
                                            for p, mode in given.items()})


def check_local_virtual_files(repo, locations, given, name: str) -> None:
    """Refuses a snapshot whose virtual chunks, in a LOCAL container the source authorises, name a file that
    is not a regular file (a FIFO, where the library's read would wait for ever; a folder, a device): looked
    at once, when the session is opened. It costs loading every manifest of the snapshot, so only where a
    file:// container is authorised (object stores and http(s) have no FIFOs): ``locations()`` gives the
    snapshot's virtual chunk locations. A missing file is left to the read, which names it."""
    if not given:
        return
    prefixes = _declared(repo.config) if given is True else list(given)
    local = [p for p in prefixes if p.lower().startswith("file://")]
    if not local:
        return
    for url in sorted(set(locations())):
        if not any(url.startswith(p) for p in local):
            continue  # not authorised here: the library refuses its reads itself
        mode = None
        for path in dict.fromkeys((url[len("file://"):], unquote(url[len("file://"):]))):  # as written, or %-encoded
            try:
                mode = os.stat(path).st_mode
                break
            except OSError:
                continue
        if mode is None:
            continue
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotRegularFileError(name, f"a virtual chunk of this snapshot is a range of {url}, which is {kind}: "
                                            "its read would wait for ever or fail; the repository is refused")
