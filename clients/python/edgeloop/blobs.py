"""Blob stores the reader fetches offloaded record parts from (docs/queue-layout.md, "Blobs").

A record whose routed experts were larger than the writer's threshold holds, instead of the
``routed_experts`` field, ``routed_experts_blob`` = JSON ``{"key", "sha256", "bytes"}``: the packed
bytes (as ``routed_experts_dtype`` says) are the object ``key`` of the blob store the writer was given
(``--blob-store``). The reader is given the same store:

- ``file:///abs/dir`` → :class:`FileBlobs` (one machine or a shared mount): the file ``dir/key``;
- ``s3://bucket[/prefix]`` → :class:`S3Blobs`: a plain HTTPS ``GET`` signed with AWS Signature V4
  (standard library only: no boto3), endpoint, region and credentials from the standard AWS
  environment (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``). Cloudflare R2 (what the
  Worker writes through its binding) is read this way through R2's S3 API.
- or any object with ``get(key) -> bytes | None``.

Every blob read is checked against the pointer's byte count and SHA-256 by :func:`fetch_verified`.
"""

import datetime
import hashlib
import hmac
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from .layout import LayoutError

__all__ = ["BlobError", "BlobIntegrityError", "FileBlobs", "S3Blobs", "open_blobs", "fetch_verified"]

_KEY = re.compile(r"^[A-Za-z0-9._~%-]+(/[A-Za-z0-9._~%-]+)*$")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class BlobError(LayoutError):
    """A blob store that cannot be read (unreachable, refused, bad key). ``key``/``field`` name the record part."""

    def __init__(self, message, key=None, field=None):
        # The message already names the record and field (as the TypeScript reader's does): no suffix.
        ValueError.__init__(self, message)
        self.key = key
        self.field = field


class BlobIntegrityError(BlobError):
    """A blob that is missing or whose bytes are not those its record's pointer names (count or SHA-256).

    ``key`` is the trajectory key, ``field`` the record part (``routed_experts``); the reader returns
    that record with ``error`` set to this message and every other record as usual.
    """


def _check_key(key):
    if not isinstance(key, str) or not _KEY.match(key) or any(s in (".", "..") for s in key.split("/")):
        raise BlobError(f"blob key {key!r} is not a blob key")
    return key


class FileBlobs:
    """Blobs as files under ``root`` (what ``--blob-store file:///root`` writes)."""

    def __init__(self, root):
        if not os.path.isabs(root):
            raise ValueError(f"FileBlobs needs an absolute directory, got {root!r}")
        self.root = os.path.realpath(root)
        self.location = f"file://{self.root}"

    def get(self, key):
        """The bytes of blob ``key``, or ``None`` when there is no such file."""
        path = os.path.join(self.root, _check_key(key))
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise BlobError(f"{self.location}: cannot read blob {key}: {e}") from None


class S3Blobs:
    """Blobs as objects ``{prefix}{key}`` of an S3-compatible bucket, fetched with SigV4-signed GETs.

    ``endpoint``: e.g. ``http://127.0.0.1:9000`` (MinIO, R2's S3 API; path-style requests); default
    ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, else AWS (``https://{bucket}.s3.{region}.amazonaws.com``).
    ``region``: default ``AWS_REGION``, then ``AWS_DEFAULT_REGION``, else ``us-east-1``.
    Credentials: default ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``;
    none at all sends unsigned requests (a public bucket). ``timeout``: seconds per request.

    See https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
    """

    def __init__(self, bucket, prefix="", endpoint=None, region=None, access_key=None, secret_key=None,
                 session_token=None, timeout=60):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint = (endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "").rstrip("/")
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.access_key = access_key if access_key is not None else os.environ.get("AWS_ACCESS_KEY_ID")
        self.secret_key = secret_key if secret_key is not None else os.environ.get("AWS_SECRET_ACCESS_KEY")
        self.session_token = session_token if session_token is not None else os.environ.get("AWS_SESSION_TOKEN")
        self.timeout = timeout
        self.location = f"s3://{bucket}/{self.prefix}"

    def _url(self, key):
        path = urllib.parse.quote(self.prefix + key, safe="/-_.~")
        if self.endpoint:
            return f"{self.endpoint}/{self.bucket}/{path}"
        return f"https://{self.bucket}.s3.{self.region}.amazonaws.com/{path}"

    def _headers(self, url, now=None):
        u = urllib.parse.urlsplit(url)
        now = now or datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": u.netloc, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": amz_date}
        if self.session_token:
            headers["x-amz-security-token"] = self.session_token
        if not (self.access_key and self.secret_key):
            return {k: v for k, v in headers.items() if k != "host"}
        names = sorted(headers)
        canonical = "\n".join([
            "GET",
            u.path or "/",
            u.query,
            "".join(f"{n}:{headers[n].strip()}\n" for n in names),
            ";".join(names),
            _EMPTY_SHA256,
        ])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = hmac.new(("AWS4" + self.secret_key).encode(), day.encode(), hashlib.sha256).digest()
        for part in (self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={sig}"
        del headers["host"]  # urllib sends the same Host itself
        return headers

    def get(self, key):
        """The bytes of object ``{prefix}{key}``, or ``None`` on 404 (``NoSuchKey``)."""
        url = self._url(_check_key(key))
        req = urllib.request.Request(url, headers=self._headers(url), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            body = e.read()[:300].decode("utf-8", "replace")
            raise BlobError(f"{self.location}: GET {key} answered HTTP {e.code}: {body}") from None
        except (urllib.error.URLError, OSError) as e:
            raise BlobError(f"{self.location}: GET {key} failed: {e}") from None


def sigv4_authorization(method, url, headers, access_key, secret_key, region, service="s3", payload_hash=_EMPTY_SHA256):
    """The ``Authorization`` header of an AWS Signature Version 4 request.

    ``url``: the request URL, its path already URI-encoded once (S3 does not encode it twice);
    ``headers``: every header to sign, lower-case names, ``host`` and ``x-amz-date``
    (``YYYYMMDDTHHMMSSZ``) among them. Checked against the worked example of the S3 documentation
    (``tests/test_blobs.py``).

    See https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
    """
    u = urllib.parse.urlsplit(url)
    amz_date = headers["x-amz-date"]
    day = amz_date[:8]
    names = sorted(headers)
    query = "&".join(sorted(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}" for k, v in urllib.parse.parse_qsl(u.query, keep_blank_values=True)))
    canonical = "\n".join([
        method,
        u.path or "/",
        query,
        "".join(f"{n}:{' '.join(str(headers[n]).split())}\n" for n in names),
        ";".join(names),
        payload_hash,
    ])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = hmac.new(("AWS4" + secret_key).encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope},SignedHeaders={';'.join(names)},Signature={sig}"


def open_blobs(spec):
    """The blob store ``spec`` names: a ``file:///dir`` or ``s3://bucket[/prefix]`` URL, or an object with ``get(key)`` (returned as is)."""
    if spec is None or hasattr(spec, "get"):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"blobs must be a file:// or s3:// URL or an object with get(key), got {spec!r}")
    if spec.startswith("file://"):
        return FileBlobs(urllib.parse.unquote(urllib.parse.urlsplit(spec).path))
    m = re.match(r"^s3://([^/]+)(?:/(.*))?$", spec)
    if m:
        return S3Blobs(m.group(1), m.group(2) or "")
    raise ValueError(f"blobs must be file:///absolute/dir or s3://bucket/prefix, got {spec!r}")


def fetch_verified(blobs, pointer, key, field):
    """The bytes of ``pointer`` (``{"key", "sha256", "bytes"}``) from ``blobs``, checked.

    Raises :class:`BlobIntegrityError` naming the trajectory ``key`` and ``field`` when the blob is
    missing or its byte count or SHA-256 differs from the pointer's; :class:`BlobError` when the store
    cannot be read.
    """
    location = getattr(blobs, "location", "the blob store")
    try:
        data = blobs.get(pointer["key"])
    except BlobError as e:
        raise BlobError(f"record {key}: reading {field}: {e}", key, field) from None
    if data is None:
        raise BlobIntegrityError(f"record {key}: blob of {field} ({pointer['key']}) is missing from {location}", key, field)
    if len(data) != pointer["bytes"]:
        raise BlobIntegrityError(f"record {key}: blob of {field} ({pointer['key']}) has {len(data)} bytes, the record says {pointer['bytes']}", key, field)
    sha = hashlib.sha256(data).hexdigest()
    if sha != pointer["sha256"]:
        raise BlobIntegrityError(f"record {key}: blob of {field} ({pointer['key']}) has sha256 {sha}, the record says {pointer['sha256']}", key, field)
    return data
