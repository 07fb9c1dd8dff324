"""The ClientApp: one handler per message type, for every method. Routing by type.

``query.hello`` (sent to every node when a run starts or resumes) carries the run's configuration,
which the node keeps in ``context.state`` so that the per-step messages stay small; it answers with
the node's client id and its ledger. ``query.ledger`` returns the client's own ledger (what it has
spent); ``query.accuracy`` is the debugging task's selection release; ``query.dataplane`` starts
the node's data-plane worker; ``query.secagg_*`` are the rounds of a secure sum (``secure_sum.py``).
Every method's own messages (``train.<method>``) go to one generic handler, ``handle_step``: it
decodes the request, checks the node's policy, answers a refusal the one way every node refuses
(``common/methods/protocol.py``'s ``refusal``), and otherwise hands the request to the method
(``Method.answer``), which charges the node's ledger before the reply leaves.

The server is not trusted with the node's privacy: the node checks the run's configuration against
its own policy (``client/node.py``) at the hello and again before every release, and refuses,
saying why, what the policy does not allow.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from common.device import resolve_device
from common.io.private_paths import CLIENT_STATE, mark_private
from common.messages import (
    ACCURACY,
    DATAPLANE,
    HELLO,
    LEDGER,
    AccuracyQuery,
    AccuracyReply,
    DataplaneReply,
    DataplaneStart,
    Hello,
    HelloReply,
    LedgerQuery,
    LedgerReply,
)
from common.methods import METHODS, ExperimentConfig, method_of_message
from common.methods.base import or_error
from common.methods.protocol import refusal
from protos import wire

from .node import (
    STATE_KEY,
    Node,
    client_id_of,
    node_root,
    own_ledger,
    policy_refusal,
    run_config,
    shared_text,
    use_client_threads,
)
from .quiet import quiet_known_notices
from .secure_sum import HANDLERS as SECURE_SUM_HANDLERS

quiet_known_notices()  # this process may be a Ray actor: it prints Flower's shutdown notice

Handler = Callable[[Message, Context], Message]
BatchHandler = Callable[[list[Message], list[Context]], list]


def handle_hello(message: Message, context: Context) -> Message:
    """Check the run against this node's policy; keep its configuration; answer with this node's
    client id and, when it holds releases, its ledger.

    Where the node keeps its private state and its own privacy ledger is the node's (node config
    ``state-dir``, ``node_root``), and so is where its data lives (``data-dir``): a node without a
    place of its own, or a hello that tries to name one, is refused.
    """
    hello = wire.decode(Hello, message.content)
    config = json.loads(hello.config)
    if "data-dir" in context.node_config:
        config["data_dir"] = str(context.node_config["data-dir"])
    cid = client_id_of(context)
    text = shared_text(json.dumps(config))
    cfg = run_config(text)
    state_dir = node_root(context)
    refusal = _place_problem(hello, state_dir) or policy_refusal(context, cfg) or _device_problem(cfg)
    if refusal:
        if STATE_KEY in context.state:
            del context.state[STATE_KEY]  # no query of this run will be answered
        return wire.reply(HelloReply(client_id=cid, refused=True, reason=refusal), message)
    with contextlib.suppress(OSError):  # a folder that cannot take the marker fails at the first save, clearly
        mark_private(state_dir, CLIENT_STATE)
    version = int(context.state[STATE_KEY]["version"]) if STATE_KEY in context.state else 0
    context.state[STATE_KEY] = ConfigRecord({"config": text, "state_dir": state_dir, "version": version})
    return wire.reply(_ledger_summary(cfg, cid, state_dir, version), message)


def _place_problem(hello: Hello, state_dir: str) -> str:
    """Why the node cannot take part given where its state would live ("")."""
    if hello.state_dir:
        return (
            f"the server's hello names a state directory ({hello.state_dir[:200]!r}): where a node keeps its state "
            "and its privacy ledger is the node's own choice (state-dir in its node config), never the server's"
        )
    if not state_dir:
        return (
            "this node has no state directory of its own: set state-dir in its node config (it holds the node's "
            "private state and the ledger of everything its data released, across runs)"
        )
    return ""


def _device_problem(cfg: ExperimentConfig) -> str:
    """Why this node cannot train on the run's ``device`` (""): said at the hello, before any release."""
    try:
        resolve_device(cfg.device)
    except ValueError as err:
        return f"this node cannot run on the requested device: {err}"
    return ""


def _ledger_summary(cfg: ExperimentConfig, cid: int, state_dir: str, version: int) -> HelloReply:
    """What this client's ledger already holds: the server reports it from the start (a resumed
    run's live ε) and skips the end-of-run ledger fetch only for clients it never queried AND that
    say 0 here (cheap: one stat when there is no file)."""
    try:
        ledger = own_ledger(cfg, cid, state_dir, version)
    except Exception:  # noqa: BLE001 - unreadable state: say "may hold releases"; the first query reports it
        return HelloReply(client_id=cid, ledger_queries=1)
    text = json.dumps(ledger.state_dict()) if ledger.queries else None
    return HelloReply(client_id=cid, ledger_queries=ledger.queries, ledger=text)


def handle_ledger(message: Message, context: Context) -> Message:
    """Return this client's ledger (JSON) so the server can write privacy.json from it."""
    wire.decode(LedgerQuery, message.content)
    node = Node(context)
    shares = node.share_ledger()
    own = json.dumps(shares.state_dict()) if shares.queries else None
    return wire.reply(LedgerReply(ledger=json.dumps(node.ledger().state_dict()), own_ledger=own), message)


def handle_accuracy(message: Message, context: Context) -> Message:
    """Debugging task: the shipped classifier's accuracy on local data, released with noise."""
    from common.data import num_classes_for
    from common.evaluation.selection import noisy_accuracy

    query = wire.decode(AccuracyQuery, message.content)
    node = Node(context)
    state = node.load_state()
    problem, before = node.refusal(), state.ledger.copy()
    if problem:
        value, reason = None, f"client {state.client_id} refuses: {problem}"
    else:
        value, reason = noisy_accuracy(
            state,
            node.cfg,
            query.classifier,
            num_classes=num_classes_for(node.cfg),
            noise_multiplier=query.noise_multiplier,
            policy=node.policy,
        )
    if value is not None:
        node.record_release(state, before)
    reply = AccuracyReply(accuracy=-1.0 if value is None else value, refused=value is None, reason=reason)
    return wire.reply(reply, message)


def handle_dataplane(message: Message, context: Context) -> Message:
    """Start this node's persistent data-plane worker for the run (once: a lock file says whether
    one is running). The token goes to the worker on stdin; only ``started`` comes back."""
    import subprocess
    import sys

    from .worker_files import is_running, log_path

    start = wire.decode(DataplaneStart, message.content)
    run_id, node_id = start.run_id, context.node_id
    if is_running(run_id, node_id):
        return wire.reply(DataplaneReply(status="already running"), message)
    address = str(context.node_config.get("dataplane-address") or start.address)
    spec = {
        "address": address,
        "token": start.token,
        "run_id": run_id,
        "node_id": node_id,
        "ca": start.ca,
        "idle_s": start.idle_s,
        "node_config": dict(context.node_config),
    }
    with open(log_path(run_id, node_id), "ab") as log:  # is_running made the folder
        worker = subprocess.Popen(
            [sys.executable, "-m", "client.worker"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker.stdin.write(json.dumps(spec).encode())
    worker.stdin.close()
    return wire.reply(DataplaneReply(status="started", pid=worker.pid), message)


def handle_step(message: Message, context: Context) -> Message:
    """Every method's step message: the request decoded, the node's policy checked (a refusal
    answered the one way), then the method's answer on this node."""
    message_type = message.metadata.message_type
    run_method = method_of_message(message_type)
    request_cls, reply_cls = run_method.messages[message_type]
    request = wire.decode(request_cls, message.content)
    node = Node(context)
    use_client_threads()
    why = node.refusal()
    reply = refusal(reply_cls, request.step, node.client_id, why) if why else run_method.answer(node, request)
    return wire.reply(reply, message)


def handle_steps(messages: list[Message], contexts: list[Context]) -> list[Message | Exception]:
    """One step's messages of one type to several nodes of this process (the in-process transport):
    each node's reply, or the error that made it fail (that node alone, as ``handle_step`` raising
    would). Refusing nodes answer as in ``handle_step``; the others are answered together by the
    method (``Method.answer_many``: GS-WGAN stacks their critic phases)."""
    message_type = messages[0].metadata.message_type
    run_method = method_of_message(message_type)
    request_cls, reply_cls = run_method.messages[message_type]
    use_client_threads()
    results: list[Message | Exception | None] = [None] * len(messages)
    work: list[tuple[int, Node, object]] = []
    for i, (message, context) in enumerate(zip(messages, contexts, strict=True)):
        try:
            request, node = wire.decode(request_cls, message.content), Node(context)
            why = node.refusal()
        except Exception as err:  # noqa: BLE001 - this node fails, the others go on
            results[i] = err
            continue
        if why:
            results[i] = wire.reply(refusal(reply_cls, request.step, node.client_id, why), message)
        else:
            work.append((i, node, request))
    answers = run_method.answer_many([node for _, node, _ in work], [request for _, _, request in work])
    for (i, _, _), answer in zip(work, answers, strict=True):
        results[i] = answer if isinstance(answer, Exception) else or_error(wire.reply, answer, messages[i])
    return results


SHARED_HANDLERS: dict[str, Handler] = {
    HELLO: handle_hello,
    LEDGER: handle_ledger,
    ACCURACY: handle_accuracy,
    DATAPLANE: handle_dataplane,
    **SECURE_SUM_HANDLERS,  # query.secagg_*: the four rounds of a secure sum (client/secure_sum.py)
}


def make_client_app() -> ClientApp:
    """A ClientApp routing the shared messages to their handlers and every registered method's to
    ``handle_step`` (Flower routes ``train.gswgan`` to what ``app.train("gswgan")`` registered)."""
    client_app = ClientApp()
    routes = {**SHARED_HANDLERS, **{t: handle_step for m in METHODS.values() for t in m.messages}}
    for message_type, handler in routes.items():
        category, _, action = message_type.partition(".")
        getattr(client_app, category)(action)(handler)
    return client_app


def batch_handlers() -> dict[str, BatchHandler]:
    """Message type -> a handler of several nodes' messages at once, for the in-process transport,
    where every node shares this process (``server.transport.InProcessTransport``)."""
    return {t: handle_steps for m in METHODS.values() for t in m.messages}


app = make_client_app()
BATCH_HANDLERS = batch_handlers()
