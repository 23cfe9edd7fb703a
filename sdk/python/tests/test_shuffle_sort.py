"""examples/sort's generator and validator (records.py): records are
deterministic per (seed, record range), the checksum adds up over slices,
range partitioning splits sorted records in key order, and the validator
accepts a sorted output and detects every kind of corrupted one."""

from __future__ import annotations

import sys
import zlib

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "sort"))
import records as R  # noqa: E402


def test_records_are_the_sort_benchmark_layout_and_deterministic_per_range():
    data = R.generate(5, 0, 3000)
    assert len(data) == 3000 * R.RECORD
    assert R.generate(5, 1000, 2500) == data[1000 * R.RECORD:2500 * R.RECORD], "a slice is generated on its own"
    assert R.generate(6, 0, 10) != data[:10 * R.RECORD], "the seed matters"
    rec = data[1234 * R.RECORD:1235 * R.RECORD]
    assert rec[10:12] == b"\x00\x11" and rec[44:48] == b"\x88\x99\xaa\xbb" and rec[96:] == b"\xcc\xdd\xee\xff"
    assert rec[12:44] == b"%032X" % 1234
    assert rec[48:96] == (b"%032X" % 1234)[20:] * 4
    assert rec[:10] == R.keys(5, 1234, 1235)


def test_checksum_adds_up_over_slices_and_matches_expected():
    whole = R.checksum(R.generate(9, 0, 5000))
    parts = sum(R.checksum(R.generate(9, a, min(5000, a + 700))) for a in range(0, 5000, 700)) & R.MASK64
    assert whole == parts == R.expected(9, 5000, chunk=999).checksum
    assert whole == sum(zlib.crc32(r) for r in R.generate_records(9, 0, 5000)) & R.MASK64


def sorted_partitions(seed: int, n: int, parts: int) -> list[bytes]:
    recs = R.generate_records(seed, 0, n)
    recs.sort()
    return [b"".join(p) for p in R.partition_sorted(recs, R.sample_boundaries(seed, n, parts))]


def test_sort_partition_validate():
    n = 20_000
    outs = sorted_partitions(11, n, 4)
    assert len(outs) == 4 and all(len(o) > n * R.RECORD // 8 for o in outs), "a sample gives balanced ranges"
    sums = [R.validate(o) for o in outs]
    assert all(s.sorted for s in sums)
    total = R.combine(sums)
    want = R.expected(11, n)
    assert (total.sorted, total.records, total.checksum) == (True, n, want.checksum)
    # A k-way merge of sorted runs gives the same bytes as sorting all at once.
    runs = [b"".join(sorted(R.generate_records(11, a, a + 5000))) for a in range(0, n, 5000)]
    assert b"".join(R.sort_records(runs)) == b"".join(outs)


def corrupt(outs: list[bytes], how: str) -> list[bytes]:
    outs = [bytearray(o) for o in outs]
    r = R.RECORD
    if how == "swap records":  # same records, out of order within a partition
        o = outs[1]
        o[0:r], o[5 * r:6 * r] = o[5 * r:6 * r], o[0:r]
    elif how == "swap partitions":  # each sorted, the order across them broken
        outs[0], outs[2] = outs[2], outs[0]
    elif how == "flip a payload byte":  # order intact, a record changed
        outs[2][50 * r + 60] ^= 0x01
    elif how == "drop a record":
        del outs[3][-r:]
    elif how == "duplicate a record":
        outs[3] += outs[3][-r:]
    return [bytes(o) for o in outs]


@pytest.mark.parametrize("how", ["swap records", "swap partitions", "flip a payload byte", "drop a record",
                                 "duplicate a record"])
def test_validator_detects_a_corrupted_output(how: str):
    n = 8000
    want = R.expected(13, n)
    outs = corrupt(sorted_partitions(13, n, 4), how)
    total = R.combine([R.validate(o) for o in outs])
    valid = total.sorted and total.records == want.records and total.checksum == want.checksum
    assert not valid, how
    if how.startswith("swap"):
        assert not total.sorted and total.unsorted_at >= 0
        assert total.checksum == want.checksum, "reordering keeps the checksum: the order check catches it"
    if how == "flip a payload byte":
        assert total.sorted and total.records == n and total.checksum != want.checksum


def test_validate_refuses_partial_records():
    with pytest.raises(ValueError):
        R.validate(b"x" * 150)
