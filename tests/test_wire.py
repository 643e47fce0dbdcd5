"""The one 64-bit varint decoder (otel_replay/_wire.py) against the encoder, protobuf's own, and hostile bytes."""

from __future__ import annotations

import mmap

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # protobuf's reference decoder

from otel_replay._wire import MAX_VARINT_BYTES, read_varint, varint, varint_of
from otel_replay.storage.logs import logs_payload, wrap_logs

_VALUES = [0, 1, 127, 128, 300, 4095, 4096, 2**31, 2**32 + 5, 2**63, 2**64 - 1]


@pytest.mark.parametrize("value", _VALUES)
def test_what_the_encoder_writes_decodes_back_as_protobuf_reads_it(value: int) -> None:
    data = b"\xaa" + varint(value) + b"\xbb"  # the decoder starts where it is told and stops at the varint's end
    assert read_varint(data, 1) == (value, 1 + len(varint_of(value))) == _DecodeVarint(data, 1)


@pytest.mark.parametrize(
    ("data", "at", "end"),
    [
        (b"", 0, None),  # nothing there
        (b"\x80", 0, None),  # the buffer ends inside the varint
        (b"\x81\x01", 0, 1),  # ``end`` cuts it
        (b"\xff" * 11 + b"\x01", 0, None),  # longer than ten bytes: not a varint, however long the buffer
        (b"\x05", 3, None),  # starting past the end
    ],
    ids=["empty", "cut", "end", "too-long", "past"],
)
def test_bytes_holding_no_whole_varint_give_minus_one(data: bytes, at: int, end: int | None) -> None:
    assert read_varint(data, at, end) == (0, -1)


def test_the_tenth_byte_is_read_and_an_eleventh_is_not() -> None:
    ten = b"\x80" * (MAX_VARINT_BYTES - 1) + b"\x01"
    assert read_varint(ten, 0) == (2**63, 10)
    assert read_varint(b"\x80" * MAX_VARINT_BYTES + b"\x01", 0) == (0, -1)


def test_it_reads_a_memory_map(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "m"
    path.write_bytes(b"\x00" + varint(2**40) + b"\x00")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert read_varint(data, 1) == (2**40, 7)


def test_a_wrapped_log_request_with_a_hostile_length_is_not_taken_for_one() -> None:
    assert logs_payload(wrap_logs(b"payload")) == b"payload"
    assert logs_payload(b"\x12" + b"\xff" * 11 + b"\x01") is None  # a length varint past ten bytes
    assert logs_payload(b"\x12" + varint(2**63) + b"x") is None  # a length past the record
