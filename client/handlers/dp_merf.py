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
    refusal = node.refusal()
    if refusal:
        reply = MerfRelease(step=request.step, refused=True, reason=f"client {state.client_id} refuses: {refusal}")
    else:
        reply = release(state, node.cfg, request, node.policy)
    if not reply.refused:
        node.persist(state)
    return wire.reply(reply, message)
