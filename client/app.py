"""The ClientApp: thin handlers that decode, call a pure function, encode. Routing by message type.

``train.gswgan`` answers one GS-WGAN query; ``query.ledger`` returns the client's own privacy
ledger (the authority on what it has spent); ``query.hello`` (sent to every node when a run starts
or resumes) carries the run's configuration and the directory for the node's state, which the node
keeps in ``context.state`` so that the per-step messages stay small, and returns the node's client id.

The server is not trusted with the node's privacy: the node checks the run's configuration against
its own policy (``common/privacy/policy.py``: node config, a policy file, or defaults) at the hello
and again before every release, and refuses, saying why, what the policy does not allow.
"""

from __future__ import annotations

import functools
import json
import os

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from common.codec import GsAnswer
from common.config import ExperimentConfig
from common.privacy import NodePolicy, PolicyError, PrivacyEvent, PrivacyLedger, load_policy

from .discriminator import answer_query
from .flower_wire import decode_query, decode_records, encode_answer, encode_records
from .state import ClientState, load_ledger, load_state, save_state

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


def node_policy(context: Context) -> tuple[NodePolicy, str]:
    """(this node's privacy policy, "") or (the defaults, why the policy could not be used): a
    node whose policy is broken refuses everything rather than fall back to looser defaults."""
    key = tuple(sorted(context.node_config.items()))  # scalars: hashable, types kept
    env = os.environ.get("FEDGAN_NODE_POLICY", "")
    return _cached_policy(key, env, _mtime(env), _mtime(str(context.node_config.get("privacy-policy", ""))))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime if path else 0.0
    except OSError:
        return -1.0


@functools.lru_cache(maxsize=64)
def _cached_policy(node_config: tuple, env: str, _env_mtime: float, _file_mtime: float) -> tuple[NodePolicy, str]:
    try:
        return load_policy(dict(node_config), {"FEDGAN_NODE_POLICY": env} if env else {}), ""
    except PolicyError as err:
        return NodePolicy(), str(err)


def policy_refusal(context: Context, cfg: ExperimentConfig) -> str:
    """Why this node refuses the run (""), per its own policy."""
    policy, problem = node_policy(context)
    reasons = [problem] if problem else policy.violations(cfg)
    return "; ".join(reasons) + f" [{policy.source}]" if reasons else ""


def own_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str, version: int) -> PrivacyLedger:
    """The ledger of everything this node released in ``state_dir``: the DPGAN curator's steps, or
    the client's answers (GS-WGAN, the selection query, Fed-Avg's raw deltas)."""
    if cfg.strategy == "dpgan":
        from .dpgan_node import load_ledger as dpgan_ledger

        return dpgan_ledger(state_dir)
    return load_ledger(cfg, client_id, state_dir, version)


@app.query("hello")
def handle_hello(message: Message, context: Context) -> Message:
    """Check the run against this node's policy; keep its configuration and state directory;
    answer with this node's client id and, when it holds releases, its ledger.

    A SuperNode may override where its private state and its data live (node config ``state-dir``,
    ``data-dir``): in a real deployment the node's disk is not the server's.
    """
    _, setup = decode_records(message.content)
    config = json.loads(str(setup["config"]))
    if "data-dir" in context.node_config:
        config["data_dir"] = str(context.node_config["data-dir"])
    cid = client_id_of(context)
    cfg = ExperimentConfig.from_mapping(config)
    refusal = policy_refusal(context, cfg)
    if refusal:
        if STATE_KEY in context.state:
            del context.state[STATE_KEY]  # no query of this run will be answered
        return Message(encode_records({}, {"client_id": cid, "refused": True, "reason": refusal}), reply_to=message)
    state_dir = str(context.node_config.get("state-dir") or setup["state_dir"])
    version = int(context.state[STATE_KEY]["version"]) if STATE_KEY in context.state else 0
    context.state[STATE_KEY] = ConfigRecord({"config": json.dumps(config), "state_dir": state_dir,
                                             "version": version})
    # What this client's ledger already holds: the server reports it from the start (a resumed
    # run's live ε) and skips the end-of-run ledger fetch only for clients it never queried AND
    # that say 0 here (cheap: one stat when there is no file).
    reply: dict = {"client_id": cid}
    try:
        ledger = own_ledger(cfg, cid, state_dir, version)
        reply["ledger_queries"] = ledger.queries
        if ledger.queries:
            reply["ledger"] = json.dumps(ledger.state_dict())
    except Exception:  # noqa: BLE001 - unreadable state: say "may hold releases"; the first query reports it
        reply["ledger_queries"] = 1
    return Message(encode_records({}, reply), reply_to=message)


@app.train("gswgan")
def handle_gswgan(message: Message, context: Context) -> Message:
    query, _ = decode_query(message.content)
    record = _run_record(context)
    cfg = _config(record)
    _use_client_threads()
    state = _load(record, cfg, context)
    refusal = policy_refusal(context, cfg)
    if refusal:
        answer = GsAnswer(step=query.step, client_id=state.client_id, refused=True,
                          reason=f"client {state.client_id} refuses: {refusal}", queries=state.ledger.queries)
    else:
        answer = answer_query(state, cfg, query, node_policy(context)[0])
    if not answer.refused:
        _persist(record, state)
    return Message(encode_answer(answer), reply_to=message)


@app.query("ledger")
def handle_ledger(message: Message, context: Context) -> Message:
    """Return this client's ledger (JSON) so the server can write privacy.json from the authority."""
    record = _run_record(context)
    cid = client_id_of(context)
    ledger = own_ledger(_config(record), cid, str(record["state_dir"]), int(record["version"]))
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
    policy, problem = node_policy(context)
    if problem:
        value, reason = None, f"client {state.client_id} refuses: {problem}"
    else:
        value, reason = noisy_accuracy(state, cfg, weights, num_classes=num_classes_for(cfg),
                                       noise_multiplier=float(scalars["noise_multiplier"]), policy=policy)
    if value is not None:
        _persist(record, state)
    content = encode_records({}, {"client_id": state.client_id, "accuracy": -1.0 if value is None else value,
                                  "refused": value is None, "reason": reason})
    return Message(content, reply_to=message)


@app.train("fedavg")
def handle_fedavg(message: Message, context: Context) -> Message:
    """Fed-Avg GAN: a few local WGAN-GP steps on the received D; reply with the raw D delta, which
    the client's own ledger records as a release without noise (the server sees it as it is)."""
    from flwr.app import ArrayRecord

    from common.data import num_classes_for
    from common.fedavg_gan import client_update
    from common.privacy.events import VOID_RAW_DELTA

    record = _run_record(context)
    cfg = _config(record)
    refusal = policy_refusal(context, cfg)
    if refusal:
        raise RuntimeError(f"this node refuses Fed-Avg GAN rounds: {refusal}")
    _, scalars = decode_records(message.content)
    cid = client_id_of(context)
    state = _load(record, cfg, context)
    data = state.data
    delta = client_update(
        message.content.array_records["generator"].to_torch_state_dict(),
        message.content.array_records["discriminator"].to_torch_state_dict(),
        preset=cfg.model, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim,
        real_images=data.images, real_labels=data.labels, local_steps=cfg.local_steps, lr=cfg.fedavg_lr_d,
        batch_size=cfg.batch_size, gp_weight=cfg.gp_weight, drift=cfg.drift,
        generator=torch.Generator().manual_seed(int(scalars["seed"])))
    state.ledger.record(PrivacyEvent(noise_multiplier=0.0, void=VOID_RAW_DELTA))
    state.version += 1
    _persist(record, state)
    content = encode_records({}, {"client_id": cid, "step": int(scalars["step"])})
    content["delta"] = ArrayRecord({k: v.contiguous() for k, v in delta.items()})
    return Message(content, reply_to=message)


@app.train("dpgan")
def handle_dpgan(message: Message, context: Context) -> Message:
    """Centralized DPGAN round on the curator node; replies with G's weights and its ledger."""
    from flwr.app import ArrayRecord

    from .dpgan_node import load_node, run_round, save_node

    record = _run_record(context)
    cfg = _config(record)
    step = int(decode_records(message.content)[1]["step"])
    _use_client_threads()
    node = load_node(cfg, str(record["state_dir"]), rounds=step)
    scalars = {"client_id": client_id_of(context), "step": step, "refused": False, "reason": "",
               "noise_multiplier": node.trainer.noise_multiplier, "sample_rate": node.sample_rate}
    refusal = policy_refusal(context, cfg)
    over = "" if refusal else node_policy(context)[0].over_budget(node.ledger, node.step_event(node.n_d), cfg)
    if over:
        refusal = f"{node.n_d} more discriminator steps {over}"
    if refusal:
        scalars.update(refused=True, reason=f"the DPGAN node refuses: {refusal}")
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
