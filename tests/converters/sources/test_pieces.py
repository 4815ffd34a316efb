"""A source's files: patterns, folders, byte ranges and streams from disk and from stores,
gzip streams read a piece at a time, and tar headers that are never trusted."""
from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from fastdata.converters.sources.pieces import Piece, expand, find
from fastdata.converters.sources.tarfiles import TarDamaged, members
from fastdata.shards.stores import open_store


def test_brace_patterns_expand_as_written():
    assert expand("s-{000..002}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand("{a,b}-{8..10}.tar") == ["a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar",
                                           "b-9.tar", "b-10.tar"]
    assert expand("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match=r"\{9..1\} is not a range of integers"):
        expand("s-{9..1}.tar")
    with pytest.raises(ValueError, match="more than a million"):
        expand("s-{0..99999999}.tar")


def test_a_folder_a_glob_and_a_pattern_find_their_files_in_order(tmp_path):
    for name in ("b.tar", "a.tar", "c.txt", "sub/d.tar", ".hidden.tar"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * len(name))
    assert [p.name for p in find(str(tmp_path), (".tar",), "tars")] == ["a.tar", "b.tar",
                                                                        "sub/d.tar"]
    assert [p.name for p in find(str(tmp_path / "*.tar"), (".tar",), "tars")] == ["a.tar",
                                                                                  "b.tar"]
    assert [p.size for p in find(str(tmp_path / "{b,a}.tar"), (".tar",), "tars")] == [5, 5]
    with pytest.raises(ValueError, match="no parquet files in it"):
        find(str(tmp_path / "sub"), (".parquet",), "parquet files")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find(str(tmp_path / "none"), (".tar",), "tars")


def test_a_store_reads_ranges_and_streams_from_an_offset(tmp_path):
    """The local and fsspec stores give ranges directly; a store of one's own that gives only
    ``chunks`` gets them from the base class."""
    fsspec = pytest.importorskip("fsspec")
    data = bytes(range(256)) * 5000
    (tmp_path / "x.bin").write_bytes(data)
    fsspec.filesystem("memory").pipe("/pieces/x.bin", data)
    from fastdata.shards.stores.base import Store

    class Chunky(Store):
        def chunks(self, name):
            return iter([data[k:k + 777] for k in range(0, len(data), 777)])

    for store in (open_store(f"file://{tmp_path}"), open_store("memory://pieces"),
                  Chunky("chunky://x")):
        assert store.read_range("x.bin", 1000, 5000) == data[1000:5000]
        assert store.read_range("x.bin", len(data) - 10, len(data) + 10) == data[-10:]
        assert b"".join(store.chunks_from("x.bin", 123_457)) == data[123_457:]


def test_a_gzip_stream_of_several_members_reads_whole_and_in_pieces(tmp_path):
    data = b"".join(bytes([k]) * 70_000 for k in range(20))
    (tmp_path / "x.tar.gz").write_bytes(gzip.compress(data[:500_000]) +
                                        gzip.compress(data[500_000:]))
    piece = find(str(tmp_path / "x.tar.gz"), (".tar.gz",), "tars")[0]
    assert piece.compressed
    reader = piece.reader(12_345)
    assert reader.read(1_000_000) == data[12_345:1_012_345] and reader.tell() == 1_012_345
    assert reader.skip(10**9) == len(data) - 1_012_345 and reader.read(10) == b""


def _header(name: str, size: int, **edits) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    for at, value in edits.items():
        block[int(at[1:])] = value
    return bytes(block)


def test_tar_headers_are_checked_before_anything_they_claim_is_read(tmp_path):
    (tmp_path / "a.tar").write_bytes(_header("x.jpg", 3) + b"abc".ljust(512, b"\0") +
                                     _header("y.jpg", 1, b0=ord("z")))     # checksum broken
    piece = Piece("a.tar", str(tmp_path / "a.tar"), (tmp_path / "a.tar").stat().st_size)
    reader = piece.reader()
    got = []
    with pytest.raises(TarDamaged, match="at byte 1024: its header is damaged"):
        for m in members(reader, "a.tar", piece.size):
            got.append((m.name, reader.read(m.size)))
    assert got == [("x.jpg", b"abc")]
    # a pax header that claims more than is read
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, 1 << 30
    (tmp_path / "b.tar").write_bytes(pax.tobuf(tarfile.USTAR_FORMAT) + bytes(4096))
    with pytest.raises(TarDamaged, match="an extended header of 1,073,741,824 bytes"):
        list(members(Piece("b", str(tmp_path / "b.tar"), 4608).reader(), "b.tar"))


def test_a_tar_member_read_in_order_from_a_stream(tmp_path):
    """The same members from a seekable file and from a stream of odd-sized chunks."""
    from fastdata.converters.sources.pieces import ChunkReader

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for k in range(5):
            info = tarfile.TarInfo(f"{k}.bin")
            info.size = 1000 * k + 1
            tf.addfile(info, io.BytesIO(bytes([k]) * info.size))
    raw = buf.getvalue()
    reader = ChunkReader(iter(raw[k:k + 333] for k in range(0, len(raw), 333)))
    got = [(m.name, reader.read(m.size)) for m in members(reader, "s")]
    assert got == [(f"{k}.bin", bytes([k]) * (1000 * k + 1)) for k in range(5)]
