"""Object stores: ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` URLs, read and written
through obstore (``pip install 'fastdata-shards[remote]'``).

The client is obstore (Rust's ``object_store``): one library for every scheme, its own
retries with exponential backoff and bounded timeouts, streaming downloads that release the
GIL, and the stores' standard configuration: ``AWS_*`` (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_REGION``...), ``GOOGLE_*`` and ``AZURE_*`` environment variables.
A URL is shown without its credentials (user, password, query string) in every message.

obstore's runtime does not survive ``fork``: in a process forked from one that used it (a
DataLoader-style worker), downloads run in a fresh helper process (``python -m
fastdata.shards.stores.objectstore``, the job on its stdin, the bytes on its stdout) instead
of hanging.
Worker processes mostly find their shards cached already: the loader's own process fetches
them ahead, in the order the pass reads them.
"""
from __future__ import annotations

import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta

from fastdata._optional import require
from fastdata.checks import printable
from fastdata.shards.stores.base import (
    CHUNK,
    Store,
    redact,
    register_store,
    without_secrets,
    write_chunk,
)

log = logging.getLogger("fastdata")

SCHEMES = ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https")
#: seconds one request may take before it is retried; seconds to connect
TIMEOUT, CONNECT_TIMEOUT = 60, 10
#: attempts after the first, and the seconds the retries of one request may take in all
RETRIES, RETRY_SECONDS = 4, 120
#: bytes per part of an upload (a larger object goes up in parts, 4 at a time)
PART = 16 << 20

_S3_ENDPOINT = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
_AZURE_ENDPOINT = ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")
#: the settings, in the order the store's client reads them, that name another endpoint for a
#: scheme's store (a local or on-premise server)
ENDPOINT_SETTINGS = {"s3": _S3_ENDPOINT, "s3a": _S3_ENDPOINT, "gs": ("GOOGLE_BASE_URL",),
                     **dict.fromkeys(("az", "azure", "abfs", "abfss"), _AZURE_ENDPOINT)}


def _allow_http(url: str) -> bool:
    """Plain HTTP where the URL or the endpoint configured for its store says so (a local or
    on-premise server)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme == "http":
        return True
    names = ENDPOINT_SETTINGS.get(scheme, ())
    endpoint = next((os.environ[n] for n in names if os.environ.get(n)), "")
    return endpoint.startswith("http://")


def check_endpoint(url: str) -> None:
    """Refuse an endpoint setting of ``url``'s store that is not an ``http(s)://`` URL (the
    store's client panics on one without a scheme).

    Raises:
        ValueError: naming the setting, its value and the form to give.
    """
    scheme = url.split("://", 1)[0].lower()
    for name in ENDPOINT_SETTINGS.get(scheme, ()):
        value = os.environ.get(name)
        if value and not re.match(r"https?://[^/\s]+", value):
            raise ValueError(f"{name}={value!r} is not a URL: give its scheme and host, e.g. "
                             f"{name}=http://{value.split('://')[-1]} (a local or on-premise "
                             f"server) or https://...")


_TIMED_OUT = re.compile(r"timed out|kind: Timeout|TimedOut|operation timed out", re.IGNORECASE)
#: a store's answer for a bucket or container that does not exist
_NO_BUCKET = re.compile(r"NoSuchBucket|ContainerNotFound|bucket does not exist|"
                        r"container does not exist", re.IGNORECASE)
#: a store's client asking a cloud machine's metadata service for credentials (its address,
#: or the services' own paths): it does so only when none are configured
_METADATA = re.compile(r"169\.254\.169\.254|metadata\.google\.internal|/latest/api/token|"
                       r"/computeMetadata/|/metadata/identity/oauth2/token")
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), AWS_ENDPOINT_URL "
          "for a server other than AWS's, or AWS_SKIP_SIGNATURE=true for a public bucket",
    "gs": "GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS (a service account's key "
          "file), GOOGLE_BASE_URL for another server, or GOOGLE_SKIP_SIGNATURE=true for a "
          "public bucket",
    "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or "
          "AZURE_STORAGE_SAS_KEY), AZURE_STORAGE_ENDPOINT for another server, or "
          "AZURE_SKIP_SIGNATURE=true for a public container"}


def _store_kind(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    return {"s3a": "s3", "azure": "az", "abfs": "az", "abfss": "az"}.get(scheme, scheme)


def _missing_bucket(url: str) -> str:
    """The message of a URL whose bucket (or container) does not exist."""
    p = urllib.parse.urlsplit(url)
    names = ENDPOINT_SETTINGS.get(p.scheme.lower(), ())
    endpoint = next((os.environ[n] for n in names if os.environ.get(n)), None)
    at = f" at {redact(endpoint)} ({next(n for n in names if os.environ.get(n))})" \
        if endpoint else ""
    return (f"the bucket {p.hostname!r} does not exist{at}: make it, or check the URL and "
            f"the endpoint")


_STARTED: list[int] = []     # the pid whose obstore runtime is live (set at first use)


def _obstore():
    obs = require("obstore", "reading shard sets from an object store")
    if not _STARTED:
        _STARTED.append(os.getpid())
    return obs


def _forked() -> bool:
    """Whether this process was forked from one whose obstore runtime had started."""
    return bool(_STARTED) and _STARTED[0] != os.getpid()


@register_store(*SCHEMES)
class ObjectStore(Store):
    """A set's folder in an object store, through obstore's client for its scheme."""

    def __init__(self, url: str):
        super().__init__(url)
        self._store = None

    def __getstate__(self):
        return {**self.__dict__, "_store": None}

    @property
    def store(self):
        if self._store is None:
            obs = _obstore()
            self._store = obs.store.from_url(
                self.url,
                client_options={"timeout": timedelta(seconds=TIMEOUT),
                                "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT),
                                "allow_http": _allow_http(self.url)},
                retry_config={"max_retries": RETRIES,
                              "retry_timeout": timedelta(seconds=RETRY_SECONDS),
                              "backoff": {"init_backoff": timedelta(milliseconds=200),
                                          "max_backoff": timedelta(seconds=10), "base": 2}})
        return self._store

    def _call(self, name: str, what: str, fn: Callable):
        """``fn()``, its failures one ``OSError`` naming the object, what failed and, where it
        is known, what to set.

        Raises:
            ValueError: an endpoint setting that is not a URL (``check_endpoint``).
        """
        if self._store is None:
            check_endpoint(self.url)
        try:
            return fn()
        except FileNotFoundError as e:
            if _NO_BUCKET.search(str(e)):
                raise FileNotFoundError(f"{self.shown}: {_missing_bucket(self.url)}") from None
            raise FileNotFoundError(f"{self.shown}/{name}: not found") from None
        except (ImportError, FileExistsError):
            raise
        except BaseException as e:  # noqa: BLE001 - obstore's errors, the network's, a panic
            if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                raise               # Ctrl-C, SystemExit
            text = str(e)
            if _NO_BUCKET.search(text):
                raise FileNotFoundError(f"{self.shown}: {_missing_bucket(self.url)}") from None
            if _METADATA.search(text) and _store_kind(self.url) in _CREDENTIALS:
                raise OSError(f"{self.shown}/{name}: {what} failed: no credentials are "
                              f"configured, and the machine's metadata service gave none (not "
                              f"a cloud machine with a role): set "
                              f"{_CREDENTIALS[_store_kind(self.url)]}") from None
            raise OSError(f"{self.shown}/{name}: {what} failed: {type(e).__name__}: "
                          f"{self.reason(text)}") from None

    def reason(self, text: str) -> str:
        """A client's error ``text`` in one printable line without secrets, its kind kept
        where it timed out (the first line alone may say only "request or response body
        error")."""
        first = text.strip().splitlines()[0] if text.strip() else ""
        if _TIMED_OUT.search(text) and not _TIMED_OUT.search(first):
            first += " (timed out)"
        return printable(without_secrets(first, self.url)[:300])

    def read(self, name: str, limit: int) -> bytes:
        """The object ``name`` whole (at most ``limit`` bytes: a larger one is refused)."""
        if _forked():
            import tempfile

            with tempfile.TemporaryFile() as f:
                n = self._helper(name, f.fileno(), limit)
                f.seek(0)
                return f.read(n)
        import obstore

        def get():
            got = obstore.get(self.store, name)
            if got.meta["size"] > limit:
                raise ValueError(f"{got.meta['size']} bytes, more than the {limit} allowed")
            return bytes(got.bytes())
        return self._call(name, "reading", get)

    def download(self, name: str, fd: int, update: Callable[[memoryview], None] | None = None,
                 limit: int | None = None) -> int:
        """Stream ``name`` into the open file ``fd``; ``update`` sees each chunk (a checksum).
        Returns the bytes written; more than ``limit`` is an error (a server that sends more
        than the manifest says fills no disk). A body cut off mid-way is asked again from the
        byte where it stopped (the same version of the object), as long as bytes keep coming:
        the download gives up after ``RETRIES`` tries in a row that bring none, or once
        ``RETRY_SECONDS - TIMEOUT`` pass without one (so within ``RETRY_SECONDS`` of the
        last)."""
        if _forked():
            start = os.lseek(fd, 0, os.SEEK_CUR)
            n = self._helper(name, fd, None, limit)
            if update is not None:          # the checksum, over what the helper wrote
                for at in range(0, n, CHUNK):
                    update(memoryview(os.pread(fd, min(CHUNK, n - at), start + at)))
            return n
        done, tag, last, idle = 0, None, time.monotonic(), 0
        while True:
            got = self._call(name, "download",
                             lambda at=done, version=tag: self._get_from(name, at, version))
            tag, before = got.meta.get("e_tag"), done
            try:
                for chunk in got.stream(min_chunk_size=CHUNK):
                    write_chunk(fd, chunk, done, limit, update)
                    done, last = done + len(chunk), time.monotonic()
                return done
            except ValueError as e:         # more than the limit
                raise OSError(f"{self.shown}/{name}: download failed: {e}") from None
            except Exception as e:  # noqa: BLE001 - the body cut off: the network, a timeout
                idle = 0 if done > before else idle + 1
                quiet = time.monotonic() - last
                if idle > RETRIES or quiet >= RETRY_SECONDS - TIMEOUT:
                    raise OSError(f"{self.shown}/{name}: download failed after {done} bytes, "
                                  f"none for {quiet:.0f} s and {idle} tries: "
                                  f"{self.reason(str(e))}") from None
                log.info("%s/%s: cut off after %d bytes (%s): asked again from there",
                         self.shown, name, done, self.reason(str(e)))
                time.sleep(min(0.2 * 2 ** idle, 10))

    def chunks(self, name: str):
        return self.chunks_from(name, 0)

    def chunks_from(self, name: str, offset: int):
        """``name``'s bytes from ``offset`` on, as they arrive; a body cut off is asked again
        from the byte where it stopped (the same version), as ``download`` does."""
        tag, idle = None, 0
        while True:
            got = self._call(name, "reading",
                             lambda at=offset, version=tag: self._get_from(name, at, version))
            tag, before = got.meta.get("e_tag"), offset
            try:
                for chunk in got.stream(min_chunk_size=CHUNK):
                    offset += len(chunk)
                    yield bytes(chunk)
                return
            except Exception as e:  # noqa: BLE001 - the body cut off: the network, a timeout
                idle = 0 if offset > before else idle + 1
                if idle > RETRIES:
                    raise OSError(f"{self.shown}/{name}: reading failed after {offset} bytes: "
                                  f"{self.reason(str(e))}") from None
                time.sleep(min(0.2 * 2 ** idle, 10))

    def head(self, name: str) -> tuple[int, str]:
        import obstore

        meta = self._call(name, "reading", lambda: obstore.head(self.store, name))
        return int(meta["size"]), str(meta.get("e_tag") or meta["size"])

    def read_range(self, name: str, start: int, end: int) -> bytes:
        import obstore

        if end <= start:
            return b""
        return bytes(self._call(name, "reading", lambda: obstore.get_range(
            self.store, name, start=start, end=end)))

    def _get_from(self, name: str, offset: int, tag: str | None):
        """The request for ``name`` from byte ``offset`` on (of version ``tag``, where the
        store gave one: a changed object is an error, not a splice of two)."""
        import obstore

        if not offset:
            return obstore.get(self.store, name)
        if tag:
            return obstore.get(self.store, name,
                               options={"range": {"offset": offset}, "if_match": tag})
        return obstore.get(self.store, name, options={"range": {"offset": offset}})

    @property
    def lists(self) -> bool:
        """Whether ``objects`` can list the folder here: not a plain HTTP server's, nor in a
        forked process (whose helper fetches objects one at a time)."""
        return _store_kind(self.url) not in ("http", "https") and not _forked()

    def objects(self) -> dict[str, int]:
        """The objects directly in the set's folder: name -> size in bytes."""
        return {name: size for name, (size, _) in self.versions().items()}

    def versions(self) -> dict[str, tuple[int, str]]:
        """The objects directly in the folder: name -> (size, ETag), by which a conversion
        from them tells a changed object."""
        import obstore

        def listing():
            got = obstore.list_with_delimiter(self.store)
            return {o["path"].rsplit("/", 1)[-1]: (int(o["size"]), str(o.get("e_tag") or ""))
                    for o in got["objects"]}
        return self._call("", "listing", listing)

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as the object ``name`` (whole, or not at all)."""
        import obstore

        self._call(name, "upload", lambda: obstore.put(self.store, name, data,
                                                       use_multipart=False))

    def create(self, name: str, data: bytes) -> None:
        """Store ``data`` as the object ``name`` only if there is none (the store decides:
        of two processes creating it at once, one does).

        Raises:
            FileExistsError: the object exists.
        """
        import obstore

        def create():
            try:
                obstore.put(self.store, name, data, use_multipart=False, mode="create")
            except Exception as e:      # noqa: BLE001 - obstore's AlreadyExistsError
                if type(e).__name__ == "AlreadyExistsError":
                    raise FileExistsError(f"{self.shown}/{name} exists") from None
                raise
        self._call(name, "create", create)

    def put_file(self, name: str, path: str) -> str:
        """Upload the local file ``path`` as ``name``, in parts of ``PART`` bytes where it is
        larger; returns its SHA-256 (hex), taken as it is read."""
        import hashlib

        import obstore

        def chunks(h):
            with open(path, "rb") as f:
                while chunk := f.read(PART):
                    h.update(chunk)
                    yield chunk

        def upload() -> str:
            h = hashlib.sha256()
            if os.path.getsize(path) <= PART:
                obstore.put(self.store, name, b"".join(chunks(h)), use_multipart=False)
            else:       # each part is retried by the client; the upload appears whole
                obstore.put(self.store, name, chunks(h), chunk_size=PART, max_concurrency=4)
            return h.hexdigest()
        return self._call(name, "upload", upload)

    def delete(self, names: list[str]) -> None:
        """Remove the objects ``names`` (those already gone are no error)."""
        import obstore

        for name in names:
            try:
                self._call(name, "removing", lambda n=name: obstore.delete(self.store, n))
            except FileNotFoundError:
                pass

    def _helper(self, name: str, fd: int, whole: int | None, limit: int | None = None) -> int:
        """``name`` fetched by a fresh helper process into ``fd`` (``whole``: ``read``'s limit,
        else ``download``'s ``limit``); returns the bytes written."""
        import json
        import sys
        import tempfile

        job = json.dumps({"url": self.url, "name": name, "whole": whole, "limit": limit,
                          "timeout": TIMEOUT,
                          "connect_timeout": CONNECT_TIMEOUT, "retries": RETRIES,
                          "retry_seconds": RETRY_SECONDS}).encode()
        start = os.lseek(fd, 0, os.SEEK_CUR)
        # posix_spawn and files, no pipes: a process forked meanwhile (a loader's worker)
        # would keep a pipe's end open (subprocess's own too), and its reader would wait for an
        # end of file that never comes
        with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as err:
            given.write(job)
            given.seek(0)
            pid = os.posix_spawn(sys.executable, [sys.executable, "-m",
                                                  "fastdata.shards.stores.objectstore"],
                                 os.environ, file_actions=[
                                     (os.POSIX_SPAWN_DUP2, given.fileno(), 0),
                                     (os.POSIX_SPAWN_DUP2, fd, 1),
                                     (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            err.seek(0)
            text = err.read().decode(errors="replace").strip().splitlines()
        if code:
            why = text[-1] if text else f"the helper process exited with {code}"
            if why.startswith("FileNotFoundError: "):
                raise FileNotFoundError(why.split(": ", 1)[1])
            raise OSError(why.split(": ", 1)[1] if why.startswith("OSError: ") else why)
        return os.lseek(fd, 0, os.SEEK_CUR) - start


def _helper_main() -> int:
    """``python -m fastdata.shards.stores.objectstore``: the object a JSON job on stdin names,
    to stdout; a failure as its last line on stderr."""
    import json
    import sys

    job = json.loads(sys.stdin.read())
    global TIMEOUT, CONNECT_TIMEOUT, RETRIES, RETRY_SECONDS
    TIMEOUT, CONNECT_TIMEOUT = job["timeout"], job["connect_timeout"]
    RETRIES, RETRY_SECONDS = job["retries"], job["retry_seconds"]
    remote = ObjectStore(job["url"])
    try:
        if job["whole"] is not None:
            sys.stdout.buffer.write(remote.read(job["name"], job["whole"]))
            sys.stdout.buffer.flush()
        else:
            remote.download(job["name"], sys.stdout.fileno(), limit=job["limit"])
    except OSError as e:
        print(f"{'FileNotFoundError' if isinstance(e, FileNotFoundError) else 'OSError'}: {e}",
              file=sys.stderr)
        return 1
    return 0




if __name__ == "__main__":
    raise SystemExit(_helper_main())
