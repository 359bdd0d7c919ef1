"""The shared second cache level on an S3-API object store (AWS S3, MinIO, SeaweedFS, Ceph, R2).

Layout under `s3://BUCKET/PREFIX/`:
- `cas/sha256/<hex>`: immutable blobs named by their content, written create-only (`If-None-Match: *`) with a
  sha256 checksum that the server checks, and re-hashed by every reader;
- `ac/<fingerprint>.json`: one small manifest per fingerprint (the files with digests and sizes, the build's
  identity), HMAC-SHA256 signed when EPBUILD_CACHE_SIGNING_KEY is set, written only after all its blobs exist.

A reader trusts nothing it downloads: file names must be plain relative paths, every blob must hash to its
digest, and with a signing key the manifest must carry a valid signature; anything else is reported on one line
and the caller rebuilds (a writer then replaces the bad objects). The remote is an optimization, never a point of
failure: a refused connection, a timeout, throttling or a denied request gives one warning per process and the
build goes on locally. Endpoint and credentials come from boto3's standard settings (AWS_ENDPOINT_URL, profiles,
...); boto3 is imported only when a remote is in use, and no credential ever enters a message.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import threading
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ..files.layout import RECORD
from ..files.publish import discard
from ..logs import warn, warn_once

if TYPE_CHECKING:
    from ..execute.links import Links
    from .cache import ArtifactCache

FORMAT = 1
SINGLE_PUT_LIMIT = 5 * 1024**3  # S3's limit for one PUT; larger blobs go up in parts
PART_SIZE = 256 * 1024**2
MANIFEST_LIMIT = 1 << 20  # manifests list a few files; anything larger is not one of ours
CHUNK = 1 << 20
TRANSFER_RATE = 20e6  # bytes/s: moving bytes at least this fast is the remote's use, not waiting on it
SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "EPBUILD_CACHE_SIGNING_KEY")
EXISTS = ("PreconditionFailed", "ConditionalRequestConflict")  # create-only put: someone wrote it first
MISSING = ("NoSuchKey", "404", "NotFound")
DENIED = ("AccessDenied", "403", "Forbidden", "AllAccessDisabled")
HEX64 = re.compile(r"[0-9a-f]{64}")
# what writing an entry's files can fail with because of the names its manifest gives (too long, a file where a
# folder goes), not because of the local disk
ENTRY_ERRORS = (errno.ENAMETOOLONG, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EINVAL)


def split_url(url: str) -> tuple[str, str]:
    """s3://BUCKET/PREFIX -> (BUCKET, "PREFIX/") ("" without a prefix)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def redact(text: str) -> str:
    """Remove every credential value this process knows, and any user:password in a URL."""
    for name in SECRETS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def _describe(exc: BaseException, bucket: str = "") -> str:
    """A failed request in one line, with what to do where the cause is a setting: a bucket that does not exist,
    no credentials."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response["Error"]
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        text = f"{error.get('Code')} (HTTP {status}){': ' + error['Message'] if error.get('Message') else ''}"
        missing = error.get("Code") == "NoSuchBucket" or (status == 404 and
                                                          getattr(exc, "operation_name", "") == "HeadBucket")
        if missing:
            name = error.get("BucketName") or bucket
            text += f"; the bucket {name} does not exist: create it (aws s3 mb s3://{name}) or fix the URL"
        return text
    if type(exc).__name__ == "NoCredentialsError":
        return (f"{type(exc).__name__}: {exc}; give this process credentials for the bucket (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role)")
    return f"{type(exc).__name__}: {exc}"


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else ""


def _errors() -> tuple[type[BaseException], ...]:
    """Every failure of a request: no answer (BotoCoreError) or an error answer (ClientError)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return BotoCoreError, ClientError


def _error_answer() -> type[BaseException]:
    from botocore.exceptions import ClientError

    return ClientError


def _b64(digest_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(digest_hex)).decode()


def _safe_name(name: Any) -> bool:
    """A relative path inside the entry: no absolute path, no '..', no backslash, no empty part."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    parts = PurePosixPath(name).parts
    return not name.startswith("/") and all(part not in ("", ".", "..") for part in parts) and "/".join(parts) == name


class RemoteCache:
    """One remote, shared by the tasks of a process (see `connect`); thread-safe for doit's `-P thread`."""

    def __init__(self, url: str, budget_s: float = 60.0, timeout_s: float = 10.0):
        self.url = url
        self.budget_s, self.timeout_s = budget_s, timeout_s
        self._waited = 0.0  # seconds this process's requests took beyond their transfers (without a build's marker)
        self.bucket, self.prefix = split_url(url)
        self.readonly = os.environ.get("EPBUILD_CACHE_READONLY", "") not in ("", "0")
        key = os.environ.get("EPBUILD_CACHE_SIGNING_KEY")
        self._signing_key = key.encode() if key else None
        self.down: str | None = None  # why this process stopped using the remote
        self.said: Path | None = None  # the marker of the build's one warning: another process of it gave up
        self._bad: set[str] = set()  # object keys found bad here; a writer replaces them
        self._verified: set[str] = set()  # blob keys whose remote bytes this process checked (download or own put)
        self._lock = threading.Lock()
        self._client: Any = None

    @property
    def signed(self) -> bool:
        return self._signing_key is not None

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                # a request without an answer costs at most two timeouts: then the remote is skipped (`_give_up`)
                config = Config(connect_timeout=min(5.0, self.timeout_s), read_timeout=self.timeout_s,
                                retries={"mode": "standard", "total_max_attempts": 2})
                self._client = boto3.session.Session().client("s3", config=config)
            return self._client

    def _manifest_key(self, fingerprint: str) -> str:
        return f"{self.prefix}ac/{fingerprint}.json"

    def _blob_key(self, digest: str) -> str:
        return f"{self.prefix}cas/sha256/{digest}"

    # ---- reading ----

    def fetch(self, fingerprint: str, cache: ArtifactCache, label: str) -> int | None:
        """Download the entry for `fingerprint` into the local cache, verified; bytes downloaded, or None."""
        if self.skipped():
            return None
        started = time.monotonic()
        try:
            downloaded = self._fetch(fingerprint, cache, label)
        except _errors() as exc:
            self._give_up(exc, f"reading {label}")
            return None
        self._charge(started, downloaded or 0)
        return downloaded

    def _fetch(self, fingerprint: str, cache: ArtifactCache, label: str) -> int | None:
        key = self._manifest_key(fingerprint)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except _error_answer() as exc:
            if _code(exc) in MISSING:
                return None
            raise
        raw = response["Body"].read(MANIFEST_LIMIT + 1)
        files, why = self._check_manifest(raw, fingerprint)
        if why:
            self._refuse(key, fingerprint, label, why)
            return None
        staging = cache.staging(fingerprint)
        try:
            downloaded = len(raw)
            for name, entry in files.items():
                try:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    why = self._download(entry["sha256"], entry["size"], staging / name)
                except OSError as exc:
                    if exc.errno not in ENTRY_ERRORS:  # the local disk's fault: the caller gives the cache up
                        raise
                    why = f"{name} cannot be written here ({exc.strerror})"  # the entry's names: this entry only
                if why:
                    self._bad.add(self._blob_key(entry["sha256"]))
                    self._refuse(key, fingerprint, label, f"{name}: {why}")
                    return None
                downloaded += entry["size"]
            cache.store(fingerprint, staging, sorted(files), adopt=True,
                        digests={n: e["sha256"] for n, e in files.items()})
        finally:
            discard(staging)
        return downloaded

    def _check_manifest(self, raw: bytes, fingerprint: str) -> tuple[dict[str, dict[str, Any]], str | None]:
        if len(raw) > MANIFEST_LIMIT:
            return {}, "the manifest is too large to be one"
        try:
            body = json.loads(raw)
        except ValueError:
            return {}, "the manifest is not JSON"
        if not isinstance(body, dict):
            return {}, "the manifest is not a JSON object"
        signature = body.pop("signature", None)
        if self._signing_key is not None:
            if signature is None:
                return {}, "the manifest is unsigned and EPBUILD_CACHE_SIGNING_KEY is set"
            if not isinstance(signature, str) or not hmac.compare_digest(signature, self._sign(body)):
                return {}, "the manifest's signature does not match EPBUILD_CACHE_SIGNING_KEY"
        if body.get("format") != FORMAT or body.get("fingerprint") != fingerprint:
            return {}, "the manifest was written for another fingerprint or format"
        files = body.get("files")
        if not isinstance(files, dict) or not files:
            return {}, "the manifest lists no files"
        for name in files:
            folders = name.split("/")[:-1]
            clash = next((f for i in range(1, len(folders) + 1) if (f := "/".join(folders[:i])) in files), None)
            if clash is not None:
                return {}, f"the manifest names {clash!r} both as a file and as the folder of {name!r}"
        for name, entry in files.items():
            if not _safe_name(name):
                return {}, f"the manifest names a file outside its entry: {name!r}"
            if name == RECORD:
                return {}, f"the manifest names a file {RECORD}, which the local cache reserves for its record"
            if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str)
                    or not HEX64.fullmatch(entry["sha256"]) or not isinstance(entry.get("size"), int)
                    or entry["size"] < 0):
                return {}, f"the manifest's record of {name!r} is malformed"
        return files, None

    def _download(self, digest: str, size: int, path: Path) -> str | None:
        """Stream one blob to `path`, hashing as it comes; why it is bad, or None when it matches."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._blob_key(digest))
        except _error_answer() as exc:
            if _code(exc) in MISSING:
                return f"blob {digest[:16]} is missing"
            raise
        hasher, received = hashlib.sha256(), 0
        with open(path, "wb") as out:
            for chunk in response["Body"].iter_chunks(CHUNK):
                received += len(chunk)
                if received > size:
                    break
                hasher.update(chunk)
                out.write(chunk)
        if received < size:
            return f"blob {digest[:16]} was cut off after {received} of {size} bytes"
        if received != size or hasher.hexdigest() != digest:
            return f"blob {digest[:16]} does not match its sha256 (corrupted or tampered)"
        self._verified.add(self._blob_key(digest))
        return None

    def refuse(self, fingerprint: str, label: str, why: str) -> None:
        """An entry found wrong after its download (it lacks files its task writes): refused, and replaced by the
        upload of what this build produces."""
        self._refuse(self._manifest_key(fingerprint), fingerprint, label, why)

    def _refuse(self, key: str, fingerprint: str, label: str, why: str) -> None:
        self._bad.add(key)
        replace = "" if self.readonly else " and replacing it"
        warn(f"remote cache entry {fingerprint[:16]} for {label} refused: {redact(why)}; rebuilding{replace}")

    # ---- writing ----

    def upload(self, fingerprint: str, folder: Path, digests: dict[str, str], identity: dict[str, Any],
               label: str) -> int:
        """Upload the blobs of `folder`, then the manifest; bytes sent (0 when read-only or unavailable)."""
        if self.skipped() or self.readonly:
            return 0
        key = self._manifest_key(fingerprint)
        replacing = key in self._bad  # its entry was refused: none of its blobs is trusted unless checked here
        started, sent = time.monotonic(), 0
        try:
            sent, files = 0, {}
            for name, digest in sorted(digests.items()):
                size = (folder / name).stat().st_size
                files[name] = {"sha256": digest, "size": size}
                sent += self._put_blob(digest, folder / name, size, replacing)
            body: dict[str, Any] = {"format": FORMAT, "fingerprint": fingerprint, "task": label, "files": files,
                                    "identity": identity, "written": round(time.time())}
            if self._signing_key is not None:
                body["signature"] = self._sign(body)
            manifest = json.dumps(body, indent=1, sort_keys=True).encode()
            if replacing:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=manifest,
                                       ChecksumSHA256=_b64(hashlib.sha256(manifest).hexdigest()))
                self._bad.discard(key)
            else:
                self._create(key, manifest, hashlib.sha256(manifest).hexdigest())
            sent += len(manifest)
            self._charge(started, sent)
            return sent
        except _errors() as exc:
            if _code(exc) in DENIED:
                self.readonly = True
                why = redact(_describe(exc, self.bucket))
                warn_once(self.said.with_name("remote-cache-writes") if self.said is not None else None,
                          f"remote cache {self.url}: writes denied ({why}); reading only from now on")
            else:
                self._give_up(exc, f"uploading {label}")
            return 0
        except OSError as exc:  # the local copy went away meanwhile (another builder's eviction): not uploaded
            warn(f"remote cache: {label} not uploaded: {exc.strerror or exc}"
                 f"{f' ({exc.filename})' if exc.filename else ''}")
            return 0

    def _put_blob(self, digest: str, path: Path, size: int, replacing: bool) -> int:
        """Upload one blob unless the remote holds it verified. Replacing a refused entry, every blob this process
        has not verified is written again (one bad blob is rarely alone: a later build would otherwise find the
        next one); otherwise an existing blob is kept unless the server's own checksum of it disagrees."""
        key = self._blob_key(digest)
        if key in self._verified:
            return 0
        distrusted = key in self._bad or replacing
        exists, checksum = (True, None) if distrusted else self._head(key)
        if distrusted or checksum not in (None, _b64(digest)):
            with contextlib.suppress(*_errors()):
                self.client.delete_object(Bucket=self.bucket, Key=key)
            self._bad.discard(key)
        elif exists:
            return 0
        if size > SINGLE_PUT_LIMIT:
            self._create_in_parts(key, path)
        else:
            with open(path, "rb") as body:
                self._create(key, body, digest)
        self._verified.add(key)  # the server checked the sha256 sent with it
        return size

    def _head(self, key: str) -> tuple[bool, str | None]:
        """Whether the blob exists, and the sha256 the server recorded when it was written (None for a blob
        written in parts, or on a server that keeps none)."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except _error_answer() as exc:
            if _code(exc) in MISSING:
                return False, None
            raise
        checksum = head.get("ChecksumSHA256")
        return True, checksum if checksum and "-" not in checksum else None

    def _create(self, key: str, body: Any, digest: str) -> None:
        """A create-only put with the sha256 the server checks; losing a race to an identical write is fine."""
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ChecksumSHA256=_b64(digest),
                                   IfNoneMatch="*")
        except _error_answer() as exc:
            if _code(exc) not in EXISTS:
                raise

    def _create_in_parts(self, key: str, path: Path) -> None:
        """A multipart upload, each part with its sha256, completed create-only."""
        client = self.client
        upload = client.create_multipart_upload(Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256")
        parts: list[dict[str, Any]] = []
        try:
            with open(path, "rb") as handle:
                while chunk := handle.read(PART_SIZE):
                    checksum = base64.b64encode(hashlib.sha256(chunk).digest()).decode()
                    number = len(parts) + 1
                    done = client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"],
                                              PartNumber=number, Body=chunk, ChecksumSHA256=checksum)
                    parts.append({"ETag": done["ETag"], "PartNumber": number, "ChecksumSHA256": checksum})
            client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"],
                                             MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except BaseException as exc:
            with contextlib.suppress(*_errors()):
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"])
            if _code(exc) not in EXISTS:
                raise

    def _sign(self, body: dict[str, Any]) -> str:
        assert self._signing_key is not None
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return "hmac-sha256:" + hmac.new(self._signing_key, canonical, hashlib.sha256).hexdigest()

    def skipped(self) -> bool:
        """Whether this build no longer uses the remote: this process gave up, or another of the build's did (its
        warning's marker: `doit -n` workers then stop waiting on it too)."""
        if not self.down and self.said is not None and self.said.exists():
            self.down = "another process of this build gave up on it"
        return bool(self.down)

    def _charge(self, started: float, moved: int) -> None:
        """Count what an operation waited (its time beyond moving its bytes at TRANSFER_RATE) against the budget;
        past it, the remote is skipped for the rest of this build with one warning. One budget per build: every
        process of it (doit's `-n` workers) adds its waits to one account (`_build_waited`); the first past the
        budget marks the build, and the others skip the remote from then on (`skipped`)."""
        waited = max(0.0, time.monotonic() - started - moved / TRANSFER_RATE)
        with self._lock:
            total = self._build_waited(waited)
            if self.down or total <= self.budget_s:
                return
            self.down = (f"it kept this build waiting {total:.0f} s (`[cache] remote_budget_s` = "
                         f"{self.budget_s:g})")
        warn_once(self.said, f"remote cache {self.url} skipped: {self.down}; building locally without it for the "
                             "rest of this build")

    def _build_waited(self, waited: float) -> float:
        """What the build has waited on the remote so far, `waited` added: one line per wait appended (one small
        write, atomic in append mode) to a file beside the build's warning marker, which every process of the build
        shares, and summed; where there is no marker (a Dask worker's job) or no file, this process's own count."""
        self._waited += waited
        if self.said is None:
            return self._waited
        account = self.said.with_name(f"{self.said.name}.waited")
        try:
            account.parent.mkdir(parents=True, exist_ok=True)
            with open(account, "a+", encoding="ascii") as handle:
                if waited > 0:
                    handle.write(f"{waited:.3f}\n")
                handle.seek(0)  # flushes the line first
                return sum(float(line) for line in handle.read().split())
        except (OSError, ValueError):
            return self._waited

    def _give_up(self, exc: BaseException, action: str) -> None:
        """The one warning of this build; later operations of every process of it skip the remote."""
        with self._lock:
            if self.down:
                return
            self.down = redact(_describe(exc, self.bucket))
        warn_once(self.said, f"remote cache {self.url} unavailable while {action}: {self.down}; building locally "
                             "without it for the rest of this build")

    # ---- for `doit cache` ----

    def settings(self) -> dict[str, Any]:
        """Where the remote is and how it is used, probed with one request; never a credential."""
        endpoint = self.client.meta.endpoint_url
        try:
            self.client.head_bucket(Bucket=self.bucket)
            reachable: str | bool = True
        except _errors() as exc:
            reachable = redact(_describe(exc, self.bucket))
        return {"url": self.url, "endpoint": redact(endpoint), "readonly": self.readonly, "signed": self.signed,
                "reachable": reachable}


def connect(links: Links, url: str, budget_s: float = 60.0, timeout_s: float = 10.0,
            said: Path | None = None) -> RemoteCache:
    """The build's one `RemoteCache` for `url` (kept on its `links`), so a failure warns once and then stays
    quiet, and its waiting is counted against one budget."""
    with links.lock:
        if url not in links.remote:
            links.remote[url] = RemoteCache(url, budget_s, timeout_s)
        opened: RemoteCache = links.remote[url]
        opened.said = said
        return opened
