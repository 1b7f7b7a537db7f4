"""ZB-V's orders are pinned. Its list scheduling was rewritten to cost a small constant a pass (a
1,024-GPU prediction had spent 2 s in it); the rewrite was checked against the earlier search on
every (ranks 2-16, microbatches 1-64, seven pass-time ratios) shape, each of the three rules' orders
and end times alike. The fingerprints below are of the orders that earlier search built, so that a
later speed-up cannot change a schedule unnoticed: a deliberate change of order updates them."""

import hashlib

import pytest

from paralab.schedules import _zbv_list_order, build_schedule

RULES = ((False, 0), (True, 0), (True, 1))  # (forward_first, reserve), in the order _zbv tries them


def fingerprint(schedule) -> str:
    """A digest of every rank's actions, p2p included, in order."""
    text = "\n".join(" ".join(f"{a.op}:{a.stage}:{a.microbatch}:{a.peer}:{a.overlapped}" for a in actions)
                     for actions in schedule.actions)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize(("p", "m", "times", "digest", "ends"), [
    (2, 8, (1.0, 1.0, 1.0), "1f272609bc8cda23", (49.0, 49.0, 49.0)),
    # the Bi-first search stalls, and the other two end a rounding error apart: the last one is kept
    (2, 8, (1.0, 1.9, 0.1), "402882c33d31377e", (None, 51.5, 51.49999999999999)),
    (4, 16, (1.0, 1.5, 0.5), "0afb2000b6091e73", (101.5, 101.5, 102.0)),
    (8, 9, (1.0, 1.4, 0.6), "0559e019eb1056a7", (85.40000000000006, 70.2, 68.6)),
    (8, 64, (1.0, 1.1, 0.7), "7eb94cace81a3b72",
     (410.60000000000036, 370.89999999999986, 370.89999999999986)),
    # GPT-3 175B on 1,024 GPUs (tp 8 x pp 16 x dp 8, 192 microbatches), as the simulator orders it
    (16, 192, (1.0, 1.2, 0.7), "4daf4bc5d7fd28a3",
     (1159.5000000000184, 1144.100000000018, 1142.700000000018)),
])
def test_zbv_builds_the_orders_pinned_for_each_shape_and_pass_times(p, m, times, digest, ends):
    """The kept order, and when each rule's order ends (which decides the one kept), to the last bit."""
    assert fingerprint(build_schedule("zbv", p, m, pass_times=times)) == digest
    v_placement = list(range(p)) + list(reversed(range(p)))
    found = [_zbv_list_order(p, m, v_placement, times, *rule) for rule in RULES]
    assert tuple(None if order is None else order[1] for order in found) == ends
