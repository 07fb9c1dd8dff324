"""Per-client state that must survive across rounds: D_k, its Adam moments, the ledger, the data cursor.

Flower recreates the ClientApp for every message, so the state lives on the node's disk: one file
per client (``client-00042.pt``), written atomically after every answered query and read back only
when that client is active again. A client never queried has no file and costs nothing: its state
is created on first contact (its non-private warm start runs then too, in ``answer_query``). A
small in-process LRU cache keyed by (state directory, client) spares re-reading the clients of
recent steps; ``context.state`` carries only a version number, and a cached copy is used only when
its version matches, so a node whose messages land in different worker processes never trains a
stale discriminator.

RAM grows with the cache bound, never with the federation: with 3,400 clients and one active per
step, a process holds at most ``CACHE_SIZE`` states. Time per step must not grow with K either,
yet in a large federation almost every step brings a client that is not cached. So reading one
back is cheap next to a step: the file also keeps the client's partition (uint8; rendering a
synthetic writer costs about as much as the critic steps save), and D is rebuilt by copying a
per-process skeleton and loading the weights rather than by constructing the spectral-norm
network again.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from common.client_state import ClientState, adam_for, classifier_for, new_state
from common.data import ClientData, client_arrays, client_data_from_arrays, num_classes_for, partition_key
from common.device import resolve_device
from common.io.tensor_files import load_tensors, save_tensors
from common.learning.models import build_discriminator
from common.methods import ExperimentConfig
from common.privacy import PrivacyLedger

CACHE_SIZE = 32
STATE_FORMAT = "fedgan.client_state/2"  # files without "format" are version 1 (no stored partition)


_CACHE: OrderedDict[tuple[str, int], ClientState] = OrderedDict()
_SKELETONS: dict[tuple[str, int], torch.nn.Module] = {}


def state_path(state_dir: str | Path, client_id: int) -> Path:
    return Path(state_dir) / f"client-{client_id:05d}.pt"


# --- building a client ------------------------------------------------------------------------


@contextmanager
def _one_intraop_thread() -> Iterator[None]:
    """Build, read and write client states on one thread: the work is tiny tensor operations
    (spectral norm's start-up power iterations are hundreds of matrix-vector products), which
    extra threads only slow down, by 10-20x on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _skeleton_copy(cfg: ExperimentConfig) -> torch.nn.Module:
    """A D of the right shape whose values are about to be overwritten by a stored state dict.

    Copying a per-process skeleton costs a millisecond; building one runs spectral norm's power
    iterations. The skeleton is built under a forked RNG so the global stream is left as it was.
    """
    key = (cfg.model, num_classes_for(cfg))
    if key not in _SKELETONS:
        with torch.random.fork_rng(devices=[]):
            _SKELETONS[key] = build_discriminator(cfg.model, num_classes=key[1])
    return copy.deepcopy(_SKELETONS[key])


# --- the file -------------------------------------------------------------------------------------


def save_state(state: ClientState, state_dir: str | Path) -> None:
    """Write atomically: a crash mid-write leaves the previous file intact."""
    path = state_path(state_dir, state.client_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _one_intraop_thread():
        save_tensors(_blob(state), path)
    _remember(str(state_dir), state)


def _blob(state: ClientState) -> dict[str, Any]:
    """The file's content: plain containers and tensors only, so it loads with ``weights_only``."""
    return {
        "format": STATE_FORMAT,
        "client_id": state.client_id,
        "version": state.version,
        "warmed_up": state.warmed_up,
        # Empty for a client that keeps no D (DP-MERF): the file then holds its ledger and partition.
        "discriminator": {} if state.discriminator is None else state.discriminator.state_dict(),
        "optimizer": {} if state.optimizer is None else state.optimizer.state_dict(),
        "ledger": state.ledger.state_dict(),
        "own_ledger": state.own_ledger.state_dict(),
        "data_rng": state.data_rng.get_state(),
        "data": _packed_data(state),
        **_classifier_blob(state),
    }


def _classifier_blob(state: ClientState) -> dict[str, Any]:
    """DPAC's classifier and its Adam, when the client has one (files without it load as before)."""
    if state.classifier is None or state.classifier_optimizer is None:
        return {}
    return {
        "classifier": state.classifier.state_dict(),
        "classifier_optimizer": state.classifier_optimizer.state_dict(),
        "classifier_ready": state.classifier_ready,
    }


def _packed_data(state: ClientState) -> dict[str, Any]:
    """The partition as the file stores it (uint8): made once per state, not at every save (each
    answered query saves), since a client's partition never changes."""
    if state.packed_data is None:
        state.packed_data = {
            "key": state.data_key,
            "images": state.data.images.squeeze(1).mul(255.0).round_().to(torch.uint8),
            "labels": state.data.labels,
            "inverted": state.data.inverted,
        }
    return state.packed_data


def _read_blob(path: Path, client_id: int, *, mmap: bool = False) -> dict[str, Any]:
    """The file's content, or a clear error naming the file and what to do."""
    try:
        blob = load_tensors(path, mmap=mmap)
        if int(blob["client_id"]) != client_id:
            raise ValueError(f"it holds client {blob['client_id']}, not {client_id}")
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same failure for the user
        raise RuntimeError(
            f"client state file {path} is unreadable ({_first_line(err)}); it holds this "
            "client's privacy ledger: restore it from a backup, or run with a new state "
            "directory (the spent privacy stays on record)"
        ) from err
    return blob


def _first_line(err: Exception) -> str:
    """A short reason: torch's own message for a file that is not a checkpoint runs to ten lines."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:200]


def _read_state(cfg: ExperimentConfig, client_id: int, path: Path, critic_lr: float | None) -> ClientState:
    blob = _read_blob(path, client_id)
    try:
        disc, optimizer = None, None
        if critic_lr is not None and blob["discriminator"]:  # none yet: ``_with_discriminator`` gives one
            disc = _skeleton_copy(cfg).to(resolve_device(cfg.device))
            disc.load_state_dict(blob["discriminator"])
            optimizer = adam_for(cfg, disc, critic_lr)
            optimizer.load_state_dict(blob["optimizer"])
        data_rng = torch.Generator()
        data_rng.set_state(blob["data_rng"])
        ledger = PrivacyLedger.from_state_dict(blob["ledger"])
        own = PrivacyLedger.from_state_dict(blob["own_ledger"]) if "own_ledger" in blob else PrivacyLedger()
        classifier, classifier_optimizer = classifier_for(cfg)
        if classifier is not None and "classifier" in blob:
            classifier.load_state_dict(blob["classifier"])
            classifier_optimizer.load_state_dict(blob["classifier_optimizer"])
    except Exception as err:  # noqa: BLE001 - e.g. a file written under another model preset
        raise RuntimeError(
            f"client state file {path} does not fit this run's configuration "
            f"({_first_line(err)}); run with a new state directory (this file keeps the "
            "client's privacy ledger: do not delete it)"
        ) from err
    stored = blob.get("data")
    data, key = _partition(cfg, client_id, stored)
    return ClientState(
        client_id=client_id,
        discriminator=disc,
        optimizer=optimizer,
        ledger=ledger,
        data_rng=data_rng,
        data=data,
        version=int(blob["version"]),
        warmed_up=bool(blob["warmed_up"]),
        data_key=key,
        packed_data=stored if stored is not None and stored.get("key") == key else None,
        classifier=classifier,
        classifier_optimizer=classifier_optimizer,
        classifier_ready=classifier is not None and bool(blob.get("classifier_ready", False)),
        own_ledger=own,
    )


def _partition(cfg: ExperimentConfig, client_id: int, stored: dict[str, Any] | None) -> tuple[ClientData, str]:
    """The stored copy of the client's partition when it was made under the same data config,
    else the partition loaded afresh (files of format 1 hold none)."""
    key = partition_key(cfg)
    if stored is not None and stored.get("key") == key:
        data = client_data_from_arrays(
            stored["images"], stored["labels"], client_id=client_id, inverted=bool(stored["inverted"])
        )
        return data, key
    images, labels, inverted = client_arrays(cfg, client_id)
    return client_data_from_arrays(images, labels, client_id=client_id, inverted=inverted), key


# --- lookups ----------------------------------------------------------------------------------------


def load_state(
    cfg: ExperimentConfig, client_id: int, state_dir: str | Path, version: int, *, critic_lr: float | None = None
) -> ClientState:
    """The client's state at ``version``; no file: a new client, built now (first contact). A
    ``critic_lr`` (its Adam's learning rate) gives it a private D, as its method says."""
    key = (str(state_dir), client_id)
    cached = _CACHE.get(key)
    if cached is not None and cached.version == version:
        _CACHE.move_to_end(key)
        return _with_discriminator(cached, cfg, critic_lr)
    path = state_path(state_dir, client_id)
    with _one_intraop_thread():
        if not path.exists():
            return new_state(cfg, client_id, critic_lr=critic_lr)
        return _with_discriminator(
            _remember(str(state_dir), _read_state(cfg, client_id, path, critic_lr)), cfg, critic_lr
        )


def _with_discriminator(state: ClientState, cfg: ExperimentConfig, critic_lr: float | None) -> ClientState:
    """A client that so far took part only in a method without a private D (a seeded run's DP-MERF
    release) gets one on first contact with a method that keeps one, as a new client would: from its
    own seed, not warmed up."""
    if critic_lr is None or state.discriminator is not None:
        return state
    fresh = new_state(cfg, state.client_id, critic_lr=critic_lr)
    state.discriminator, state.optimizer, state.warmed_up = fresh.discriminator, fresh.optimizer, False
    return state


def load_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str | Path, version: int) -> PrivacyLedger:
    """The client's ledger; an empty one when it never answered (no state is created for that).

    Reads the ledger only (the file is memory-mapped, its tensors are not touched): asking every
    client of a large federation for its ledger must not build a discriminator per client.
    """
    return _stored_ledger(client_id, state_dir, version, "ledger")


def load_own_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str | Path, version: int) -> PrivacyLedger:
    """The client's record of its secure releases against a server that deviates (its own noise
    shares, every run on this state); empty when it made none."""
    return _stored_ledger(client_id, state_dir, version, "own_ledger")


def _stored_ledger(client_id: int, state_dir: str | Path, version: int, key: str) -> PrivacyLedger:
    """One of the state's ledgers (``ledger``, ``own_ledger``): the cached state's at ``version``, else
    read from the file alone; empty when there is no file or (an older file) no such ledger."""
    cached = _CACHE.get((str(state_dir), client_id))
    if cached is not None and cached.version == version:
        return getattr(cached, key)
    path = state_path(state_dir, client_id)
    if not path.exists():
        return PrivacyLedger()
    stored = _read_blob(path, client_id, mmap=True).get(key)
    return PrivacyLedger() if stored is None else PrivacyLedger.from_state_dict(stored)


def _remember(state_dir: str, state: ClientState) -> ClientState:
    key = (state_dir, state.client_id)
    _CACHE[key] = state
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return state


def clear_cache() -> None:
    _CACHE.clear()
