"""Ring-algorithm wire bytes (NCCL bus-bandwidth accounting) for every op."""

import pytest

from paralab.comm import wire_bytes


@pytest.mark.parametrize(
    "op, n, expected",
    [
        ("all_reduce", 4, 2 * 3 * 1000 // 4),
        ("all_reduce", 2, 1000),
        ("all_gather", 4, 750),
        ("reduce_scatter", 8, 875),
        ("broadcast", 2, 500),
        ("send", 2, 1000),
        ("recv", 2, 0),
        ("all_reduce", 1, 0),
    ],
)
def test_wire_bytes(op, n, expected):
    assert wire_bytes(op, 1000, n) == expected


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="unknown communication op"):
        wire_bytes("all_to_some", 10, 2)
