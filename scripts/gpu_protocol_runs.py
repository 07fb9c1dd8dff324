"""Carry finished runs to a lent GPU for their protocol evaluation, and bring the figures back.

    python scripts/gpu_protocol_runs.py pack RUN [RUN ...]        # here: runs/carry/<name>/, slim copies
    # device run, carry [".gpu", "runs/carry"]:  PROTOCOL=dpimagebench-cpu bash scripts/gpu_run.sh evaluate
    python scripts/gpu_protocol_runs.py unpack DIR RUN [RUN ...]  # here: DIR = where evaluate.tar.gz came back

Why: ``fedgan evaluate RUN --protocol dpimagebench-cpu`` trains three classifiers per run, ~75 minutes on
2 CPU cores and minutes on a GPU, while the training of most cells fits the CPU. Why slim: the
device tool carries 64 MiB a call and the wheels take 49; the evaluation needs a run's config,
summary and released generator, not its privacy record (1.4 MB at K = 3,000), the clients' states
(~0.4 GB for GS-WGAN at K = 400) nor the optimizer's. Unpacking takes only the ``"protocol"`` figures
of the GPU's eval.json into the run's own (its quick figures, Inception FID included, stay the CPU's:
the GPU has no Inception weights)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.io.tensor_files import load_tensors, save_tensors  # noqa: E402
from server.reporting import atomic_write_json  # noqa: E402

CARRY = ROOT / "runs" / "carry"
KEEP = ("config.json", "summary.json")  # what `fedgan evaluate` reads, with the checkpoint


def pack(runs: list[Path], carry: Path = CARRY) -> list[Path]:
    """A slim copy of each run in ``carry/<run's folder name>`` (names must differ)."""
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise SystemExit(
            f"pack: two runs share a folder name ({', '.join(sorted(names))}); the carry needs distinct ones"
        )
    if carry.exists():
        shutil.rmtree(carry)
    copies = []
    for run in runs:
        ckpt = load_tensors(run / "checkpoint.pt")
        if "released_generator" not in ckpt:
            raise SystemExit(f"pack: {run / 'checkpoint.pt'} holds no released generator")
        dest = carry / run.name
        dest.mkdir(parents=True)
        for name in KEEP:
            if (run / name).is_file():
                shutil.copy2(run / name, dest / name)
        save_tensors({"released_generator": ckpt["released_generator"]}, dest / "checkpoint.pt")
        copies.append(dest)
    return copies


def unpack(back: Path, runs: list[Path]) -> dict[str, str]:
    """Each run's eval.json gains the protocol figures the GPU wrote for it; returns run name -> what
    happened. The tarball's members are read, never extracted (nothing in it can write elsewhere)."""
    with tarfile.open(back / "evaluate.tar.gz") as tar:
        files = {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    outcome = {}
    for run in runs:
        log = files.get(f"{run.name}.log")
        if log is not None:
            (run / "protocol-gpu.log").write_bytes(log)
        got = files.get(f"{run.name}.eval.json")
        protocol = json.loads(got).get("protocol") if got is not None else None
        if not isinstance(protocol, dict):
            outcome[run.name] = f"no protocol figures came back (see {run / 'protocol-gpu.log'})"
            continue
        local = json.loads((run / "eval.json").read_text())
        local["protocol"] = protocol
        atomic_write_json(run / "eval.json", local)
        outcome[run.name] = (
            f"{protocol['protocol']}: {protocol['mean']:.1%} ± {protocol['std']:.1%} on {protocol['device']}"
        )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="slim copies of RUNs into runs/carry/")
    p.add_argument("runs", nargs="+", type=Path)
    u = sub.add_parser("unpack", help="the GPU's protocol figures into each RUN's eval.json")
    u.add_argument("back", type=Path, help="the folder evaluate.tar.gz came back in")
    u.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    if args.verb == "pack":
        copies = pack(args.runs)
        size = sum(f.stat().st_size for c in copies for f in c.iterdir())
        print(f"gpu_protocol_runs: {len(copies)} runs in {CARRY} ({size / 2**20:.1f} MiB)")
    else:
        for name, what in unpack(args.back, args.runs).items():
            print(f"{name}: {what}")


if __name__ == "__main__":
    main()
