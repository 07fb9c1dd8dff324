"""The ClientApp: thin handlers that decode, call a pure function, encode. Routing by message type.

``train.gswgan`` answers one GS-WGAN query; ``query.ledger`` returns the client's own privacy
ledger (the authority on what it has spent); ``query.hello`` (sent to every node when a run starts
or resumes) carries the run's configuration and the directory for the node's state, which the node
keeps in ``context.state`` so that the per-step messages stay small, and returns the node's client id.
"""

from __future__ import annotations

import functools
import json
import os

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from common.config import ExperimentConfig
from common.data import ClientData, load_client_partition

from .discriminator import answer_query
from .flower_wire import decode_query, decode_records, encode_answer, encode_records
from .state import CACHE_SIZE, ClientState, load_ledger, load_state, save_state

STATE_KEY = "fedgan"
app = ClientApp()


def client_id_of(context: Context) -> int:
    """The partition this node holds (``partition-id`` in the node config, as Flower sets it)."""
    return int(context.node_config.get("partition-id", context.node_id))


def _run_record(context: Context) -> ConfigRecord:
    if STATE_KEY not in context.state:
        raise RuntimeError("this node received a query before the run's hello message; the server "
                           "sends the run configuration in a query.hello to every node first")
    return context.state.config_records[STATE_KEY]


def _config(record: ConfigRecord) -> ExperimentConfig:
    return ExperimentConfig.from_mapping(json.loads(str(record["config"])))


def _use_client_threads() -> None:
    torch.set_num_threads(max(1, int(os.environ.get("FEDGAN_CLIENT_THREADS", os.cpu_count() or 1))))


def _load(record: ConfigRecord, cfg: ExperimentConfig, context: Context) -> ClientState:
    """This node's client state at the version ``context.state`` says it is at."""
    return load_state(cfg, client_id_of(context), str(record["state_dir"]), int(record["version"]))


def _persist(record: ConfigRecord, state: ClientState) -> None:
    """Write the state to the node's disk and remember its version in ``context.state``."""
    save_state(state, str(record["state_dir"]))
    record["version"] = state.version


@functools.lru_cache(maxsize=CACHE_SIZE)
def _partition(cfg: ExperimentConfig, client_id: int) -> ClientData:
    """Stateless strategies (fedavg-gan) need the data every round: read or render it once."""
    return load_client_partition(cfg, client_id)


@app.query("hello")
def handle_hello(message: Message, context: Context) -> Message:
    """Keep the run's configuration and state directory; answer with this node's client id.

    A SuperNode may override where its private state and its data live (node config ``state-dir``,
    ``data-dir``): in a real deployment the node's disk is not the server's.
    """
    _, setup = decode_records(message.content)
    config = json.loads(str(setup["config"]))
    if "data-dir" in context.node_config:
        config["data_dir"] = str(context.node_config["data-dir"])
    state_dir = str(context.node_config.get("state-dir") or setup["state_dir"])
    version = int(context.state[STATE_KEY]["version"]) if STATE_KEY in context.state else 0
    context.state[STATE_KEY] = ConfigRecord({"config": json.dumps(config), "state_dir": state_dir,
                                             "version": version})
    cid = client_id_of(context)
    # How many releases this client's ledger already holds: the server skips the end-of-run ledger
    # fetch only for clients it never queried AND that say 0 here (cheap: one stat when no file).
    try:
        queries = load_ledger(ExperimentConfig.from_mapping(config), cid, state_dir, version).queries
    except Exception:  # noqa: BLE001 - unreadable state: say "may hold releases"; the first query reports it
        queries = 1
    return Message(encode_records({}, {"client_id": cid, "ledger_queries": queries}), reply_to=message)


@app.train("gswgan")
def handle_gswgan(message: Message, context: Context) -> Message:
    query, _ = decode_query(message.content)
    record = _run_record(context)
    cfg = _config(record)
    _use_client_threads()
    state = _load(record, cfg, context)
    answer = answer_query(state, cfg, query)
    if not answer.refused:
        _persist(record, state)
    return Message(encode_answer(answer), reply_to=message)


@app.query("ledger")
def handle_ledger(message: Message, context: Context) -> Message:
    """Return this client's ledger (JSON) so the server can write privacy.json from the authority."""
    record = _run_record(context)
    cid = client_id_of(context)
    ledger = load_ledger(_config(record), cid, str(record["state_dir"]), int(record["version"]))
    content = encode_records({}, {"client_id": cid, "ledger": json.dumps(ledger.state_dict())})
    return Message(content, reply_to=message)


@app.query("accuracy")
def handle_accuracy(message: Message, context: Context) -> Message:
    """Debugging task: the shipped classifier's accuracy on local data, released with noise."""
    from common.data import num_classes_for

    from .selection import noisy_accuracy

    record = _run_record(context)
    cfg = _config(record)
    _, scalars = decode_records(message.content)
    weights = message.content.array_records["classifier"].to_torch_state_dict()
    state = _load(record, cfg, context)
    value, reason = noisy_accuracy(state, cfg, weights, num_classes=num_classes_for(cfg),
                                   noise_multiplier=float(scalars["noise_multiplier"]))
    if value is not None:
        _persist(record, state)
    content = encode_records({}, {"client_id": state.client_id, "accuracy": -1.0 if value is None else value,
                                  "refused": value is None, "reason": reason})
    return Message(content, reply_to=message)


@app.train("fedavg")
def handle_fedavg(message: Message, context: Context) -> Message:
    """Fed-Avg GAN: a few local WGAN-GP steps on the received D; reply with the raw D delta."""
    from flwr.app import ArrayRecord

    from common.data import num_classes_for
    from common.fedavg_gan import client_update

    record = _run_record(context)
    cfg = _config(record)
    _, scalars = decode_records(message.content)
    cid = client_id_of(context)
    data = _partition(cfg, cid)
    delta = client_update(
        message.content.array_records["generator"].to_torch_state_dict(),
        message.content.array_records["discriminator"].to_torch_state_dict(),
        preset=cfg.model, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim,
        real_images=data.images, real_labels=data.labels, local_steps=cfg.local_steps, lr=cfg.fedavg_lr_d,
        batch_size=cfg.batch_size, gp_weight=cfg.gp_weight, drift=cfg.drift,
        generator=torch.Generator().manual_seed(int(scalars["seed"])))
    content = encode_records({}, {"client_id": cid, "step": int(scalars["step"])})
    content["delta"] = ArrayRecord({k: v.contiguous() for k, v in delta.items()})
    return Message(content, reply_to=message)


@app.train("dpgan")
def handle_dpgan(message: Message, context: Context) -> Message:
    """Centralized DPGAN round on the curator node; replies with G's weights and its ledger."""
    from flwr.app import ArrayRecord

    from common.privacy import PrivacyEvent

    from .dpgan_node import load_node, run_round, save_node

    record = _run_record(context)
    cfg = _config(record)
    step = int(decode_records(message.content)[1]["step"])
    _use_client_threads()
    node = load_node(cfg, str(record["state_dir"]), rounds=step)
    planned = PrivacyEvent(noise_multiplier=node.trainer.noise_multiplier, sample_rate=node.sample_rate,
                           count=node.n_d)
    scalars = {"client_id": client_id_of(context), "step": step, "refused": False, "reason": "",
               "noise_multiplier": node.trainer.noise_multiplier, "sample_rate": node.sample_rate}
    if node.ledger.would_exceed(budget=cfg.client_epsilon_budget, delta=cfg.delta, next_event=planned):
        scalars.update(refused=True, reason=f"the DPGAN node refuses: {node.n_d} more discriminator steps "
                       f"would exceed its epsilon budget {cfg.client_epsilon_budget}")
        return Message(encode_records({}, scalars), reply_to=message)
    stats = run_round(node, cfg)
    save_node(node, str(record["state_dir"]))
    scalars.update(new_steps=stats.pop("new_steps"), n_d=node.n_d, discriminator_steps=node.trainer.steps_taken,
                   ledger=json.dumps(node.ledger.state_dict()))
    content = encode_records({}, scalars)
    content["stats"] = ConfigRecord({k: float(v) for k, v in stats.items()})
    content["generator"] = ArrayRecord(node.generator.state_dict())
    return Message(content, reply_to=message)


@app.query("dataplane")
def handle_dataplane(message: Message, context: Context) -> Message:
    """Start this node's persistent data-plane worker for the run (once: a lock file says whether
    one is running). The token goes to the worker on stdin; only ``started`` comes back."""
    import subprocess
    import sys

    from .worker import is_running, log_path

    _, setup = decode_records(message.content)
    run_id, node_id = int(setup["run_id"]), context.node_id
    if is_running(run_id, node_id):
        return Message(encode_records({}, {"status": "already running"}), reply_to=message)
    address = str(context.node_config.get("dataplane-address") or setup["address"])
    spec = {"address": address, "token": str(setup["token"]), "run_id": run_id, "node_id": node_id,
            "ca": str(setup["ca"]), "idle_s": float(setup["idle_s"]), "node_config": dict(context.node_config)}
    with open(log_path(run_id, node_id), "ab") as log:  # is_running made the folder
        worker = subprocess.Popen([sys.executable, "-m", "client.worker"], stdin=subprocess.PIPE, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    worker.stdin.write(json.dumps(spec).encode())
    worker.stdin.close()
    return Message(encode_records({}, {"status": "started", "pid": worker.pid}), reply_to=message)
