"""GS-WGAN's client handler: a query in, the sanitized answer (or a refusal) out.

``handle_many`` serves one step's queries to several nodes that share this process (the in-process
simulation): their critic phases run as one stacked network (``common/critic_stack.py``) when the
run's ``stack_clients`` allows it. Each node still decodes its own query, checks its own policy and
budget, sanitizes with its own noise, charges its own ledger and persists its own state.
"""

from __future__ import annotations

from flwr.app import Context, Message

from common.client_state import ClientState
from common.codec import GsAnswer, GsQuery
from common.methods.gswgan import MSG_QUERY, answer_queries, answer_query
from protos import wire

from ..node import Node, use_client_threads

ACTION = MSG_QUERY


def handle(message: Message, context: Context) -> Message:
    """Answer one query on this node's client state, unless the node's policy refuses the run."""
    query = wire.decode(GsQuery, message.content)  # the client's configuration decodes it (answer_query)
    node = Node(context)
    use_client_threads()
    state = node.load_state()
    refusal, before = node.refusal(), state.ledger.copy()
    answer = _refused(query, state, refusal) if refusal else answer_query(state, node.cfg, query, node.policy)
    if not answer.refused:
        node.record_release(state, before)
    return wire.reply(answer, message)


def handle_many(messages: list[Message], contexts: list[Context]) -> list[Message | Exception]:
    """Each message's reply, or the error that made its node fail (that node alone, as ``handle``
    raising would). Nodes whose policy refuses the run answer with the refusal; the others are
    answered together by ``answer_queries`` when they run one configuration, else one by one."""
    use_client_threads()
    results: list[Message | Exception | None] = [None] * len(messages)
    work: list[tuple[int, Node, ClientState, GsQuery]] = []
    for i, (message, context) in enumerate(zip(messages, contexts, strict=True)):
        try:
            query = wire.decode(GsQuery, message.content)
            node = Node(context)
            state = node.load_state()
            refusal = node.refusal()
        except Exception as err:  # noqa: BLE001 - this node fails, the others go on
            results[i] = err
            continue
        if refusal:
            results[i] = wire.reply(_refused(query, state, refusal), message)
        else:
            work.append((i, node, state, query))
    for i, reply in _answer(work, messages):
        results[i] = reply
    return results


def _answer(
    work: list[tuple[int, Node, ClientState, GsQuery]], messages: list[Message]
) -> list[tuple[int, Message | Exception]]:
    """(index, reply or error) of the nodes that answer: stacked when their configurations agree
    and allow it, else one by one; then each node persists its own state. A node whose own state or
    data breaks its answer fails alone (``answer_queries`` answers the others one by one then); only
    an error outside any one client fails every node of the stacked phase, with its cause."""
    cfgs = [node.cfg for _, node, _, _ in work]
    before = [state.ledger.copy() for _, _, state, _ in work]  # what each has released, before this step
    answers: list[GsAnswer | Exception]
    if len(work) >= 2 and cfgs[0].stack_clients and all(c == cfgs[0] for c in cfgs):
        try:
            answers = answer_queries([w[2] for w in work], cfgs[0], [w[3] for w in work], [w[1].policy for w in work])
        except Exception as err:  # noqa: BLE001 - every node of the stacked phase fails with its cause
            answers = [err] * len(work)
    else:
        answers = [_one(node, state, query) for _, node, state, query in work]
    out: list[tuple[int, Message | Exception]] = []
    for (i, node, state, _), answer, earlier in zip(work, answers, before, strict=True):
        try:
            if isinstance(answer, Exception):
                raise answer
            if not answer.refused:
                node.record_release(state, earlier)
            out.append((i, wire.reply(answer, messages[i])))
        except Exception as err:  # noqa: BLE001 - this node fails, the others go on
            out.append((i, err))
    return out


def _one(node: Node, state: ClientState, query: GsQuery) -> GsAnswer | Exception:
    try:
        return answer_query(state, node.cfg, query, node.policy)
    except Exception as err:  # noqa: BLE001 - this node fails, the others go on
        return err


def _refused(query: GsQuery, state: ClientState, refusal: str) -> GsAnswer:
    """The answer of a node whose own policy refuses the run: nothing released, nothing charged."""
    return GsAnswer(step=query.step, refused=True, reason=f"client {state.client_id} refuses: {refusal}")
