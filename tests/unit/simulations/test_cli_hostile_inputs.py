"""Hostile input to the CLI (an outside audit's "low severity" findings): each case ends in one line that
names the file, flag or field at fault and exit code 2, never a traceback, and nothing of the run is lost.

Run directories are built from the few JSON files a command reads, so no test trains anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.methods import ExperimentConfig
from simulations.cli import main
from simulations.deploy import pki
from tests.helpers import read_only, tiny_flags

PRIVACY = {"clients": [{"client_id": 0, "queries": 1, "epsilon": 1.0}]}
SUMMARY = {"clients": PRIVACY["clients"], "steps_completed": 1, "epsilon_max": 1.0, "delta": 1e-5}
AUDIT = ["--canaries", "100", "--mia-samples", "0"]  # the smallest audit: ~0.3 s of canaries


def run_dir(folder: Path, *, strategy: str = "dp-merf", files: dict[str, object] | None = None) -> Path:
    """A run directory holding config.json and ``files`` (name -> JSON value, or str/bytes as written)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = ExperimentConfig(strategy=strategy, model="tiny").to_dict()
    (folder / "config.json").write_text(json.dumps(config))
    for name, content in (files or {}).items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's only stderr line, checked to be an error message and no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- 1. audit and evaluate --------------------------------------------------------------------------
def test_audit_of_a_garbled_summary_names_it_before_any_canary(tmp_path, capsys):
    run = run_dir(tmp_path / "run", files={"privacy.json": PRIVACY, "summary.json": "{garbled"})
    assert main(["audit", str(run), *AUDIT]) == 2
    line = one_line_error(capsys)
    assert f"{run / 'summary.json'} is corrupt" in line, line
    assert not (run / "audit.json").exists()  # the audit stopped before its work, not after


@pytest.mark.parametrize(
    ("privacy", "words"),
    [
        ("{garbled", "privacy.json is corrupt"),
        (b"\xff\xfe\x00binary", "privacy.json is corrupt"),
        ([1, 2], "privacy.json is corrupt: it holds a list"),
        ({"clients": 5}, "clients is 5, not a list"),
        ({"clients": [7]}, "clients[0] is 7, not a client object"),
        ({"clients": [{"queries": "x", "epsilon": 1.0}]}, "clients[0].queries is 'x', not an integer >= 0"),
        ({"clients": [{"queries": 1, "epsilon": "big"}]}, "clients[0].epsilon is 'big', not a finite number"),
    ],
)
def test_audit_of_a_garbled_privacy_json_names_the_file_and_field(tmp_path, capsys, privacy, words):
    run = run_dir(tmp_path / "run", files={"privacy.json": privacy, "summary.json": SUMMARY})
    assert main(["audit", str(run), *AUDIT]) == 2
    line = one_line_error(capsys)
    assert str(run / "privacy.json") in line and words in line, line
    assert not (run / "audit.json").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--mia-samples", "-1"], "invalid --mia-samples=-1: must be between 0 and 10,000"),
        (["--mia-samples", "1000000000"], "invalid --mia-samples=1000000000: must be between 0 and 10,000"),
        (["--canaries", "1000000000"], "invalid --canaries=1000000000: must be between 100 and 100,000"),
        (["--canaries", "99"], "invalid --canaries=99: must be between 100 and 100,000"),
        (["--releases", "1000000000"], "invalid --releases=1000000000: must be between 1 and 100,000"),
        (["--releases", "0"], "invalid --releases=0: must be between 1 and 100,000"),
        (["--confidence", "nan"], "invalid --confidence=nan: must be in (0.5, 1)"),
    ],
)
def test_audit_counts_are_bounded_before_the_run_is_read(tmp_path, capsys, flags, words):
    """Item 5: 10^9 canaries took 9.8 GB before they were stopped. A DP-GAN run, which the audit does
    not cover, makes the code before these bounds fail fast instead of running the canaries."""
    run = run_dir(tmp_path / "run", strategy="dpgan", files={"privacy.json": PRIVACY, "summary.json": SUMMARY})
    assert main(["audit", str(run), *flags]) == 2
    assert one_line_error(capsys) == f"fedgan: error: {words}"


def test_audit_help_states_the_bounds(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "100 to 100,000" in text and "1 to 100,000" in text and "at most 10,000" in text


def test_audit_of_a_read_only_run_directory_is_refused_before_any_canary(tmp_path, capsys):
    run = run_dir(tmp_path / "run", files={"privacy.json": PRIVACY, "summary.json": SUMMARY})
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with read_only(run):
        assert main(["audit", str(run), *AUDIT]) == 2
        line = one_line_error(capsys)
    assert f"cannot write to {run}" in line and "audit writes audit.json" in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_audit_of_a_checkpoint_without_a_generator_names_it_before_any_canary(tmp_path, capsys):
    from common.io.tensor_files import save_tensors

    run = run_dir(tmp_path / "run", files={"privacy.json": PRIVACY, "summary.json": SUMMARY})
    save_tensors({"step": 1}, run / "checkpoint.pt")
    assert main(["audit", str(run), "--canaries", "100", "--mia-samples", "50"]) == 2
    line = one_line_error(capsys)
    assert f"{run / 'checkpoint.pt'} holds no released generator" in line and "--mia-samples 0" in line, line
    assert not (run / "audit.json").exists()


@pytest.mark.parametrize("flag", ["--num-samples", "--fid-samples"])
def test_evaluate_sample_counts_have_an_upper_bound(tmp_path, capsys, flag):
    run = run_dir(tmp_path / "run", files={"summary.json": SUMMARY})
    assert main(["evaluate", str(run), flag, "1000000000000"]) == 2
    assert one_line_error(capsys) == f"fedgan: error: invalid {flag}=1000000000000: must be between 10 and 100,000"
    with pytest.raises(SystemExit) as stop:  # not an integer: argparse's own one line, naming the flag
        main(["evaluate", str(run), flag, "1e12"])
    assert stop.value.code == 2 and f"argument {flag}: invalid int value: '1e12'" in capsys.readouterr().err


# --- 2 and 6. pki ------------------------------------------------------------------------------------
def pki_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """``python -m simulations.deploy.pki``'s error line for ``argv`` (argparse: exit code 2)."""
    with pytest.raises(SystemExit) as stop:
        pki.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_pki_out_a_file_is_named(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    line = pki_error(capsys, ["--out", str(a_file), "--server-host", "10.0.0.5", "--num-nodes", "1"])
    assert f"--out {a_file} is not a directory" in line, line
    assert a_file.read_text() == "kept"


@pytest.mark.parametrize("inside", [False, True])
def test_pki_out_a_read_only_folder_is_named(tmp_path, capsys, inside):
    folder = tmp_path / "ro"
    folder.mkdir()
    out = folder / "hosts" if inside else folder
    with read_only(folder):
        line = pki_error(capsys, ["--out", str(out), "--server-host", "10.0.0.5", "--num-nodes", "1"])
    assert f"cannot write to --out {out}" in line and "writable folder" in line, line
    assert not any(folder.iterdir())


@pytest.mark.parametrize("host", ["", "bad host!/x", "-lead.example", "a..b", "x" * 64, "name.", "h" * 5000])
def test_pki_server_host_must_be_an_ip_address_or_a_dns_name(tmp_path, capsys, host):
    out = tmp_path / "hosts"
    line = pki_error(capsys, ["--out", str(out), f"--server-host={host}", "--num-nodes", "1"])
    assert "invalid --server-host" in line and "IP address or a DNS name" in line and len(line) < 400, line
    assert not out.exists()  # checked before any file is made


def test_pki_num_nodes_is_bounded_before_the_folder_is_looked_at(tmp_path, capsys):
    """Item 5: 10^9 nodes had made 321 MB in 4 minutes. The folder holds a file, which the code before
    the bound refused first, so that code fails fast here instead of making keys."""
    out = tmp_path / "hosts"
    out.mkdir()
    (out / "kept").write_text("x")
    for count in ("1000000000", "0"):
        line = pki_error(capsys, ["--out", str(out), "--server-host", "10.0.0.5", "--num-nodes", count])
        assert f"invalid --num-nodes {count}: must be between 1 and 10,000" in line, line
    assert [p.name for p in out.iterdir()] == ["kept"]


def test_pki_takes_ip_addresses_and_dns_names(tmp_path, capsys):
    out = tmp_path / "hosts"
    pki.main(["--out", str(out), "--server-host", "10.0.0.5", "--server-host", "::1"] + ["--num-nodes", "1"])
    pki.main(["--out", str(tmp_path / "named"), "--server-host", "fedgan-server.example.org", "--num-nodes", "1"])
    assert (out / "server" / "server.pem").is_file() and (tmp_path / "named" / "supernode-1").is_dir()


# --- 3. ray_address, $RAY_ADDRESS and the recorded cluster --------------------------------------------
def ray_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str) -> str:
    out = tmp_path / "run"
    assert main(["simulate", *tiny_flags(transport="flower"), "--ray-address", address, "--out", str(out)]) == 2
    assert not out.exists()
    return one_line_error(capsys)


@pytest.mark.parametrize("address", ["h" * 5000 + ":6379", "a" * 5000, "h" * 64 + ":6379", "bad host!:6379"])
def test_a_hostile_ray_address_is_named_in_a_short_line(tmp_path, capsys, address):
    line = ray_error(tmp_path, capsys, address)
    assert line.startswith("fedgan: error: invalid ray_address=") and len(line) < 400, line


def test_garbage_in_ray_address_env_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "garbage!!")
    line = ray_error(tmp_path, capsys, "auto")
    assert "$RAY_ADDRESS (read for ray_address='auto') holds 'garbage!!'" in line and "HOST:PORT" in line, line


@pytest.mark.parametrize(
    ("recorded", "words"),
    [(b"\xff\xfe\x00garbled", "is not text"), (b"not an address", "holds 'not an address'")],
)
def test_a_garbled_recorded_cluster_is_named(tmp_path, capsys, monkeypatch, recorded, words):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "tmp"))
    path = tmp_path / "tmp" / "ray" / "ray_current_cluster"
    path.parent.mkdir(parents=True)
    path.write_bytes(recorded)
    line = ray_error(tmp_path, capsys, "auto")
    assert str(path) in line and words in line and "ray_address='auto'" in line, line


# --- 4. --node-state ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["file", "read-only", "/dev/null", "/proc/self"])
def test_a_bad_node_state_is_blamed_on_node_state_not_out(tmp_path, capsys, kind):
    state = {"file": tmp_path / "a-file", "read-only": tmp_path / "ro", "/dev/null": Path("/dev/null")}
    state["/proc/self"] = Path("/proc/self")
    (tmp_path / "a-file").write_text("kept")
    (tmp_path / "ro").mkdir()
    out = tmp_path / "run"
    argv = ["simulate", *tiny_flags(out=out), "--node-state", str(state[kind])]
    if kind == "read-only":
        with read_only(tmp_path / "ro"):
            code = main(argv)
    else:
        code = main(argv)
    line = one_line_error(capsys)
    assert code == 2 and "--node-state" in line and "--out" not in line, line
    assert not out.exists() and (tmp_path / "a-file").read_text() == "kept"


@pytest.mark.parametrize("command", ["compare", "debug-task"])
def test_other_commands_check_node_state_before_any_work(tmp_path, capsys, command):
    (tmp_path / "a-file").write_text("kept")
    out = tmp_path / "out"
    assert main([command, *tiny_flags(out=out), "--node-state", str(tmp_path / "a-file")]) == 2
    line = one_line_error(capsys)
    assert f"--node-state {tmp_path / 'a-file'} is not a directory" in line, line
    assert not out.exists()


# --- 7. a binary node policy -------------------------------------------------------------------------
def test_a_binary_node_policy_names_the_file(tmp_path, capsys):
    from common.privacy.policy import PolicyError, policy_from_file

    policy = tmp_path / "policy.toml"
    policy.write_bytes(b"\x00\xff\xfe\x80 binary")
    with pytest.raises(PolicyError, match="is not UTF-8 text"):
        policy_from_file(policy)
    assert main(["simulate", *tiny_flags(out=tmp_path / "run"), "--node-policy", str(policy)]) == 2
    line = one_line_error(capsys)
    assert f"node privacy policy {policy} is not UTF-8 text" in line, line
    assert not (tmp_path / "run").exists()


# --- 8. what evaluate reads of summary.json ----------------------------------------------------------
@pytest.mark.parametrize(
    ("clients", "words"),
    [
        ([{"x": 1}], "clients[0] has no queries and no epsilon"),
        ([{"queries": 1}], "clients[0] has no epsilon"),
        ([{"queries": 1, "epsilon": 1.0}, {"epsilon": 2.0}], "clients[1] has no queries"),
        ([{"queries": -1, "epsilon": 1.0}], "clients[0].queries is -1, not an integer >= 0"),
    ],
)
def test_evaluate_names_the_summary_field_it_cannot_use(tmp_path, capsys, clients, words):
    run = run_dir(tmp_path / "run", files={"summary.json": {**SUMMARY, "clients": clients}})
    assert main(["evaluate", str(run), "--no-inception", "--num-samples", "20", "--no-progress"]) == 2
    line = one_line_error(capsys)
    assert f"{run / 'summary.json'} is malformed: {words}" in line, line
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "summary.json"]


def test_the_report_notes_a_garbled_audit_json_instead_of_failing(tmp_path):
    """evaluate writes report.html after all its work: a garbled audit.json beside it is noted on the
    page and kept as it is, not a traceback at the end."""
    from common.evaluation.report import write_report

    run = run_dir(tmp_path / "run", files={"summary.json": SUMMARY, "audit.json": "{garbled"})
    page = write_report(run, {}, {}).read_text()
    assert f"{run / 'audit.json'} is corrupt" in page and "fedgan audit" in page
    assert (run / "audit.json").read_text() == "{garbled"
    (run / "audit.json").write_text(json.dumps({"canaries": 100}))
    assert "is incomplete (no inserted)" in write_report(run, {}, {}).read_text()
