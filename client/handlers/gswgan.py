"""GS-WGAN's client handler: a query in, the sanitized answer (or a refusal) out."""

from __future__ import annotations

from flwr.app import Context, Message

from common.codec import GsAnswer, GsQuery
from common.methods.gswgan import MSG_QUERY, answer_query
from protos import wire

from ..node import Node, use_client_threads

ACTION = MSG_QUERY


def handle(message: Message, context: Context) -> Message:
    """Answer one query on this node's client state, unless the node's policy refuses the run."""
    query = wire.decode(GsQuery, message.content)  # the client's configuration decodes it (answer_query)
    node = Node(context)
    use_client_threads()
    state = node.load_state()
    refusal = node.refusal()
    if refusal:
        answer = GsAnswer(step=query.step, refused=True, reason=f"client {state.client_id} refuses: {refusal}")
    else:
        answer = answer_query(state, node.cfg, query, node.policy)
    if not answer.refused:
        node.persist(state)
    return wire.reply(answer, message)
