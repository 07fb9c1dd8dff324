"""One hostile or broken client never stops a run, freezes the generator or rewrites another
client's report (issue 14). Each rogue is a ClientApp wrapper on the in-process transport: one
partition answers with whatever the test wants, the others are honest."""

from __future__ import annotations

from flwr.app import Error, Message

from client.app import app as client_app
from tests.integration.test_loop_inprocess import cfg_for, run_inprocess

ROGUE = 1


def _rogue(answer):
    """A ClientApp whose partition ROGUE answers GS-WGAN queries with ``answer(message, context, honest)``."""

    def app(message, context):
        if context.node_config["partition-id"] == ROGUE and message.metadata.message_type == "train.gswgan":
            return answer(message, context)
        return client_app(message, context)

    return app


def _raises(message, context):
    raise KeyError("pixels")  # e.g. a FEMNIST writer without its pixels


def _error_reply(message, context):
    return Message(Error(code=1, reason="the ClientApp failed"), reply_to=message)


def test_a_client_that_raises_or_answers_an_error_is_marked_failed_and_the_run_goes_on(tmp_path):
    for name, behaviour, cause in (
        ("raise", _raises, "KeyError: 'pixels'"),
        ("error", _error_reply, "ClientApp failed"),
    ):
        cfg = cfg_for(tmp_path, name, steps=8)
        _, summary = run_inprocess(cfg, app=_rogue(behaviour))
        assert summary["status"] == "completed" and summary["steps_completed"] == 8, name
        rogue = summary["clients"][ROGUE]
        assert rogue["status"] == "failed" and cause in " ".join(summary["notes"]), name


def _huge(message, context):
    """An answer of the right shape and encoding, every row of norm ~1e30 (finite)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord

    reply = client_app(message, context)
    grad = np.full((8, 1, 28, 28), 1e30 / 28, np.float32)
    reply.content["arrays"] = ArrayRecord({"grad": Array(grad)})
    reply.content.config_records["scalars"]["grad_encoding"] = "float32"
    return reply


def test_an_answer_no_honest_client_can_send_is_dropped_and_the_generator_keeps_learning(tmp_path):
    """1e30-norm rows used to saturate Adam's second moment (inf) and freeze G for good."""
    import torch

    from server.reporting import RunDirectory

    cfg = cfg_for(tmp_path, steps=10)
    run, summary = run_inprocess(cfg, app=_rogue(_huge))
    assert summary["status"] == "completed"
    assert any("no honest client sends" in n and "exceeds" in n for n in summary["notes"])
    assert summary["clients"][ROGUE]["status"] == "failed"
    state = RunDirectory.open_existing(cfg.out)[0].load_checkpoint()
    generator = state["strategy"]["generator"]
    moments = [v for s in generator["optimizer"]["state"].values() for v in s.values() if torch.is_tensor(v)]
    assert moments and all(bool(torch.isfinite(m).all()) for m in moments)
    assert all(bool(torch.isfinite(w).all()) for w in generator["model"].values())


def test_the_honest_bound_holds_for_honest_answers():
    """No honest answer is ever dropped: rows of pure noise at the bound's own σ stay far below it."""
    import numpy as np

    from common.methods import ExperimentConfig
    from common.methods.gswgan.privacy import honest_norm_bound, implausible_norms

    for sigma, dct in ((0.0, 0), (1.07, 0), (6.0, 8)):
        cfg = ExperimentConfig(noise_multiplier=sigma, grad_dct=dct)
        d = dct * dct if dct else 784
        rows = np.random.default_rng(0).normal(0, 2 * sigma, (2000, d)).astype(np.float32)
        rows[:, 0] += 1.0  # a clipped gradient of norm C = 1 in one direction
        assert implausible_norms(rows, cfg) == ""
        assert implausible_norms(rows * 0 + honest_norm_bound(cfg), cfg) != ""


def _garbled_ledger(text):
    def app(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == ROGUE and message.metadata.message_type == "query.ledger":
            reply.content.config_records["scalars"]["ledger"] = text
        return reply

    return app


def test_a_garbled_ledger_reply_is_noted_and_the_report_is_still_written(tmp_path):
    import json

    garbage = [
        "not json",
        "[]",
        json.dumps({"format": 1, "history": 5}),
        json.dumps({"format": 1, "history": [{"noise_multiplier": 1.0, "sample_rate": 1.0, "count": 1e400}]}),
    ]
    for i, text in enumerate(garbage):
        cfg = cfg_for(tmp_path, f"run{i}", steps=4)
        run, summary = run_inprocess(cfg, app=_garbled_ledger(text))
        assert summary["status"] == "completed", text
        assert (run.path / "privacy.json").exists() and (run.path / "summary.json").exists()
        assert any(f"(client {ROGUE})" in n and "ledger" in n for n in summary["notes"]), (text, summary["notes"])
        # the rogue's figure is the server's own record of what it sent (never the garbage)
        assert summary["clients"][ROGUE]["queries"] >= 0


def _chatty(message, context):
    """An answer carrying 20,000 statistics nobody asked for."""
    from flwr.app import ConfigRecord

    reply = client_app(message, context)
    reply.content["stats"] = ConfigRecord({f"k{i}": float(i) for i in range(20_000)})
    return reply


def _long_refusal(message, context):
    from common.methods.gswgan.messages import GsAnswer, GsQuery
    from protos import wire

    query = wire.decode(GsQuery, message.content)
    return wire.reply(GsAnswer(step=query.step, refused=True, reason="x" * 5_000_000), message)


def test_what_was_not_asked_for_is_dropped_and_a_long_reason_is_bounded(tmp_path):
    import json

    cfg = cfg_for(tmp_path, "chatty", steps=6)
    run, summary = run_inprocess(cfg, app=_rogue(_chatty))
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    assert summary["status"] == "completed" and not any('"train/k1' in line for line in lines)
    assert max(len(line) for line in lines) < 20_000
    cfg = cfg_for(tmp_path, "refusal", steps=6)
    run, summary = run_inprocess(cfg, app=_rogue(_long_refusal))
    notes = [n for n in summary["notes"] if "xxxx" in n]
    assert notes and all(len(n) < 700 for n in notes) and "characters dropped" in notes[0]
    assert (run.path / "checkpoint.pt").stat().st_size < 2_000_000
    assert len(json.dumps(json.loads((run.path / "summary.json").read_text()))) < 1_000_000


def _first_to_run_sleeps(marker: str, sleep_s: float):
    """A ClientApp whose first GS-WGAN query to run, whichever node it is for, sleeps ``sleep_s``
    first: with one ClientApp actor every other query of that step is queued behind it. (The marker
    file picks it across the actor's process; which node comes first is the runtime's choice.)"""

    def app(message, context):
        import os
        import time

        if message.metadata.message_type == "train.gswgan":
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                time.sleep(sleep_s)
        return client_app(message, context)

    return app


def test_simulate_marks_a_slow_client_failed_and_not_the_clients_queued_behind_it(tmp_path):
    """Issue 14, item 6: Flower's simulation transport ignored --reply-timeout-s (a client sleeping 40 s
    a step was waited for at every step). Issue 23, item 13: the timeout then bounded the whole
    exchange, so the honest clients queued behind a sleeper in the one ClientApp actor timed out too
    and the run stopped after one step. Each client's deadline now runs from when its ClientApp starts."""
    from server.reporting import RunDirectory
    from simulations.experiments.simulate import _experiment_fn, run_on_transport

    cfg = cfg_for(tmp_path, steps=2, num_clients=3, clients_per_step=3, reply_timeout_s=2.0)
    run = RunDirectory.create(cfg)
    app = _first_to_run_sleeps(str(tmp_path / "slept"), sleep_s=6.0)
    summary, error = run_on_transport(
        3,
        _experiment_fn(cfg, run, False, None, "flower-simulation"),
        "flower",
        reply_timeout_s=2.0,
        client_app=app,
        node_state=run.state_dir,
    )
    assert error is None, error
    assert summary["status"] == "completed" and summary["steps_completed"] == 2, summary["status"]
    failed = [c for c in summary["clients"] if c["status"] == "failed"]
    assert len(failed) == 1 and "no reply within 2 s" in failed[0]["failure"], failed
    # the two honest clients answered both steps, the first one included
    assert sorted(c["queries"] for c in summary["clients"] if c["status"] != "failed") == [2, 2]
