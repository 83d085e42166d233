"""A real S3 server on 127.0.0.1 for the tests (moto's ``ThreadedMotoServer``), started by the tests
themselves, and helpers to fill it. Nothing here reaches beyond 127.0.0.1.

Without ``INITIAL_NO_AUTH_ACTION_COUNT`` moto accepts any well-formed signature and refuses unsigned
requests to private buckets (403): the tests sign with :data:`KEY` / :data:`SECRET`. A server that
checks signatures against IAM users runs in a subprocess (:func:`start_checking_server`)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

KEY = "AKIDTESTKEY0000000000"
SECRET = "secret-of-the-tests-0123456789abcdef"
REGION = "us-east-1"


def start_server():
    """A started moto server on 127.0.0.1; returns ``(server, endpoint)``."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"
    return server, f"http://{host}:{port}"


def client(endpoint: str, key: str = KEY, secret: str = SECRET):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key,
                        aws_secret_access_key=secret)


def options(endpoint: str, **more) -> dict:
    """``storage_options`` of the test server (s3fs's names)."""
    return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint, **more}


def make_bucket(endpoint: str, name: str) -> None:
    s3 = client(endpoint)
    try:
        s3.create_bucket(Bucket=name)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass


def icechunk_storage(endpoint: str, bucket: str, prefix: str):
    """An ``icechunk.s3_storage`` of ``bucket/prefix`` on the test server (made, with the server's credentials)."""
    import icechunk  # noqa: PLC0415 - only the Icechunk tests ask

    make_bucket(endpoint, bucket)
    return icechunk.s3_storage(bucket=bucket, prefix=prefix, endpoint_url=endpoint, allow_http=True,
                               force_path_style=True, region=REGION, access_key_id=KEY, secret_access_key=SECRET)


def upload(endpoint: str, local: str | os.PathLike, bucket: str, key: str) -> str:
    """Uploads a file, or every file under a folder (a Zarr store), to ``bucket/key``; returns the
    ``s3://`` location."""
    s3 = client(endpoint)
    local = Path(local)
    if local.is_dir():
        for p in sorted(local.rglob("*")):
            if p.is_file():
                s3.upload_file(str(p), bucket, f"{key}/{p.relative_to(local).as_posix()}")
    else:
        s3.upload_file(str(local), bucket, key)
    return f"s3://{bucket}/{key}"


@pytest.fixture(scope="session")
def s3_endpoint():
    """The endpoint of a moto server for the session, with the bucket ``data``."""
    pytest.importorskip("moto")
    server, endpoint = start_server()
    try:
        make_bucket(endpoint, "data")
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """The test server's credentials and endpoint in the environment (as boto3 reads them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_endpoint


_CHECKING = r"""
import os, sys, time, logging
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
import boto3
s = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False); s.start()
host, port = s.get_host_and_port(); ep = f"http://{host}:{port}"
iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
iam.create_user(UserName="u")
iam.put_user_policy(UserName="u", PolicyName="p", PolicyDocument='{"Version":"2012-10-17","Statement":'
                    '[{"Effect":"Allow","Action":"*","Resource":"*"}]}')
k = iam.create_access_key(UserName="u")["AccessKey"]
print(ep, k["AccessKeyId"], k["SecretAccessKey"], flush=True)
sys.stdin.read()
s.stop()
"""


def start_checking_server():
    """A moto server in a subprocess that checks every request's SigV4 signature against an IAM user's
    key; returns ``(process, endpoint, key, secret)`` (close the process's stdin to stop it)."""
    proc = subprocess.Popen([sys.executable, "-c", _CHECKING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    line = proc.stdout.readline()
    if not line or time.monotonic() > deadline:
        proc.kill()
        pytest.fail("the checking moto server did not start")
    endpoint, key, secret = line.split()
    return proc, endpoint, key, secret
