"""Run and session ids: unique, in the order a process made them, fresh after a fork."""

from __future__ import annotations

import os
import re
import select
import time

from anabranch.runtime._ids import new_id

_ID = re.compile(r"run_[0-9a-f]{16}")


def test_ids_are_the_prefix_and_16_hex_digits_in_the_order_they_were_made() -> None:
    ids = [new_id("run") for _ in range(20_000)]
    assert all(_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    # sorted as text is sorted as made: the store's run-keyed indexes get adjacent keys
    assert ids == sorted(ids)
    assert new_id("ses").startswith("ses_")


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    """Without a fresh start in the child, parent and child would make the same ids
    (up to 16 random bits) from the same counter."""
    new_id("run")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        try:
            os.write(write_end, new_id("run").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent_next = new_id("run")
    deadline = time.monotonic() + 30
    try:
        ready, _, _ = select.select([read_end], [], [], 30)
        assert ready, "the forked child reported no id within 30 s"
        child_id = os.read(read_end, 64).decode()
    finally:
        os.close(read_end)
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the forked child did not exit"
            time.sleep(0.01)
    assert _ID.fullmatch(child_id)
    # the same counter position with the same start would share every bit above the 16th
    assert int(child_id[4:], 16) >> 16 != int(parent_next[4:], 16) >> 16
