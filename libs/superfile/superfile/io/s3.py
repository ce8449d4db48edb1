"""S3 storage: keys below ``s3://bucket/prefix``, conditional writes via S3 preconditions.

Request-level retries (throttling, 5xx, dropped connections) are botocore's
standard mode. Reads add their own bounded, jittered retry around the *body*
as well, because botocore does not retry a response stream cut short; that is
what keeps ``read_range`` exact-or-error. Reads and plain PUTs (idempotent)
are also retried when a connection closes without an answer after botocore
gave up (its retry quota runs dry when many answers are lost). Conditional
PUTs are never retried blindly here: ``io.write_new`` and the commit protocol
resolve them (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import boto3
import urllib3.exceptions
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from superfile.errors import (
    InvalidInputError,
    InvalidOptionError,
    ObjectNotFoundError,
    PreconditionFailedError,
    ShortReadError,
    StorageError,
)
from superfile.io import ObjectInfo, bool_option, check_folder, check_key, check_prefix, check_range

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Storage"]

MiB = 1024 * 1024
_MIN_PART = 5 * MiB  # S3's minimum size of every part but the last
_MAX_PARTS = 10_000
_BACKOFF_BASE = 0.05  # seconds
_BACKOFF_CAP = 2.0
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_SIGNED_FOR_S = 900  # a presigned GET of a small, often-read object is valid this long...
_SIGN_AGAIN_S = 600  # ...and signed again past this age, well before it expires
_SIGNED_KEYS = 64  # URLs kept (a writer also reads the objects its conditional puts lost to, once each)
_T = TypeVar("_T")


class _TruncatedBody(Exception):
    """A response body shorter than its range: retry it."""


_TRANSIENT = (
    _TruncatedBody,
    IncompleteReadError,
    ResponseStreamingError,
    BotoConnectionError,
    HTTPClientError,  # the connection closed before an answer (botocore stops retrying once its quota is spent)
    urllib3.exceptions.HTTPError,
)


def _as_int(name: str, value: int | str, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"option {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidOptionError(f"option {name} must be >= {minimum}, got {number}")
    return number


def _status(err: ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _is_transient(err: ClientError) -> bool:
    return _status(err) >= 500 or _code(err) in _RETRY_CODES


class S3Storage:
    """Objects under ``s3://bucket/prefix``; etags are S3's, quotes included."""

    remote = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        multipart_threshold: int | str = 8 * MiB,
        multipart_chunk_size: int | str = 8 * MiB,
        max_concurrency: int | str = 8,
        max_attempts: int | str = 5,
        create_bucket: bool | str = False,
    ) -> None:
        if len(bucket) < 3 or "/" in bucket:
            raise InvalidInputError(f"invalid S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self._bucket = bucket
        self._prefix = prefix
        self._threshold = _as_int("multipart_threshold", multipart_threshold, 1)
        self._chunk = _as_int("multipart_chunk_size", multipart_chunk_size, _MIN_PART)
        self._concurrency = _as_int("max_concurrency", max_concurrency, 1)
        self._attempts = _as_int("max_attempts", max_attempts, 1)
        config = Config(
            retries={"mode": "standard", "total_max_attempts": self._attempts},
            max_pool_connections=max(10, self._concurrency + 2),
            connect_timeout=10,
            read_timeout=60,
        )
        self._client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or None,
            aws_access_key_id=aws_access_key_id or None,
            aws_secret_access_key=aws_secret_access_key or None,
            config=config,
        )
        # Non-secret options that locate the bucket travel in the URI, so from_uri(uri) reopens it.
        self._query = urlencode({k: v for k, v in (("endpoint_url", endpoint_url), ("region", region)) if v})
        # The client's own HTTP session (its pool, TLS and proxy settings) for the presigned GETs of
        # read_with_etag, and those GETs' URLs by key -> (signed at, URL). None: every read goes through the client.
        self._session: Any = getattr(getattr(self._client, "_endpoint", None), "http_session", None)
        self._signed: dict[str, tuple[float, str]] = {}
        self.uri = self._make_uri(prefix)
        if bool_option("create_bucket", create_bucket):
            self._ensure_bucket(region)

    # -- helpers -----------------------------------------------------------

    def _make_uri(self, prefix: str) -> str:
        uri = f"s3://{self._bucket}/{prefix}"
        return f"{uri}?{self._query}" if self._query else uri

    def _key(self, path: str) -> str:
        check_key(path)
        return f"{self._prefix}/{path}" if self._prefix else path

    def _where(self, path: str) -> str:
        return f"s3://{self._bucket}/{self._key(path)}"

    @contextlib.contextmanager
    def _errors(self, op: str, path: str) -> Iterator[None]:
        """Turn botocore failures into the package's typed storage errors."""
        try:
            yield
        except ClientError as err:
            raise self._map(err, op, path) from err
        except BotoCoreError as err:
            raise StorageError(f"S3 {op} {self._where(path)} failed: {err}") from err

    def _map(self, err: ClientError, op: str, path: str) -> StorageError:
        code, status = _code(err), _status(err)
        where = self._where(path)
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return PreconditionFailedError(f"S3 {op} {where}: precondition failed ({code or status})")
        if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
            return ObjectNotFoundError(f"S3 {op}: no object {where}")
        if code == "InvalidRange" or status == 416:
            return ShortReadError(f"S3 {op} {where}: range not satisfiable")
        return StorageError(f"S3 {op} {where} failed: {code or status} {err}")

    def _retrying(self, op: str, path: str, attempt: Callable[[], _T]) -> _T:
        """Run ``attempt`` up to max_attempts times, with full-jitter backoff between tries."""
        last: Exception | None = None
        with self._errors(op, path):
            for number in range(self._attempts):
                if number:
                    time.sleep(random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**number)))
                try:
                    return attempt()
                except _TRANSIENT as err:
                    last = err
                except ClientError as err:
                    if not _is_transient(err):
                        raise
                    last = err
        where = self._where(path)
        if isinstance(last, (_TruncatedBody, IncompleteReadError, ResponseStreamingError)):
            raise ShortReadError(f"S3 {op} {where}: body cut short {self._attempts} times: {last}") from last
        raise StorageError(f"S3 {op} {where} failed after {self._attempts} attempts: {last}") from last

    def _ensure_bucket(self, region: str | None) -> None:
        with contextlib.suppress(ClientError, BotoCoreError):
            self._client.head_bucket(Bucket=self._bucket)
            return
        region = region or self._client.meta.region_name
        try:
            if region and region != "us-east-1":
                self._client.create_bucket(
                    Bucket=self._bucket,
                    CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
                )
            else:
                self._client.create_bucket(Bucket=self._bucket)
        except ClientError as err:
            if _code(err) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StorageError(f"cannot create bucket {self._bucket!r}: {err}") from err
        except BotoCoreError as err:
            raise StorageError(f"cannot create bucket {self._bucket!r}: {err}") from err

    # -- reads -------------------------------------------------------------

    def _get_whole(self, path: str) -> tuple[bytes, str]:
        key = self._key(path)

        def attempt() -> tuple[bytes, str]:
            resp = self._client.get_object(Bucket=self._bucket, Key=key)
            body = resp["Body"].read()
            if len(body) != resp["ContentLength"]:
                raise _TruncatedBody(f"got {len(body)} of {resp['ContentLength']} bytes")
            return body, resp["ETag"]

        return self._retrying("GET", path, attempt)

    def read(self, path: str) -> bytes:
        return self._get_whole(path)[0]

    def read_with_etag(self, path: str) -> tuple[bytes, str]:
        """The object and its etag. These are the small objects read again and again, once per query for the
        table's pointer: they are read through a presigned URL signed every few minutes, sent on the client's
        own connections, which costs about a third of the CPU of a client call (~0.9 against ~2.5 ms;
        botocore's per-call pipeline is most of a call). Any answer but 200 is left to the client call, which
        maps the errors and retries what is transient (docs/storage.md, "S3 options")."""
        if self._session is None:
            return self._get_whole(path)
        key = self._key(path)
        fast = self._retrying("GET", path, lambda: self._presigned_get(key))
        return fast if fast is not None else self._get_whole(path)

    def _presigned_get(self, key: str) -> tuple[bytes, str] | None:
        """One GET of ``key`` through its presigned URL; None when the answer is not a 200 (the URL is then
        signed afresh next time: a refusal may be an expired URL or rotated credentials)."""
        now = time.monotonic()
        signed = self._signed.get(key)
        if signed is None or now - signed[0] > _SIGN_AGAIN_S:
            url = self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=_SIGNED_FOR_S
            )
            if len(self._signed) >= _SIGNED_KEYS:
                self._signed.clear()
            signed = self._signed[key] = (now, url)
        resp = self._session.send(AWSRequest(method="GET", url=signed[1]).prepare())
        if resp.status_code != 200:
            self._signed.pop(key, None)
            return None
        body: bytes = resp.content
        if len(body) != int(resp.headers.get("Content-Length", len(body))):
            raise _TruncatedBody(f"got {len(body)} of {resp.headers['Content-Length']} bytes")
        return body, str(resp.headers["ETag"])

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        key = self._key(path)
        if length == 0:  # HTTP cannot express an empty range; check the bounds instead
            size = self.size(path)
            if offset > size:
                raise ShortReadError(f"S3 range {self._where(path)}: offset {offset} past size {size}")
            return b""

        def attempt() -> bytes:
            resp = self._client.get_object(Bucket=self._bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
            body = resp["Body"].read()
            match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange", ""))
            if match is None:  # the server sent the whole object
                body = body[offset : offset + length]
                total = resp["ContentLength"]
            else:
                if int(match.group(1)) != offset:
                    raise StorageError(f"S3 range {self._where(path)}: server answered {match.group(0)}")
                total = int(match.group(3)) if match.group(3) != "*" else offset + length
            if total < offset + length:
                raise ShortReadError(
                    f"S3 range {self._where(path)}: object has {total} bytes, asked for {length} at offset {offset}"
                )
            if len(body) != length:
                raise _TruncatedBody(f"got {len(body)} of {length} bytes")
            return body

        return self._retrying("range GET", path, attempt)

    def _head(self, path: str) -> dict[str, Any]:
        with self._errors("HEAD", path):
            return dict(self._client.head_object(Bucket=self._bucket, Key=self._key(path)))

    def size(self, path: str) -> int:
        return int(self._head(path)["ContentLength"])

    def exists(self, path: str) -> bool:
        try:
            self._head(path)
        except ObjectNotFoundError:
            return False
        return True

    # -- writes ------------------------------------------------------------

    def write(self, path: str, data: bytes) -> str:
        """A plain PUT is idempotent, so it is retried here too when its answer is lost."""
        key = self._key(path)

        def attempt() -> str:
            if len(data) < self._threshold:
                return self._client.put_object(Bucket=self._bucket, Key=key, Body=data)["ETag"]
            return self._write_multipart(key, data)

        return self._retrying("PUT", path, attempt)

    def _write_multipart(self, key: str, data: bytes) -> str:
        """Upload fixed-size parts in parallel; abort the upload if anything fails."""
        chunk = max(self._chunk, -(-len(data) // _MAX_PARTS))
        upload_id = self._client.create_multipart_upload(Bucket=self._bucket, Key=key, ChecksumAlgorithm="CRC32")[
            "UploadId"
        ]

        def upload(number: int, start: int) -> dict[str, Any]:
            resp = self._client.upload_part(
                Bucket=self._bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data[start : start + chunk],
                ChecksumAlgorithm="CRC32",
            )
            return {"PartNumber": number, "ETag": resp["ETag"], "ChecksumCRC32": resp["ChecksumCRC32"]}

        starts = range(0, len(data), chunk)
        try:
            pool = ThreadPoolExecutor(max_workers=min(self._concurrency, len(starts)))
            try:
                futures = [pool.submit(upload, n, start) for n, start in enumerate(starts, start=1)]
                parts = [future.result() for future in futures]
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
            resp = self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )
            return resp["ETag"]
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._client.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id)
            raise

    def write_if_absent(self, path: str, data: bytes) -> str:
        with self._errors("conditional PUT", path):
            resp = self._client.put_object(Bucket=self._bucket, Key=self._key(path), Body=data, IfNoneMatch="*")
        return resp["ETag"]

    def write_if_match(self, path: str, data: bytes, etag: str) -> str:
        with self._errors("conditional PUT", path):
            resp = self._client.put_object(Bucket=self._bucket, Key=self._key(path), Body=data, IfMatch=etag)
        return resp["ETag"]

    def delete(self, path: str) -> None:
        with self._errors("DELETE", path):
            self._client.delete_object(Bucket=self._bucket, Key=self._key(path))

    # -- listing and paths ---------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = f"{self._prefix}/" if self._prefix else ""
        with self._errors("LIST", prefix or "."):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=base + prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(obj["Key"][len(base) :], obj["Size"], obj["LastModified"].timestamp())

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        start = (f"{self._prefix}/" if self._prefix else "") + check_folder(prefix)
        names: list[str] = []
        with self._errors("LIST", prefix or "."):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=start, Delimiter="/"
            )
            for page in pages:
                names += [p["Prefix"][len(start) : -1] for p in page.get("CommonPrefixes", [])]
        return tuple(sorted(names))

    def local_path(self, path: str) -> str | None:
        check_key(path)
        return None

    def purge_incomplete(self, before: float) -> int:
        """Abort multipart uploads below this prefix that were started before ``before`` (a writer killed
        mid-upload leaves its parts stored, and billed, until the upload is aborted)."""
        base = f"{self._prefix}/" if self._prefix else ""
        aborted = 0
        with self._errors("LIST uploads", "."):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self._bucket, Prefix=base)
            for page in pages:
                for upload in page.get("Uploads", []):
                    if upload["Initiated"].timestamp() < before:
                        self._client.abort_multipart_upload(
                            Bucket=self._bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        aborted += 1
        return aborted

    def child(self, prefix: str) -> S3Storage:
        sub = check_key(prefix.removesuffix("/"))
        inner = f"{self._prefix}/{sub}" if self._prefix else sub
        clone = copy.copy(self)  # shares the client, its connection pool and the options
        clone._prefix = inner  # noqa: SLF001 (a copy of self, set up by its own class)
        clone.uri = self._make_uri(inner)
        return clone
