import os

import torch

# Two cores on CI and two pytest-xdist workers (`make test`): one intra-op thread per process, the
# workers' and the subprocesses' they start (the CLI, deployments, Flower's actors inherit the
# environment). Two OpenMP threads per process on a loaded 2-core machine spin against each other:
# measured here, tests of small tensor work ran 5-10x slower in the suite than alone.
torch.set_num_threads(1)
os.environ.setdefault("FEDGAN_CLIENT_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_node_policy_left_behind(monkeypatch):
    """``fedgan simulate --node-policy`` points the process's FEDGAN_NODE_POLICY at its file; a test
    that runs the CLI in this process would leave it set for the next one, whose nodes would then
    have two policy sources (refused). Each test starts without it and restores it after."""
    from common.privacy.policy import POLICY_ENV

    monkeypatch.delenv(POLICY_ENV, raising=False)


@pytest.fixture(autouse=True)
def _simulated_nodes_have_a_place(tmp_path, monkeypatch):
    """A node keeps its state and its own ledger where its configuration says, never where a server
    says: `fedgan simulate` places its simulated nodes in the run's clients/ (FEDGAN_NODE_STATE); a
    test that drives a transport itself gets this test's own directory for them."""
    from common.privacy.node_ledger import NODE_STATE_ENV

    monkeypatch.setenv(NODE_STATE_ENV, str(tmp_path / "nodes"))


@pytest.fixture
def trust_server(monkeypatch):
    """Every simulated node trusts the server to noise its updates (Fed-Avg GAN), as the shipped
    policy file ``simulations/configs/policies/trust-server.toml`` says."""
    from common.privacy.policy import POLICY_ENV
    from tests.helpers import TRUST_SERVER_POLICY

    monkeypatch.setenv(POLICY_ENV, str(TRUST_SERVER_POLICY))
    return TRUST_SERVER_POLICY


@pytest.fixture
def allow_nonprivate(tmp_path, monkeypatch):
    """Every simulated node (Flower simulation or in-process) pins a policy that allows the testing
    options (a fixed noise seed): the same file ``fedgan simulate --node-policy`` would name."""
    from common.privacy.policy import POLICY_ENV

    path = tmp_path / "allow-nonprivate.toml"
    path.write_text("allow-nonprivate = true\n")
    monkeypatch.setenv(POLICY_ENV, str(path))
    return path


COMPOSE_TEST = "tests/deployment/test_compose_up.py"


@pytest.fixture
def one_deployment_at_a_time():
    """Held for a whole test that starts a deployment of its own (a SuperLink, SuperNodes, ServerApp
    and ClientApp processes or containers): across pytest-xdist workers, one such test runs at a
    time. Two of them side by side on two cores starved Flower's heartbeats (every 30 s, the run
    failed after 60 s without one): here the compose test's run ended `finished:failed`, its
    ClientApps answered 401 by their SuperNodes (CI's failure, a run without a summary, named no
    cause; this is the likeliest). A lock file beside the session's engine
    directory, which every worker names alike (``pytest_configure`` sets it before xdist starts)."""
    import fcntl

    from tests.compose_engine import state_dir

    with open(f"{state_dir()}.deployments.lock", "a") as lock:  # closing it releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker


def pytest_configure(config):
    if not _is_worker(config):
        from tests.compose_engine import state_dir

        state_dir()  # names the engine's directory in the environment before xdist starts its workers


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: no engine for a test that will not run
def pytest_collection_modifyitems(config, items):
    """The compose test runs last; without xdist, its engine and images are prepared meanwhile."""
    compose = [item for item in items if item.nodeid.startswith(COMPOSE_TEST)]
    if compose:
        items[:] = [item for item in items if not item.nodeid.startswith(COMPOSE_TEST)] + compose
        if not _is_worker(config):
            from tests.compose_engine import PREBUILD

            PREBUILD.start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """xdist's controller: a worker collected the compose test, so prepare its engine and images."""
    if any(nodeid.startswith(COMPOSE_TEST) for nodeid in ids):
        from tests.compose_engine import PREBUILD

        PREBUILD.start()


def pytest_sessionfinish(session, exitstatus):
    if not _is_worker(session.config):
        from tests.compose_engine import PREBUILD

        PREBUILD.stop()
