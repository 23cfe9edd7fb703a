"""Sort benchmark records: a gensort-like generator, range partitioning from
a sample of keys, and a valsort-like validator. Pure Python (the standard
library only), so every function of the sort can import it.

Record layout (100 bytes, as gensort's ASCII-free "binary" records):

    bytes  0..9    key: 10 pseudo-random bytes
    bytes 10..11   0x00 0x11
    bytes 12..43   the record number, 32 upper-case hex digits
    bytes 44..47   0x88 0x99 0xAA 0xBB
    bytes 48..95   filler: the record number's 12 low hex digits, 4 times
    bytes 96..99   0xCC 0xDD 0xEE 0xFF

Keys are deterministic in (seed, record number): record i's key is bytes
10·(i mod B) .. +10 of BLAKE2b-XOF-like block i div B (SHAKE-128 of the
seed and the block number, B = 1024 records per block). So any record range
is generated on its own, without the rest: each mapper generates its own
input slice, nothing is uploaded.

Checksum (as valsort's): the sum of every record's CRC-32 modulo 2^64. It
does not depend on the order, so the input's (computable per slice, added
up) equals the output's exactly when the output holds the same records.
"""

from __future__ import annotations

import bisect
import hashlib
import zlib
from dataclasses import dataclass
from typing import Iterable, Sequence

RECORD = 100
KEY = 10
BLOCK = 1024  # records per key block
MASK64 = (1 << 64) - 1

_FILLER_LO = 20  # the 12 low hex digits of the 32-digit record number


def _key_block(seed: int, block: int) -> bytes:
    return hashlib.shake_128(b"ziptrail-sort:%d:%d" % (seed, block)).digest(KEY * BLOCK)


def keys(seed: int, start: int, stop: int) -> bytes:
    """The keys of records start..stop-1, concatenated (10 bytes each)."""
    if stop <= start:
        return b""
    first, last = start // BLOCK, (stop - 1) // BLOCK
    blob = b"".join(_key_block(seed, b) for b in range(first, last + 1))
    off = (start - first * BLOCK) * KEY
    return blob[off:off + (stop - start) * KEY]


_C1, _C2, _C3 = b"\x00\x11", b"\x88\x99\xaa\xbb", b"\xcc\xdd\xee\xff"


def generate_records(seed: int, start: int, stop: int) -> list[bytes]:
    """Records start..stop-1 (100 bytes each) of the data set ``seed``, as
    a list of bytes objects (what a mapper sorts)."""
    if stop <= start:
        return []
    k = keys(seed, start, stop)
    return [k[KEY * j:KEY * j + KEY] + _C1 + h + _C2 + h[_FILLER_LO:] * 4 + _C3
            for j, h in enumerate([b"%032X" % i for i in range(start, stop)])]


def generate(seed: int, start: int, stop: int) -> bytes:
    """Records start..stop-1 of the data set ``seed``, concatenated."""
    return b"".join(generate_records(seed, start, stop))


def checksum(data: bytes | bytearray | memoryview) -> int:
    """Sum of the records' CRC-32s modulo 2^64 (order-independent)."""
    mv = memoryview(data)
    if mv.nbytes % RECORD:
        raise ValueError(f"{mv.nbytes} bytes is not a whole number of {RECORD}-byte records")
    crc = zlib.crc32
    return sum(crc(mv[i:i + RECORD]) for i in range(0, mv.nbytes, RECORD)) & MASK64


def expected(seed: int, records: int, chunk: int = 1 << 16) -> "Summary":
    """The summary of the whole input (records and checksum), generated
    chunk by chunk."""
    total = 0
    for a in range(0, records, chunk):
        total += checksum(generate(seed, a, min(records, a + chunk)))
    return Summary(records=records, checksum=total & MASK64, sorted=True, first=b"", last=b"", unsorted_at=-1, duplicates=0)


def sample_boundaries(seed: int, records: int, partitions: int, sample_blocks: int = 16) -> list[bytes]:
    """partitions-1 split keys: the quantiles of a sample of the input's
    keys, the keys of ``sample_blocks`` key blocks (1024 records each)
    spread evenly over the input (range partitioning from a sample)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    blocks = max(1, -(-records // BLOCK))
    picks = sorted({(j * blocks) // sample_blocks for j in range(min(sample_blocks, blocks))})
    ks = []
    for b in picks:
        k = keys(seed, b * BLOCK, min(records, (b + 1) * BLOCK))
        ks.extend(k[i:i + KEY] for i in range(0, len(k), KEY))
    ks.sort()
    return [ks[(p * len(ks)) // partitions] for p in range(1, partitions)]


def split_records(data: bytes | bytearray | memoryview) -> list[bytes]:
    """The records of a buffer, as bytes objects (one copy)."""
    mv = memoryview(data)
    if mv.nbytes % RECORD:
        raise ValueError(f"{mv.nbytes} bytes is not a whole number of {RECORD}-byte records")
    b = mv.tobytes() if not isinstance(data, bytes) else data
    return [b[i:i + RECORD] for i in range(0, len(b), RECORD)]


def sort_records(buffers: Iterable[bytes | bytearray | memoryview]) -> list[bytes]:
    """All records of the buffers in order. Whole records are compared, so
    records with equal keys are ordered by the rest (the record number):
    the order is total and the output the same whatever the input order.
    Sorted inputs (runs) make this a k-way merge: Python's sort (timsort)
    finds the runs and merges them."""
    recs: list[bytes] = []
    for b in buffers:
        recs.extend(split_records(b))
    recs.sort()
    return recs


def partition_sorted(recs: Sequence[bytes], boundaries: Sequence[bytes]) -> list[list[bytes]]:
    """Splits sorted records by the boundaries: partition p holds keys in
    [boundaries[p-1], boundaries[p])."""
    ks = [r[:KEY] for r in recs] if boundaries else []
    cuts = [0] + [bisect.bisect_left(ks, b) for b in boundaries] + [len(recs)]
    return [list(recs[cuts[p]:cuts[p + 1]]) for p in range(len(boundaries) + 1)]


@dataclass
class Summary:
    """What valsort reports for a file: record count, checksum, whether the
    records are in order (and the first record out of order), first and
    last keys (to check order across files), duplicate keys."""

    records: int
    checksum: int
    sorted: bool
    first: bytes
    last: bytes
    unsorted_at: int
    duplicates: int

    def to_json(self) -> dict:
        return {"records": self.records, "checksum": f"{self.checksum:016x}", "sorted": self.sorted,
                "first": self.first.hex(), "last": self.last.hex(), "unsortedAt": self.unsorted_at,
                "duplicates": self.duplicates}

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        return cls(records=d["records"], checksum=int(d["checksum"], 16), sorted=d["sorted"],
                   first=bytes.fromhex(d["first"]), last=bytes.fromhex(d["last"]),
                   unsorted_at=d.get("unsortedAt", -1), duplicates=d.get("duplicates", 0))


def validate(data: bytes | bytearray | memoryview) -> Summary:
    """valsort of one buffer: the records must be in non-decreasing key
    order; counts, checksums and duplicate keys."""
    mv = memoryview(data)
    if mv.nbytes % RECORD:
        raise ValueError(f"{mv.nbytes} bytes is not a whole number of {RECORD}-byte records")
    n = mv.nbytes // RECORD
    b = bytes(mv)
    ks = [b[i:i + KEY] for i in range(0, len(b), RECORD)]
    unsorted_at, dups = -1, 0
    for i in range(1, n):
        if ks[i] < ks[i - 1]:
            if unsorted_at < 0:
                unsorted_at = i
        elif ks[i] == ks[i - 1]:
            dups += 1
    return Summary(records=n, checksum=checksum(mv), sorted=unsorted_at < 0, first=ks[0] if n else b"",
                   last=ks[-1] if n else b"", unsorted_at=unsorted_at, duplicates=dups)


def combine(parts: Sequence[Summary]) -> Summary:
    """valsort -s: the summary of the files in order, checking the order
    across them (each file's first key not below the previous last key)."""
    total, ck, ok, dups = 0, 0, True, 0
    first, last, unsorted_at = b"", b"", -1
    for s in parts:
        if not s.sorted and unsorted_at < 0:
            unsorted_at = total + s.unsorted_at
        ok = ok and s.sorted
        if s.records:
            if last and s.first < last:
                ok = False
                if unsorted_at < 0:
                    unsorted_at = total
            elif last and s.first == last:
                dups += 1
            if not first:
                first = s.first
            last = s.last
        total += s.records
        ck += s.checksum
        dups += s.duplicates
    return Summary(records=total, checksum=ck & MASK64, sorted=ok, first=first, last=last, unsorted_at=unsorted_at,
                   duplicates=dups)
