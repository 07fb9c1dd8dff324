"""The run directory survives careless use (issue 14, items 9 and 10): one writer at a time, and a
torn last metrics line never blocks a resume or an evaluation. A full disk stops a run cleanly and
a read-only one is refused up front, each in one line with exit code 1 or 2 (issue 23, items 17, 19)."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import time

import pytest
import torch

from simulations.cli import main
from tests.helpers import ROOT, fill_disk, read_only, small_disk, tiny_flags


def _finished_run(tmp_path, steps=4):
    out = tmp_path / "run"
    assert main(["simulate", *tiny_flags(steps=steps, checkpoint_every=2, out=out), "--no-eval"]) == 0
    return out


def test_a_second_process_cannot_drive_a_run_directory_in_use(tmp_path, capsys):
    out = _finished_run(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from server.reporting import RunDirectory; RunDirectory({str(out)!r}).lock(); "
            "print('locked', flush=True); import time; time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (out / "config.json").read_bytes()
        assert main(["simulate", "--resume", str(out), "--steps", "6"]) == 2
        err = capsys.readouterr().err
        assert f"in use by another fedgan process (pid {holder.pid})" in err
        assert (out / "config.json").read_bytes() == before  # nothing was touched
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 0  # free again


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_evaluation(tmp_path):
    out = _finished_run(tmp_path)
    metrics = out / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 5, "privacy/eps')  # killed mid-write
    assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 0
    lines = metrics.read_text().splitlines()
    assert lines and all(line.startswith("{") and line.endswith("}") for line in lines)
    metrics.write_text(metrics.read_text() + '{"step": 7, "tr')
    assert main(["evaluate", str(out), "--no-inception", "--num-samples", "100"]) == 0


def test_repeated_refusals_are_counted_not_printed_one_per_client(tmp_path, capsys):
    """Issue 14, item 18: a --target-epsilon run printed ~290 identical "client X refuses" lines."""
    import json

    out = tmp_path / "run"
    flags = tiny_flags(num_clients=6, steps=40, noise_multiplier=1.0, client_epsilon_budget=45, out=out)
    assert main(["simulate", *flags, "--no-eval"]) == 3  # stopped: every budget spent
    printed = capsys.readouterr()
    refusals = [line for line in (printed.out + printed.err).splitlines() if "refuses" in line]
    summary = json.loads((out / "summary.json").read_text())
    assert len(refusals) <= 3, refusals
    assert any(n.startswith(tuple(f"{k} more like: " for k in range(1, 100))) for n in summary["notes"]), summary[
        "notes"
    ]


class FullDisk:
    """A run directory whose disk fills up on demand: for real (a tmpfs, where mounting is allowed;
    the clients' state moved to another disk, as a node's is) or by making ``torch.save`` fail the
    way it does on a full disk (a RuntimeError whose context is ENOSPC), for checkpoint files only."""

    def __init__(self, kind: str, tmp_path, monkeypatch) -> None:
        self.kind, self.tmp_path, self.monkeypatch, self.filler = kind, tmp_path, monkeypatch, None

    def fill(self, out) -> None:
        if self.kind == "tmpfs":
            self.filler = fill_disk(out.parent, leave_bytes=100_000)  # < a checkpoint, > privacy.json
            return
        real_save = torch.save

        def full(obj, f, *args, **kwargs):
            if not str(getattr(f, "name", f)).endswith("checkpoint.pt.tmp"):
                return real_save(obj, f, *args, **kwargs)
            if isinstance(f, str | bytes) or hasattr(f, "__fspath__"):
                f = open(f, "wb")  # noqa: SIM115 - the path form (torch.save(obj, path)): left open, as torch does
            f.write(b"partial")
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None

        self.monkeypatch.setattr(torch, "save", full)

    def free(self) -> None:
        if self.filler is not None:
            self.filler.unlink()
        self.monkeypatch.undo()


@pytest.fixture(params=["tmpfs", "torch-save"])
def full_disk(request, tmp_path, monkeypatch):
    if request.param == "tmpfs":
        with small_disk(tmp_path / "disk", 16 * 2**20):
            yield FullDisk("tmpfs", tmp_path, monkeypatch)
    else:
        (tmp_path / "disk").mkdir()
        yield FullDisk("torch-save", tmp_path, monkeypatch)


def _stray_temporaries(out) -> list:
    return sorted(str(p) for p in out.rglob("*.tmp"))


def test_a_full_disk_stops_the_run_cleanly_and_it_resumes_once_there_is_room(full_disk, tmp_path, capsys):
    """Issue 23, item 17: torch.save's RuntimeError was missed: a cryptic message, a stray .tmp, no
    privacy.json. Now: the file and the room left are named, the last checkpoint is intact, the
    clients' spending is in privacy.json, and the run resumes when the disk has room again."""
    out = tmp_path / "disk" / "run"
    assert main(["simulate", *tiny_flags(steps=4, checkpoint_every=2, out=out), "--no-eval"]) == 0
    if full_disk.kind == "tmpfs":  # the clients' state lives on the nodes' disks, not the server's
        shutil.move(out / "clients", tmp_path / "node-disks")
        (out / "clients").symlink_to(tmp_path / "node-disks")
    before = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    full_disk.fill(out)
    code = main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"no space left on device writing {out / 'checkpoint.pt'}" in err, err
    assert "the previous version is intact" in err and "checkpoint kept" in err and "Traceback" not in err, err
    if full_disk.kind == "tmpfs":
        assert "KiB free on its file system" in err, err
    assert (out / "checkpoint.pt").read_bytes() == before and not _stray_temporaries(out)
    privacy = json.loads((out / "privacy.json").read_text())
    assert sum(c["queries"] for c in privacy["clients"]) == 6  # the two steps after the checkpoint included
    assert json.loads((out / "summary.json").read_text())["status"].startswith("failed: no space left on device")
    full_disk.free()
    assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps_completed"] == 6


def test_a_disk_full_before_the_first_checkpoint_says_there_is_none(tmp_path, monkeypatch, capsys):
    """Item 17: "checkpoint kept" was printed when none existed. The first checkpoint is now written
    before any client releases anything, so a failure there has nothing to resume and spent nothing."""
    FullDisk("torch-save", tmp_path, monkeypatch).fill(tmp_path)
    out = tmp_path / "run"
    code = main(["simulate", *tiny_flags(steps=4, checkpoint_every=2, out=out), "--no-eval"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"no space left on device writing {out / 'checkpoint.pt'}" in err and "no earlier version" in err, err
    assert "before any client released anything" in err and "no checkpoint was written" in err, err
    assert "checkpoint kept" not in err and not _stray_temporaries(out) and not (out / "checkpoint.pt").exists()


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedgan: error: ") and "Traceback" not in err, err
    return lines[0]


def test_a_read_only_out_is_refused_in_one_line(tmp_path, capsys):
    """Item 19: a read-only --out was a traceback (simulate, deploy, compare)."""
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        for command in ("simulate", "deploy", "compare"):
            argv = [command, *tiny_flags(steps=2, out=tmp_path / "ro" / "run")]
            if command == "deploy":
                argv = [command, "--local", *(a for a in argv[1:] if a not in ("--transport", "inprocess"))]
            assert main(argv) == 2, command
            line = _one_line_error(capsys.readouterr().err)
            assert f"cannot write to {tmp_path / 'ro'}" in line and "writable --out" in line, line


def test_resume_and_evaluate_on_a_read_only_mount_are_refused_in_one_line(tmp_path, capsys):
    """Item 19: both died with a traceback (resume at the lock file, evaluate after all its work)."""
    out = _finished_run(tmp_path)
    capsys.readouterr()
    with read_only(tmp_path):
        assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert f"cannot write to {out}" in line and "copy it somewhere writable" in line, line
        assert main(["evaluate", str(out), "--no-inception", "--num-samples", "50"]) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert f"cannot write to {out}" in line and "evaluate writes eval.json" in line, line


def test_compare_into_an_existing_directory_is_refused_before_any_training(tmp_path, capsys):
    """Item 19: `compare --out` an existing directory trained nothing and raised FileExistsError."""
    out = tmp_path / "cmp"
    (out / "gswgan").mkdir(parents=True)
    assert main(["compare", *tiny_flags(steps=2, out=out)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"--out {out} already exists" in line, line
    assert [p.name for p in out.iterdir()] == ["gswgan"]
