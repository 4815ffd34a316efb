"""Tar archives read header by header, in one pass, from any ``Reader`` (a local file, a
store's stream, a gzip stream): POSIX ustar, GNU long names and pax ``path``/``size``
records. Written here rather than through ``tarfile`` so that nothing in a header is trusted:
a header whose checksum fails, a size that runs past the archive's end, an extended header
larger than ``MAX_EXTENDED`` end the archive with a reason instead of a read of what it
claims. Members are never extracted: a name is only a key.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fastdata.converters.sources.pieces import Reader

BLOCK = 512
#: the most bytes of a GNU long name or a pax header read
MAX_EXTENDED = 1 << 20
_REGULAR = (b"0", b"\0", b"7")


class TarDamaged(OSError):
    """The archive cannot be read past this point (the message says where and why);
    ``in_data``: the damage is inside the data of the member last given (a header's damage
    leaves the members before it whole)."""

    in_data = False


@dataclass(frozen=True)
class Member:
    """A member's header: its name, where its data starts in the archive and its size, and
    whether it is a regular file (directories, links and devices are not)."""

    name: str
    offset: int
    size: int
    regular: bool


def _number(field: bytes, where: str) -> int:
    """A header's numeric field: octal digits, or GNU's base-256 (the top bit set)."""
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise TarDamaged(f"{where}: a negative number in its header")
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    digits = field.replace(b"\0", b" ").strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarDamaged(f"{where}: its header is damaged (not a number: "
                         f"{digits[:12]!r})") from None


def _checked(block: bytes, where: str) -> None:
    """Refuse a header whose checksum (the sum of its bytes, the checksum's own as spaces)
    is not the one it holds."""
    stored = _number(block[148:156], where)
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if stored == unsigned:
        return
    high = block[:148] + block[156:]        # some writers sum the bytes as signed
    signed = unsigned - 256 * (len(high) - len(high.translate(None, bytes(range(128, 256)))))
    if stored != signed:
        raise TarDamaged(f"{where}: its header is damaged (checksum {stored}, its bytes sum "
                         f"to {unsigned})")


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes, where: str) -> dict[str, str]:
    """A pax header's records (``LENGTH KEY=VALUE\\n``)."""
    out, at = {}, 0
    while at < len(data):
        space = data.find(b" ", at)
        try:
            length = int(data[at:space])
        except ValueError:
            raise TarDamaged(f"{where}: a damaged pax header") from None
        if space < 0 or length <= 0 or at + length > len(data):
            raise TarDamaged(f"{where}: a damaged pax header")
        key, _, value = data[space + 1:at + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        at += length
    return out


def members(reader: Reader, shown: str, size: int | None = None) -> Iterator[Member]:
    """The members of the archive ``reader`` reads from its start, in order. After each, the
    caller may read its data (``reader.read(member.size)``) or not: the next header is found
    either way. ``size``: the archive's size where known (a member said to run past it ends
    the archive there, before its data is asked for).

    Raises:
        TarDamaged: a header that is damaged or cut off, or data that runs past the end
            (naming ``shown`` and the byte).
    """
    extended: dict[str, str] = {}
    while True:
        at = reader.tell()
        block = reader.read(BLOCK)
        where = f"{shown} at byte {at}"
        if not block or block == bytes(BLOCK):
            return          # the end blocks, or an archive written without them
        if len(block) < BLOCK:
            raise TarDamaged(f"{where}: cut off inside a header")
        _checked(block, where)
        kind, length = block[156:157], _number(block[124:136], where)
        name = _text(block[:100])
        if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
            name = _text(block[345:500]) + "/" + name
        if kind in (b"L", b"x", b"g"):
            extended.update(_extended(reader, kind, length, where))
            continue
        member = Member(extended.get("path", name), at + BLOCK,
                        int(extended["size"]) if "size" in extended else length,
                        kind in _REGULAR)
        extended = {}
        data_end = member.offset + member.size
        if size is not None and data_end > size:
            raise TarDamaged(f"{where}: a member of {member.size:,} bytes runs past the "
                             f"archive's end ({size:,} bytes): it is cut short or its header "
                             f"is damaged")
        yield member
        need = member.offset + -(-member.size // BLOCK) * BLOCK - reader.tell()
        if reader.skip(need) < need and reader.tell() < data_end:
            e = TarDamaged(f"{shown}: cut off inside the data of {member.name!r} (byte "
                           f"{reader.tell()} of the {data_end} it needs)")
            e.in_data = True
            raise e


def _extended(reader: Reader, kind: bytes, length: int, where: str) -> dict[str, str]:
    """A GNU long name's or a pax header's data, as the entries it sets for the next member
    (a global pax header's are dropped)."""
    if length > MAX_EXTENDED:
        raise TarDamaged(f"{where}: an extended header of {length:,} bytes, more than the "
                         f"{MAX_EXTENDED:,} read")
    data = reader.read(-(-length // BLOCK) * BLOCK)[:length]
    if len(data) < length:
        raise TarDamaged(f"{where}: cut off inside an extended header")
    if kind == b"L":
        return {"path": _text(data)}
    found = _pax(data, where)
    if kind == b"g":
        return {}
    out = {k: found[k] for k in ("path",) if k in found}
    if "size" in found:
        if not found["size"].isdigit():
            raise TarDamaged(f"{where}: a pax size that is not a number")
        out["size"] = found["size"]
    return out
