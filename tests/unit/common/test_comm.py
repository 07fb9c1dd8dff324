"""The byte counter: totals per direction and client, control traffic apart, and CT per step."""

from __future__ import annotations

from common.comm import CommCounter


def test_bytes_per_step_are_per_participating_client_and_control_traffic_stays_apart():
    comm = CommCounter()
    # step 1: clients 0 and 1 answer; step 2: client 0 answers, client 2 refuses (bytes, no participation)
    for client, down, up in ((0, 1000, 400), (1, 1000, 400), (0, 1000, 400), (2, 1000, 60)):
        comm.add_down(client, down, 100)
        comm.add_up(client, up, 50)
    comm.count_participation(2)
    comm.count_participation(1)
    comm.add_control(5000, 700)  # the hello and the ledger fetch are no generator step
    assert comm.per_step() == {"down": 4000 / 3, "up": 1260 / 3, "total": 5260 / 3}
    assert (comm.down_total, comm.up_total, comm.down[0], comm.up[2]) == (4000, 1260, 2000, 60)
    summary = comm.summary()
    assert (summary["control_bytes_down_total"], summary["envelope_bytes_up_total"]) == (5000, 200)
    assert summary["participations"] == 3 and summary["bytes_per_step"] == comm.per_step()


def test_no_step_yet_is_zero_not_a_division_by_zero_and_state_round_trips():
    assert CommCounter().per_step() == {"down": 0.0, "up": 0.0, "total": 0.0}
    comm = CommCounter()
    comm.add_down(3, 10, 1)
    comm.add_up(3, 7, 1)
    comm.count_participation()
    again = CommCounter.from_state_dict(comm.state_dict())
    assert again.summary() == comm.summary() and again.down[3] == 10
