"""The round loop through the in-process transport: resume, budgets, faulty clients, bad input."""

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from client.app import app as client_app
from common.methods import ExperimentConfig
from common.methods.gswgan.server import GsWganServer
from server.loop import NodeRefused, run_experiment
from server.reporting import RunDirectory, RunDirectoryError
from server.transport import InProcessTransport
from tests.helpers import ALLOW_NONPRIVATE, tiny_cfg


def cfg_for(tmp_path, name="run", **changes) -> ExperimentConfig:
    base = dict(steps=6, n_critic=2, log_every=1, sample_every=100, checkpoint_every=100, sampling_seed=3)
    return tiny_cfg(tmp_path / name, **{**base, **changes})


def run_inprocess(cfg, *, resume=False, app=client_app, transport=None, prior=None):
    """Nodes pin a policy that allows the testing options (fixed noise seeds, σ = 0)."""
    run = RunDirectory.open_existing(cfg.out)[0] if resume else RunDirectory.create(cfg)
    if resume:
        run.write_json("config.json", cfg.to_dict())
    transport = transport or InProcessTransport(
        app, cfg.num_clients, node_config=ALLOW_NONPRIVATE, node_state=run.state_dir
    )
    return run, run_experiment(cfg, run, transport, resume=resume, transport_name="inprocess", prior=prior)


def test_resume_continues_exactly(tmp_path):
    straight_cfg = cfg_for(tmp_path, "straight", noise_seed=3)
    straight_run, straight = run_inprocess(straight_cfg)
    part_cfg = cfg_for(tmp_path, "parts", steps=3, noise_seed=3)
    part_run, first = run_inprocess(part_cfg)
    assert first["steps_completed"] == 3
    _, resumed = run_inprocess(part_cfg.replace(steps=6), resume=True)
    assert resumed["steps_completed"] == 6
    assert [c["queries"] for c in resumed["clients"]] == [c["queries"] for c in straight["clients"]]
    assert resumed["comm"]["bytes_up_total"] == straight["comm"]["bytes_up_total"]
    a = torch.load(straight_run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]
    b = torch.load(part_run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]
    for key in a["ema"]["module"]:
        assert torch.equal(a["ema"]["module"][key], b["ema"]["module"][key]), key
    lines = (part_run.path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == list(range(1, 7))


def test_budget_refusals_stop_the_run_cleanly(tmp_path):
    cfg = cfg_for(tmp_path, steps=50, client_epsilon_budget=30.0, noise_multiplier=2.0)
    run, summary = run_inprocess(cfg)
    assert summary["status"].startswith("stopped")
    assert 0 < summary["steps_completed"] < 50
    for c in summary["clients"]:
        assert c["epsilon"] <= 30.0
    assert any("refuses" in note for note in summary["notes"])
    assert (run.path / "checkpoint.pt").exists()


def _corrupting(node_offset: int, kind: str):
    def app(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == node_offset and message.metadata.message_type == "train.gswgan":
            grad = np.zeros((8, 1, 28, 28), np.float32)
            bad = {"nan": np.full_like(grad, np.nan), "shape": grad[:-1]}[kind]
            reply.content["arrays"] = ArrayRecord({"grad": Array(bad)})
            reply.content.config_records["scalars"]["grad_encoding"] = "float32"
        return reply

    return app


@pytest.mark.parametrize("kind", ["nan", "shape"])
def test_malformed_answers_are_dropped_and_the_run_goes_on(tmp_path, kind):
    cfg = cfg_for(tmp_path, steps=8)
    _, summary = run_inprocess(cfg, app=_corrupting(1, kind))
    assert summary["status"] == "completed" and summary["steps_completed"] == 8
    assert any("malformed" in note for note in summary["notes"])
    for p in summary["clients"][0:1]:
        assert p["queries"] >= 0


def test_the_available_nodes_are_rebuilt_when_one_drops_out_not_at_every_step(tmp_path, monkeypatch):
    """The loop scanned all K nodes at every step to list the available ones (3 ms a step at
    K = 10^5); it keeps the list until a node drops out, and a dropped node is never offered again."""
    offered = []
    select = GsWganServer.select_nodes

    def recording(self, available):
        chosen = select(self, available)
        offered.append((available, chosen))
        return chosen

    monkeypatch.setattr(GsWganServer, "select_nodes", recording)
    _, summary = run_inprocess(cfg_for(tmp_path, steps=12, num_clients=4), app=_corrupting(1, "nan"))
    assert summary["status"] == "completed" and summary["failed_clients"]
    lists = list({id(available): available for available, _ in offered}.values())
    assert len(lists) == 2 and len(lists[0]) == 4 and len(lists[1]) == 3  # one rebuild, for the one drop
    dropped = (set(lists[0]) - set(lists[1])).pop()
    after = [chosen for available, chosen in offered if available is lists[1]]
    assert after and all(dropped not in chosen for chosen in after)


def test_resume_of_a_missing_or_corrupt_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunDirectoryError, match="does not exist"):
        RunDirectory.open_existing(tmp_path / "nope")
    cfg = cfg_for(tmp_path)
    run = RunDirectory.create(cfg)
    with pytest.raises(RunDirectoryError, match="nothing to resume"):
        run.load_checkpoint()
    (run.path / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(RunDirectoryError, match="corrupt"):
        run.load_checkpoint()
    (run.path / "config.json").write_text("{")
    with pytest.raises(RunDirectoryError, match="corrupt"):
        RunDirectory.open_existing(run.path)


def test_lean_wire_sends_uint8_samples_and_float16_gradients(tmp_path):
    float32 = dict(wire_samples="float32", wire_dtype="float32", wire_compression="none")
    _, f32 = run_inprocess(cfg_for(tmp_path, "f32", steps=3, **float32))
    _, lean = run_inprocess(cfg_for(tmp_path, "lean", steps=3, wire_compression="none"))
    B, n = 8, 2
    up32, up16 = f32["comm"]["bytes_per_step"]["up"], lean["comm"]["bytes_per_step"]["up"]
    down32, down8 = f32["comm"]["bytes_per_step"]["down"], lean["comm"]["bytes_per_step"]["down"]
    assert up32 - up16 == pytest.approx(B * 784 * 2, abs=64)
    assert down32 - down8 == pytest.approx((n + 1) * B * 784 * 3, abs=64)
    assert lean["method"]["gswgan"]["wire_dtype"] == "float16"
    assert [c["epsilon"] for c in lean["clients"]] == [c["epsilon"] for c in f32["clients"]]
    assert (
        lean["epsilon_amplified"]["epsilon"] is None and "sampling-seed" in lean["epsilon_amplified"]["epsilon_reason"]
    )


def test_without_noise_the_generator_moves_toward_the_data(tmp_path):
    """Catches a wrong sign or scale anywhere between the client's gradient and G's update."""
    from common.data import load_client_partition
    from common.learning.models import build_generator, sample_latent

    cfg = cfg_for(
        tmp_path,
        steps=40,
        num_clients=1,
        noise_multiplier=0.0,
        clip=1000.0,
        lr_g=2e-3,
        lr_d=2e-3,
        ema_decay=0.0,
        synthetic_samples_per_writer=64,
    )
    run, summary = run_inprocess(cfg)
    written = json.loads((run.path / "summary.json").read_text())
    assert written["epsilon_max"] is None  # σ = 0: unbounded, written as null, never as a number
    torch.manual_seed(cfg.seed)
    g = build_generator("tiny")
    g.load_state_dict(torch.load(run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]["model"])
    z, y = sample_latent(256, 10, generator=torch.Generator().manual_seed(0)), torch.arange(256) % 10
    initial = build_generator("tiny")
    real_mean = load_client_partition(cfg, 0).images.mean().item()
    with torch.no_grad():
        before = abs(initial(z, y).mean().item() - real_mean)
        after = abs(g(z, y).mean().item() - real_mean)
    assert after < 0.5 * before


class RecordingTransport(InProcessTransport):
    """Remembers which client each generator step asked."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[int] = []

    def exchange(self, outgoing, **kwargs):
        self.asked += [o.node_id for o in outgoing if o.message_type == "train.gswgan"]
        return super().exchange(outgoing, **kwargs)


def test_two_runs_with_one_seed_sample_different_clients_unless_told_to_repeat(tmp_path):
    """The server's sampling is secret: config.json's seed does not predict who answered when. The
    testing flag repeats it, and then the amplified figure, which rests on it, is void."""
    asked = []
    for name in ("a", "b"):
        transport = RecordingTransport(client_app, 4)
        run_inprocess(cfg_for(tmp_path, name, num_clients=4, steps=8, sampling_seed=-1), transport=transport)
        asked.append(transport.asked)
    assert asked[0] != asked[1]
    repeated = []
    for name in ("c", "d"):
        transport = RecordingTransport(client_app, 4)
        _, summary = run_inprocess(cfg_for(tmp_path, name, num_clients=4, steps=8), transport=transport)
        repeated.append(transport.asked)
        amplified = summary["epsilon_amplified"]
        assert amplified["epsilon"] is None and "predictable" in amplified["epsilon_reason"]
        assert all(c["epsilon"] is not None for c in summary["clients"])  # the per-client figure stands
    assert repeated[0] == repeated[1]


def test_a_node_whose_policy_is_broken_stops_the_run_before_any_release(tmp_path):
    """The server asks for σ = 1.07 and no budget; node 1 pins σ ≥ 2 and node 2 ε ≤ 5 under a
    smaller δ: the run ends at the hello, naming each node and its reason."""
    cfg = cfg_for(tmp_path, client_epsilon_budget=20.0)
    transport = InProcessTransport(
        client_app,
        3,
        node_configs={1: {"privacy-min-noise-multiplier": 2.0}, 2: {"privacy-max-epsilon": 5.0, "privacy-delta": 1e-7}},
        node_state=tmp_path / "run" / "clients",
    )
    with pytest.raises(NodeRefused) as err:
        run_inprocess(cfg, transport=transport)
    text = str(err.value)
    assert "2 of 3 nodes refuse" in text  # each answer's own multiplier: σ/√B = 1.07/√8
    assert "(client 1): noise multiplier 0." in text  # (the reason is cut short in the message)
    assert "(client 2): epsilon budget 20 exceeds the node's maximum 5" in text and "delta 1e-05" in text
    assert not list((tmp_path / "run" / "clients").glob("client-*.pt"))  # nothing was released


def test_default_nodes_refuse_a_fixed_noise_seed_and_an_allowed_one_is_reported_not_private(tmp_path):
    cfg = cfg_for(tmp_path, noise_seed=3)
    with pytest.raises(NodeRefused, match="fixed noise seed"):
        run_inprocess(cfg, transport=InProcessTransport(client_app, 3))
    run, summary = run_inprocess(cfg_for(tmp_path, "allowed", noise_seed=3))
    privacy = json.loads((run.path / "privacy.json").read_text())
    assert privacy["statement"].startswith("NOT PRIVATE") and privacy["not_private"]
    queried = [c for c in privacy["clients"] if c["queries"]]
    assert queried and all(c["epsilon"] is None and "NOT PRIVATE" in c["epsilon_reason"] for c in queried)


def _late(node_offset: int, step: int):
    """The node answers (and charges its ledger) at ``step``, but the reply never reaches the server."""
    from flwr.app import Error, Message

    def app(message, context):
        reply = client_app(message, context)
        if (
            context.node_config["partition-id"] == node_offset
            and message.metadata.message_type == "train.gswgan"
            and int(message.content.config_records["scalars"]["step"]) >= step
        ):
            return Message(Error(code=0, reason="reply lost"), reply_to=message)
        return reply

    return app


def test_a_client_that_answered_after_failing_is_fully_reported(tmp_path):
    """privacy.json once missed a late answer: the server now charges a query when it is sent and
    asks failed nodes for their ledgers at the end; the larger record is reported."""
    from client.state import load_ledger

    cfg = cfg_for(tmp_path, steps=10)
    run, summary = run_inprocess(cfg, app=_late(1, 2))
    assert 1 in summary["failed_clients"]
    own = load_ledger(cfg, 1, run.state_dir, version=10**9)
    privacy = json.loads((run.path / "privacy.json").read_text())
    assert own.queries >= 1 and privacy["clients"][1]["queries"] == own.queries
    assert privacy["clients"][1]["epsilon"] == pytest.approx(own.epsilon(delta=cfg.delta))


def test_a_client_ledger_that_lost_releases_does_not_shrink_the_report(tmp_path):
    """Deleting a client's state file (which no message advises any more) leaves the server's record."""
    cfg = cfg_for(tmp_path, steps=6)
    run, first = run_inprocess(cfg)
    for path in (run.path / "clients").glob("client-*.pt"):
        path.unlink()
    _, resumed = run_inprocess(cfg.replace(steps=8), resume=True)
    before = {c["client_id"]: c["queries"] for c in first["clients"]}
    after = {c["client_id"]: c["queries"] for c in resumed["clients"]}
    assert sum(after.values()) == 8 and all(after[c] >= before[c] for c in before)


def test_live_epsilon_after_resume_includes_answers_after_the_last_checkpoint(tmp_path):
    """A run that died after its last checkpoint left answers in the clients' ledgers: the hello of
    the resumed run brings those ledgers, so live ε (metrics.jsonl) is right from the next step, not
    only in the final report."""
    from client import state as client_state
    from common.privacy import PrivacyEvent

    cfg = cfg_for(tmp_path, steps=3)
    run, _ = run_inprocess(cfg)
    client_state.clear_cache()
    state = client_state.load_state(cfg, 2, run.state_dir, version=10**9, critic_lr=cfg.lr_d)
    nm = cfg.noise_multiplier / 8**0.5
    for _ in range(6):  # answered after the checkpoint, then the server crashed
        state.ledger.record(PrivacyEvent(noise_multiplier=nm))
        state.version += 1
    client_state.save_state(state, run.state_dir)
    client_state.clear_cache()
    run_inprocess(cfg.replace(steps=4), resume=True)
    line = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()][-1]
    assert line["step"] == 4
    assert line["privacy/epsilon_max"] >= state.ledger.epsilon(delta=cfg.delta) * (1 - 1e-9)


def test_the_accountant_option_chooses_the_headline(tmp_path):
    """--accountant prv makes PRV the headline everywhere; where PRV has no bound (sampling without
    replacement) the figure is RDP and says so."""
    from server.summary import format_summary_table

    _, summary = run_inprocess(cfg_for(tmp_path, accountant="prv", noise_multiplier=3.0, sampling_seed=-1))
    queried = [c for c in summary["clients"] if c["queries"]]
    assert queried and all(c["epsilon"] == c["epsilon_prv"] < c["epsilon_rdp"] for c in queried)
    assert summary["accountant"] == "prv" and summary["epsilon_max"] == max(c["epsilon"] for c in queried)
    assert "RDP shown" in summary["epsilon_amplified"]["epsilon_reason"]
    assert "PRV)" in format_summary_table(summary) and "PRV accountant" in summary["privacy_statement"]


def test_every_private_folder_says_so_itself(tmp_path):
    """Issue 23, item 18: a node's state directory (its raw partition, D_k, ledger) was marked only
    in privacy.json. Each node marks its own (``state-dir`` from its node config, as on a real node
    or a compose volume) at the hello, and the run marks its clients/ folder."""
    from common.io.private_paths import MARKER

    cfg = cfg_for(tmp_path, steps=2)
    disks = {i: tmp_path / f"node-{i}" for i in range(cfg.num_clients)}
    transport = InProcessTransport(
        client_app, 3, node_config=ALLOW_NONPRIVATE, node_configs={i: {"state-dir": str(d)} for i, d in disks.items()}
    )
    run, summary = run_inprocess(cfg, transport=transport)
    assert sum(c["queries"] for c in summary["clients"]) == 2
    for folder in [run.path / "clients", *disks.values()]:
        assert "PRIVATE: never publish" in (folder / MARKER).read_text(), folder
    assert list(tmp_path.glob("node-*/client-*.pt"))  # the state went to the nodes' own disks
    do_not_publish = json.loads((run.path / "privacy.json").read_text())["do_not_publish"]
    assert all(p in do_not_publish for p in ("clients/", "deploy/nodes/", "deploy/keys/", "deploy/certs/", MARKER))
