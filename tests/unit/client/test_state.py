"""The per-client state store: one file per client, read back only for the clients that are active."""

import numpy as np
import pytest
import torch

from client import state as client_state
from common import client_state as common_client_state
from common.methods import ExperimentConfig
from common.methods.gswgan.client import answer_query
from tests.helpers import gs_query


@pytest.fixture
def cfg():
    return ExperimentConfig(
        num_clients=50, model="tiny", batch_size=8, n_critic=2, synthetic_samples_per_writer=24, noise_seed=5
    )


@pytest.fixture(autouse=True)
def _fresh_cache():
    client_state.clear_cache()
    yield
    client_state.clear_cache()


def _answered(cfg, client_id, tmp_path, steps=1):
    state = client_state.load_state(cfg, client_id, tmp_path, version=0, critic_lr=cfg.lr_d)
    for step in range(steps):
        answer_query(state, cfg, gs_query(cfg, step))
    client_state.save_state(state, tmp_path)
    return state


def _count_renders(monkeypatch):
    rendered = []
    real = client_state.client_arrays

    def counting(cfg, client_id):
        rendered.append(client_id)
        return real(cfg, client_id)

    monkeypatch.setattr(client_state, "client_arrays", counting)  # reading a state back
    monkeypatch.setattr(common_client_state, "client_arrays", counting)  # building a new one
    return rendered


def test_round_trip_restores_everything(cfg, tmp_path):
    state = _answered(cfg, 7, tmp_path, steps=2)
    client_state.clear_cache()  # as if the worker process were new
    loaded = client_state.load_state(cfg, 7, tmp_path, version=state.version, critic_lr=cfg.lr_d)
    assert loaded is not state and loaded.version == state.version == 2
    assert loaded.ledger.history == state.ledger.history
    assert torch.equal(loaded.data_rng.get_state(), state.data_rng.get_state())
    assert torch.equal(loaded.data.images, state.data.images) and torch.equal(loaded.data.labels, state.data.labels)
    for a, b in zip(
        state.discriminator.state_dict().values(), loaded.discriminator.state_dict().values(), strict=False
    ):
        assert torch.equal(a, b)
    for a, b in zip(state.optimizer.state.values(), loaded.optimizer.state.values(), strict=False):
        assert all(torch.equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(
        answer_query(state, cfg, gs_query(cfg, 5)).grad, answer_query(loaded, cfg, gs_query(cfg, 5)).grad
    )


def test_first_contact_is_lazy_and_writes_nothing_until_an_answer(cfg, tmp_path):
    state = client_state.load_state(
        cfg.replace(warmup_steps=2), 3, tmp_path, version=0, critic_lr=cfg.replace(warmup_steps=2).lr_d
    )
    assert not state.warmed_up and state.ledger.queries == 0
    assert not any(tmp_path.iterdir())  # a client that never answered costs no disk
    warm = cfg.replace(warmup_steps=2)
    answer_query(state, warm, gs_query(warm))
    client_state.save_state(state, tmp_path)
    client_state.clear_cache()
    assert client_state.load_state(warm, 3, tmp_path, version=1, critic_lr=warm.lr_d).warmed_up  # warm start runs once


def test_only_the_active_client_is_built(cfg, tmp_path, monkeypatch):
    rendered = _count_renders(monkeypatch)
    _answered(cfg, 11, tmp_path)
    assert rendered == [11]
    assert [p.name for p in tmp_path.iterdir()] == ["client-00011.pt"]


def test_reading_back_uses_the_stored_partition(cfg, tmp_path, monkeypatch):
    _answered(cfg, 4, tmp_path)
    client_state.clear_cache()
    rendered = _count_renders(monkeypatch)
    assert client_state.load_state(cfg, 4, tmp_path, version=1, critic_lr=cfg.lr_d).client_id == 4
    assert rendered == []
    client_state.clear_cache()
    other_data = cfg.replace(synthetic_samples_per_writer=30)  # a stored copy of other data is not used
    assert len(client_state.load_state(other_data, 4, tmp_path, version=1, critic_lr=other_data.lr_d).data) == 30
    assert rendered == [4]


def test_memory_holds_at_most_the_cache_bound(cfg, tmp_path):
    big = cfg.replace(num_clients=64)
    for cid in range(client_state.CACHE_SIZE + 3):
        client_state.save_state(client_state.load_state(big, cid, tmp_path, version=0, critic_lr=big.lr_d), tmp_path)
    assert len(client_state._CACHE) == client_state.CACHE_SIZE


def test_ledger_is_read_without_building_a_client(cfg, tmp_path, monkeypatch):
    _answered(cfg, 2, tmp_path, steps=2)
    client_state.clear_cache()
    monkeypatch.setattr(client_state, "_read_state", lambda *a: pytest.fail("built a discriminator"))
    assert client_state.load_ledger(cfg, 2, tmp_path, version=2).queries == 2
    assert client_state.load_ledger(cfg, 9, tmp_path, version=0).queries == 0  # never answered
    assert not client_state.state_path(tmp_path, 9).exists()


def test_files_of_format_1_still_load(cfg, tmp_path):
    state = _answered(cfg, 5, tmp_path)
    blob = client_state._blob(state)
    del blob["format"], blob["data"]
    torch.save(blob, client_state.state_path(tmp_path, 5))
    client_state.clear_cache()
    loaded = client_state.load_state(cfg, 5, tmp_path, version=1, critic_lr=cfg.lr_d)
    assert torch.equal(loaded.data.images, state.data.images) and loaded.ledger.queries == 1


def test_corrupt_file_is_a_clear_error(cfg, tmp_path):
    client_state.state_path(tmp_path, 0).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="client-00000.pt is unreadable.*privacy ledger") as err:
        client_state.load_state(cfg, 0, tmp_path, version=1, critic_lr=cfg.lr_d)
    # Deleting the file would reset the client's ledger (and its budget): never advised.
    assert "delete it" not in str(err.value)
    with pytest.raises(RuntimeError, match="unreadable"):
        client_state.load_ledger(cfg, 0, tmp_path, version=1)


def test_file_of_another_client_or_model_is_a_clear_error(cfg, tmp_path):
    _answered(cfg, 1, tmp_path)
    client_state.clear_cache()
    with pytest.raises(RuntimeError, match="does not fit this run's configuration"):
        client_state.load_state(
            cfg.replace(model="small"), 1, tmp_path, version=0, critic_lr=cfg.replace(model="small").lr_d
        )
    client_state.state_path(tmp_path, 1).rename(client_state.state_path(tmp_path, 2))
    with pytest.raises(RuntimeError, match="holds client 1, not 2"):
        client_state.load_state(cfg, 2, tmp_path, version=1, critic_lr=cfg.lr_d)


def test_loading_leaves_the_global_rng_and_threads_alone(cfg, tmp_path):
    _answered(cfg, 6, tmp_path)
    client_state.clear_cache()
    client_state._SKELETONS.clear()
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    client_state.load_state(cfg, 6, tmp_path, version=1, critic_lr=cfg.lr_d)
    assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == threads


def test_client_threads_respect_the_standard_variables(monkeypatch):
    """Issue 14, item 17: FEDGAN_CLIENT_THREADS, else OMP_NUM_THREADS, else every core."""
    import os

    from client.node import client_threads

    monkeypatch.delenv("FEDGAN_CLIENT_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert client_threads() == 1
    monkeypatch.setenv("FEDGAN_CLIENT_THREADS", "3")
    assert client_threads() == 3
    monkeypatch.delenv("FEDGAN_CLIENT_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert client_threads() == (os.cpu_count() or 1)


def test_a_full_node_disk_keeps_the_previous_state_file_and_leaves_no_temporary(cfg, tmp_path):
    """Issue 23, item 17 on a node: torch.save's RuntimeError left ``client-00000.tmp`` behind and
    named no cause. Now the OSError (ENOSPC) surfaces, the temporary file is gone, the old file stays."""
    import errno

    from tests.helpers import fill_disk, small_disk

    with small_disk(tmp_path / "disk", 4 * 2**20) as disk:
        state = _answered(cfg, 0, disk)
        before = client_state.state_path(disk, 0).read_bytes()
        fill_disk(disk, leave_bytes=len(before) // 2)
        state.version += 1
        with pytest.raises(OSError) as err:
            client_state.save_state(state, disk)
        assert err.value.errno == errno.ENOSPC
        assert client_state.state_path(disk, 0).read_bytes() == before and not list(disk.glob("*.tmp"))
