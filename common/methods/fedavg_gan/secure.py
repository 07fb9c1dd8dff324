"""Fed-Avg GAN through secure sums (``--secure-aggregation``): DP-FedAvg whose server sees only the
sum of a round's deltas.

Each round the server draws m clients uniformly (not Poisson: no amplification is claimed, so the
draw only has to give the sum its t inputs); each runs its local steps, clips its flattened delta to
S, scales it to integers of granularity γ = S/2^14, rounds it conditionally and adds a Skellam share
Sk(μ/t) (``common/secagg/plan.py``); only the SecAgg+ sum of at least t deltas is revealed.
The sum carries Sk(μ) with μ set so that its noise multiplier is z, as the server's N(0, (zS)²)
was: the server divides it by m and applies it. Against a server that runs the protocol a client's
ε is one Skellam mechanism (multiplier z) per round it took part in, composed without
amplification; against one that deviates, only its share protects it. The trusted-server,
user-level figure of plain DP-FedAvg is not reported here: its Poisson amplification has no
Skellam analysis in our accountant.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from common.calibration import smallest_noise
from common.data import num_classes_for
from common.learning.models import build_discriminator
from common.privacy import PrivacyLedger
from common.secagg.plan import SecureSumPlan, client_vector, plan_with_multiplier, release_events
from common.secagg.plan import fewest_survivors as _fewest

from ..protocol import ClientNode, refusal
from ..secure_sums import deposit
from .dp_fedavg import Delta, flatten_delta, weights_only
from .messages import FedAvgReply, FedAvgRound

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig

VOID = ""  # Fed-Avg has no client-side debugging option that voids a share (the noise seed is the server's)


def fewest_survivors(cfg: ExperimentConfig) -> int:
    """t of a round's sum over its m clients (``--secagg-threshold``, or ⌈2m/3⌉)."""
    return _fewest(cfg.fedavg_clients_per_round, cfg.secagg_threshold)


@functools.lru_cache(maxsize=8)
def delta_shapes(model: str, num_classes: int, scope: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every entry a delta covers, in the one order both sides flatten it in."""
    D = build_discriminator(model, num_classes=num_classes)
    state = D.state_dict()
    template = flatten_delta(state, state)
    template = weights_only(template, D) if scope == "weights" else template
    return tuple((name, tuple(template[name].shape)) for name in sorted(template))


def shapes(cfg: ExperimentConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return delta_shapes(cfg.model, num_classes_for(cfg), cfg.fedavg_delta)


def flatten(delta: Delta, cfg: ExperimentConfig) -> torch.Tensor:
    """The delta as one vector, its entries in ``shapes`` order."""
    return torch.cat([delta[name].reshape(-1).double() for name, _ in shapes(cfg)])


def unflatten(vector: torch.Tensor, cfg: ExperimentConfig) -> Delta:
    out, at = {}, 0
    for name, shape in shapes(cfg):
        size = math.prod(shape)
        out[name] = vector[at : at + size].reshape(shape).float()
        at += size
    return out


def plan(cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> SecureSumPlan:
    """d = the delta's coordinates clipped to S, cohort m, survivors t, the sum's multiplier z."""
    z = cfg.fedavg_noise_multiplier if noise_multiplier is None else noise_multiplier
    dim = sum(math.prod(shape) for _, shape in shapes(cfg))
    return plan_with_multiplier(
        dim=dim,
        clip=cfg.fedavg_clip,
        cohort=cfg.fedavg_clients_per_round,
        threshold=fewest_survivors(cfg),
        sigma=z,
        colluders=cfg.secagg_colluders,
    )


def calibrate(cfg: ExperimentConfig) -> ExperimentConfig:
    """z for the per-client ε (server runs the protocol) of a client taking part in its expected
    share ceil(T·m/K) of the rounds; the target also becomes the clients' budget."""
    rounds = max(1, math.ceil(cfg.steps * cfg.fedavg_clients_per_round / len(cfg.participants())))

    def epsilon(z: float) -> float:
        return PrivacyLedger([plan(cfg, noise_multiplier=z).protocol_event(rounds)]).epsilon(delta=cfg.delta)

    budget = min(cfg.client_epsilon_budget or cfg.target_epsilon, cfg.target_epsilon)
    return cfg.replace(
        fedavg_noise_multiplier=smallest_noise(epsilon, cfg.target_epsilon), client_epsilon_budget=budget
    )


def secure_answer(node: ClientNode, state: ClientState, request: FedAvgRound, delta_of) -> FedAvgReply:
    """One round through the round's secure sum: the node's policy checked on the event it counts,
    the local steps (``delta_of``), then the delta clipped, encoded with this client's share and
    deposited for ``request.session``; charged before the deposit."""
    cfg, policy = node.cfg, node.policy
    p = plan(cfg)
    protocol, own = release_events(p, VOID)
    over, counted = policy.secure_release_refusal(state.ledger, protocol, own, cfg, "one more delta")
    if over:
        return refusal(FedAvgReply, request.step, state.client_id, over)
    vector = flatten(delta_of(state), cfg)
    deposit(
        node,
        state,
        request.session,
        client_vector(vector.numpy(), p, -1, state.client_id, request.step),
        p,
        (protocol, own, counted),
    )
    return FedAvgReply(step=request.step, deposited=True)
