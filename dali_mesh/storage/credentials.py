"""What the stores that reach a service sign and connect with (shared, so no store imports another's
module): credentials and their names in a spec, the environment's keys and region as boto3 reads them, the
client's settings, and checks of an endpoint and a region (they become part of hosts and specs)."""
from __future__ import annotations

import configparser
import hashlib
import hmac
import os
import re
import urllib.parse
from typing import NamedTuple

from dali_mesh.storage.names import HIDDEN, shown

__all__ = ["CLIENT_SETTINGS", "Credentials", "DEFAULT_CACHE_BYTES", "checked_endpoint", "checked_region",
           "client_settings", "environment_credentials", "has_control_char", "profile_region", "query_id", "signer"]

#: settings of the client, besides credentials (see csrc/storage/http_store.h); cache_dir and
#: cache_bytes: a local cache of the ranges fetched (csrc/storage/range_cache.h)
CLIENT_SETTINGS = ("retries", "retry_seconds", "timeout", "stall", "connect", "cache_dir", "cache_bytes")
#: the cache's bound when cache_dir is given without cache_bytes
DEFAULT_CACHE_BYTES = 8 << 30


class Credentials(NamedTuple):
    key: str
    secret: str
    token: str

    def __repr__(self) -> str:  # never shown
        return "Credentials(...)"


def has_control_char(text: str) -> bool:
    """Whether ``text`` holds a control character (< 0x20 or 0x7f: NUL, CR, LF...): in a key a NUL would
    cut it where C reads it, in a header value CR/LF would start another header (as http_text.cc's
    ControlCharAt)."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


#: a random salt of this process: a spec's signer (and so a plan or a message) cannot be checked offline
#: against guessed keys (minioadmin/minioadmin); pickled stores carry their spec, so workers agree
_SALT = os.urandom(16)


def signer(cred: Credentials) -> str:
    """What a spec names its credentials by: 64 bits of an HMAC-SHA-256, under this process's random
    salt, of the key id, secret and token (never any of them), so that stores of one endpoint signed
    with other keys are other stores."""
    return hmac.new(_SALT, f"{cred.key}\0{cred.secret}\0{cred.token}".encode(), hashlib.sha256).hexdigest()[:16]


def query_id(query: str) -> str:
    """What names an https URL's query in a spec, a plan and the cache: 128 bits of its SHA-256 (the same
    in every process, so the cache of one run serves the next; a presigned query's signature is
    random enough that its hash tells nothing of it)."""
    return hashlib.sha256(query.encode()).hexdigest()[:32]


def client_settings(options: dict) -> dict:
    out = {}
    for name in CLIENT_SETTINGS:
        value = options.get(name)
        if value is None:
            continue
        if name == "retries":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
                raise ValueError(f"storage_options retries must be an integer in [0, 100], got {value!r}")
        elif name == "cache_dir":
            value = os.path.abspath(os.path.expanduser(os.fspath(value)))
            if ";" in value or any(ord(c) < 32 for c in value):
                raise ValueError(f"storage_options cache_dir {value!r} holds ';' or a control character")
        elif name == "cache_bytes":
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"storage_options cache_bytes must be a positive integer, got {value!r}")
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1e6:
            raise ValueError(f"storage_options {name} must be a number of seconds > 0, got {value!r}")
        out[name] = value
    if "cache_bytes" in out and "cache_dir" not in out:
        raise ValueError("storage_options cache_bytes needs cache_dir (the folder of the cache)")
    if "cache_dir" in out:
        out.setdefault("cache_bytes", DEFAULT_CACHE_BYTES)
    return out


def _aws_file(env: str, default: str, profile: str | None) -> tuple[configparser.RawConfigParser | None, str, str]:
    """``(parsed file, profile name, path)`` of one of boto3's files (``env`` names it, else ``default``) for
    ``profile`` (else ``AWS_PROFILE``, else ``default``); no parser when the file cannot be read."""
    path = os.environ.get(env) or os.path.expanduser(default)
    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        parser = None
    return parser, profile or os.environ.get("AWS_PROFILE") or "default", path


def _profile_credentials(profile: str | None) -> Credentials | None:
    """The keys of ``profile`` (or ``AWS_PROFILE``, or ``default``) in ``~/.aws/credentials``
    (``AWS_SHARED_CREDENTIALS_FILE``), as boto3 reads them."""
    parser, name, path = _aws_file("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials", profile)
    if parser is None:
        return None
    if not parser.has_section(name) or not parser.has_option(name, "aws_access_key_id"):
        if profile:
            raise ValueError(f"profile {profile!r} has no aws_access_key_id in {path}")
        return None
    sec = parser[name]
    return Credentials(sec.get("aws_access_key_id", ""), sec.get("aws_secret_access_key", ""),
                        sec.get("aws_session_token", ""))


def profile_region(profile: str | None) -> str | None:
    parser, name, _ = _aws_file("AWS_CONFIG_FILE", "~/.aws/config", profile)
    section = name if name == "default" else f"profile {name}"
    return parser.get(section, "region", fallback=None) if parser is not None and parser.has_section(section) else None


def environment_credentials(profile: str | None) -> Credentials | None:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret and not profile:
        return Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN", ""))
    return _profile_credentials(profile)


#: a region's name, as botocore validates it (``botocore.utils.validate_region_name``): it becomes part of the
#: endpoint's host and of every signature's scope, so ``x@127.0.0.1/#`` would send signed requests elsewhere
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?")


def checked_region(region) -> str:
    """``region`` if it is a region's name (letters, digits and '-', as boto3 takes them), else a ValueError."""
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise ValueError(f"the region {region!r} (storage_options region or client_kwargs region_name, AWS_REGION, "
                         "AWS_DEFAULT_REGION or the profile's) is not a region name: letters, digits and '-' only, "
                         "as boto3 takes them (e.g. 'us-east-1')")
    return region


def checked_endpoint(endpoint: str) -> str:
    """``endpoint`` (``endpoint_url``, ``AWS_ENDPOINT_URL``) without a trailing '/': an ``http(s)://host[:port]``
    URL, with a path at most. User info is refused without showing it (a store's spec names its endpoint, and
    the spec is written into plan files and every cache entry: a password there would be kept on disk); so are
    a query, a fragment and control characters, which no endpoint has."""
    endpoint = str(endpoint).rstrip("/")
    if has_control_char(endpoint):
        raise ValueError("endpoint_url holds a control character (NUL, CR, LF, ...)")
    if "@" in endpoint:  # anywhere, and first: a secret holding '/' ends the authority early; no scheme, no shown()
        head = endpoint.split("://", 1)[0] + "://" if "://" in endpoint else ""
        raise ValueError(f"endpoint_url {head + HIDDEN + '@'}... holds user info: credentials in an endpoint are not "
                         "taken (they would be written into plans and the range cache); give them in "
                         "storage_options (key=, secret=)")
    if not endpoint.lower().startswith(("http://", "https://")):
        raise ValueError(f"endpoint_url must start with http:// or https://, got {endpoint!r}")
    parts = urllib.parse.urlsplit(endpoint)
    try:
        parts.port
    except ValueError:
        raise ValueError(f"endpoint_url {shown(endpoint)!r} has a port that is not a number") from None
    if not parts.hostname or parts.query or parts.fragment or "?" in endpoint or "#" in endpoint:
        raise ValueError(f"endpoint_url {shown(endpoint)!r} is not an http(s)://HOST[:PORT] URL (no query or "
                         "fragment)")
    return endpoint
