"""Fed-Avg GAN's release as a channel sees it: a client's discriminator delta as one vector (its
entries in one order both sides flatten it in), clipped to S, carrying the noise multiplier z
(``release_spec``), and the client's side of a release through a summing channel.

Through the secure-sum channel (``--secure-aggregation``) DP-FedAvg's server sees only the sum of a
round's deltas: each round the server draws m clients uniformly (not Poisson: no amplification is
claimed, so the draw only has to give the sum its t inputs); each runs its local steps, clips its
flattened delta to S and hands it to the channel, which adds a Skellam share and deposits it. The sum
carries noise multiplier z, as the server's N(0, (zS)²) did: the server divides it by m and applies
it. Against a server that runs the protocol a client's ε is one Skellam mechanism per round it took
part in, composed without amplification; against one that deviates, only its share protects it.
The trusted-server, user-level figure of plain DP-FedAvg is not reported then: its Poisson
amplification has no Skellam analysis in our accountant.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from common.calibration import smallest_noise
from common.channels import ReleaseSpec, channel_for, epsilon_after
from common.data import num_classes_for
from common.learning.models import build_discriminator

from ..protocol import ClientNode, refusal
from .dp_fedavg import Delta, flatten_delta, weights_only
from .messages import FedAvgReply, FedAvgRound
from .privacy import RAW_DELTA

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import PrivacyEvent


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


def release_spec(cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec:
    """One round's delta: d = the delta's coordinates clipped to S, carrying z (the run's, or
    ``noise_multiplier``), m clients a round; in the clear a raw delta (the server adds the noise).
    No client-side debugging option voids it (the noise seed is the server's)."""
    z = cfg.fedavg_noise_multiplier if noise_multiplier is None else noise_multiplier
    return ReleaseSpec(
        what="delta",
        describes="its discriminator delta of a round, clipped to S",
        dim=sum(math.prod(shape) for _, shape in shapes(cfg)),
        clip=cfg.fedavg_clip,
        noise_multiplier=z,
        cohort=cfg.fedavg_clients_per_round,
        cohort_field="fedavg_clients_per_round",
        noise_field="fedavg_noise_multiplier",
        clear_event=RAW_DELTA,
    )


def calibrate(cfg: ExperimentConfig, *, prior: Sequence[PrivacyEvent] = ()) -> ExperimentConfig:
    """z for the per-client ε through a channel that bounds every release (a secure sum: against a
    server that runs the protocol) of a client taking part in its expected share ceil(T·m/K) of the
    rounds; the target also becomes the clients' budget."""
    rounds = max(1, math.ceil(cfg.steps * cfg.fedavg_clients_per_round / len(cfg.participants())))
    channel = channel_for(cfg)
    z = smallest_noise(
        lambda nm: epsilon_after(channel, cfg, release_spec(cfg, noise_multiplier=nm), rounds, prior),
        cfg.target_epsilon,
    )
    budget = min(cfg.client_epsilon_budget or cfg.target_epsilon, cfg.target_epsilon)
    return cfg.replace(fedavg_noise_multiplier=z, client_epsilon_budget=budget)


def deposit_delta(node: ClientNode, state: ClientState, request: FedAvgRound, delta_of) -> FedAvgReply:
    """One round through a summing channel: the node's policy checked on the event it counts, the
    local steps (``delta_of``), then the flattened delta handed to the channel, which clips, encodes,
    charges and deposits it for ``request.session`` (its share from the CSPRNG whatever the noise
    seed: Fed-Avg's noise is no client's debugging option)."""
    cfg = node.cfg
    channel, spec = channel_for(cfg), release_spec(cfg)
    admission = channel.admit(node, state, spec)
    if admission.refused:
        return refusal(FedAvgReply, request.step, state.client_id, admission.refused)
    vector = flatten(delta_of(state), cfg)
    channel.deposit(node, state, request.session, request.step, spec, vector.numpy(), admission, seeded=False)
    return FedAvgReply(step=request.step, deposited=True)
