"""DP-MERF's client handler: a request in, the client's one noisy summary (or a refusal) out."""

from __future__ import annotations

from flwr.app import Context, Message

from common.methods.dp_merf import MSG_EMBED, MerfRelease, MerfRequest, release
from protos import wire

from ..node import Node, use_client_threads

ACTION = MSG_EMBED


def handle(message: Message, context: Context) -> Message:
    """Release this node's summary once, unless its policy refuses the run or its budget a release."""
    request = wire.decode(MerfRequest, message.content)
    node = Node(context)
    use_client_threads()
    state = node.load_state()
    refusal, before = node.refusal() or _released_before(node), state.ledger.copy()
    if refusal:
        reply = MerfRelease(step=request.step, refused=True, reason=f"client {state.client_id} refuses: {refusal}")
    else:
        reply = release(state, node.cfg, request, node.policy)
    if not reply.refused:
        node.record_release(state, before)
    return wire.reply(reply, message)


def _released_before(node: Node) -> str:
    """DP-MERF is one release per client: a node that made one (in any run) makes another only when
    its own policy sets a budget (max-epsilon), which then decides. Without one, a server could ask
    again in every run and the releases would compose without bound."""
    made = node.book.by_method.get(node.cfg.strategy, 0)
    if made and not node.policy.max_epsilon:
        return (
            f"this node already released its DP-MERF summary ({made} release(s) in its ledger); another needs a "
            "budget in its own policy (max-epsilon)"
        )
    return ""
