"""Explicit, verified downloads of the real data sets, and ``fedgan data info``'s description.

Downloading is never implicit (a training run only reads), because clients may run where there
is no network and a half-written file must never be mistaken for data. Each file is streamed to a
temporary name in the destination folder, hashed while it arrives, checked against the table
below, and only then renamed into place (atomic on one file system). Archives (NIST's EMNIST zip,
TFF's FEMNIST tarballs) are unpacked member by member the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

import numpy as np

from common.data.clients import client_labels, num_classes_for, partition_sizes
from common.data.errors import DataError
from common.data.loading import DATASET_NAMES, data_root, resolve_data_dir

if TYPE_CHECKING:
    from common.run_options import RunOptions

__all__ = ["SOURCES", "RemoteFile", "Source", "describe", "download"]

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file on the server; ``members`` are the files to unpack when it is an archive."""

    name: str
    sha256: str | None
    md5: str | None = None
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    base_url: str
    files: tuple[RemoteFile, ...]


_EMNIST_MEMBERS = tuple(
    f"emnist-{split}-{part}-{kind}-ubyte.gz"
    for split in ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
    for part in ("train", "test")
    for kind in ("images-idx3", "labels-idx1")
)

# Checksums of the official files. SHA-256 where a published value is known (MNIST and
# Fashion-MNIST: torchvision's dataset definitions; FEMNIST: TFF's emnist.load_data). MD5 where only
# that is published (MNIST, Fashion-MNIST, EMNIST: torchvision). NIST's EMNIST gzip.zip has no
# published SHA-256 that we could confirm, so its sha256 is None: it is checked by its MD5, and
# the extracted files are verified structurally by the IDX reader (magic numbers, sizes) on load.
# Checksums guard downloads only; readers never check them (Debian's dataset-fashion-mnist ships
# recompressed .gz files whose hashes differ from the upstream ones).
SOURCES: dict[str, Source] = {
    "mnist": Source(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        (
            RemoteFile(
                "train-images-idx3-ubyte.gz",
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
                "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            ),
            RemoteFile(
                "train-labels-idx1-ubyte.gz",
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
                "d53e105ee54ea40749a09fcbcd1e9432",
            ),
            RemoteFile(
                "t10k-images-idx3-ubyte.gz",
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                "9fb629c4189551a2d022fa330f9573f3",
            ),
            RemoteFile(
                "t10k-labels-idx1-ubyte.gz",
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
                "ec29112dd5afa0611ce80d1b7f02629c",
            ),
        ),
    ),
    "fashion-mnist": Source(
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        (
            RemoteFile(
                "train-images-idx3-ubyte.gz",
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
                "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            ),
            RemoteFile(
                "train-labels-idx1-ubyte.gz",
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
                "25c81989df183df01b3e8a0aad5dffbe",
            ),
            RemoteFile(
                "t10k-images-idx3-ubyte.gz",
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
                "bef4ecab320f06d8554ea6380940ec79",
            ),
            RemoteFile(
                "t10k-labels-idx1-ubyte.gz",
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
                "bb300cfdad3c16e7a12a480ee83cd310",
            ),
        ),
    ),
    "emnist": Source(
        "https://biometrics.nist.gov/cs_links/EMNIST/",
        (RemoteFile("gzip.zip", None, "58c8d27c78d21e728a6bc7b3cc06412e", _EMNIST_MEMBERS),),
    ),
    "femnist": Source(
        "https://storage.googleapis.com/tff-datasets-public/",
        (
            RemoteFile(
                "fed_emnist_digitsonly.tar.bz2",
                "55333deb8546765427c385710ca5e7301e16f4ed8b60c1dc5ae224b42bd5b14b",
                members=("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5"),
            ),
            RemoteFile(
                "fed_emnist.tar.bz2",
                "fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0",
                members=("fed_emnist_train.h5", "fed_emnist_test.h5"),
            ),
        ),
    ),
}


# --- download -------------------------------------------------------------------------------------


def download(
    name: str,
    dest_dir: str | Path,
    *,
    base_url: str | None = None,
    timeout_s: float = 60,
    progress: bool = True,
    checksums: Mapping[str, str | None] | None = None,
    keep_archives: bool = False,
) -> list[Path]:
    """Fetch data set ``name`` into ``<dest_dir>/<name>/``, where the loaders look for it.

    ``dest_dir`` is the data root (``--data-dir``, ``$FEDGAN_DATA`` or ``./data``). ``base_url``
    replaces the official host (a mirror, or a loopback server in tests); ``checksums`` maps file
    names to SHA-256 values that replace the table's (and its MD5). Files already present and
    matching their checksum are not fetched again. Returns the data files now on disk.
    """
    if name == "synthetic":
        return []  # generated in code
    if name not in SOURCES:
        raise ValueError(f"nothing to download for {name!r}: choose one of {sorted(SOURCES)}")
    source, dest = SOURCES[name], Path(dest_dir).expanduser() / name
    dest.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for remote in source.files:
        if checksums is not None and remote.name in checksums:  # an injected checksum replaces both
            remote = RemoteFile(remote.name, checksums[remote.name], None, remote.members)
        url = (base_url or source.base_url).rstrip("/") + "/" + remote.name
        paths += _fetch_one(remote, url, dest, timeout_s=timeout_s, progress=progress, keep_archive=keep_archives)
    return paths


def _fetch_one(
    spec: RemoteFile, url: str, dest: Path, *, timeout_s: float, progress: bool, keep_archive: bool
) -> list[Path]:
    """One remote file: skip when already there, else download, verify and unpack."""
    if spec.members and all((dest / m).is_file() for m in spec.members):
        return [dest / m for m in spec.members]
    path = dest / spec.name
    if not (path.is_file() and _matches(path, spec)):
        _download_verified(url, path, spec, timeout_s=timeout_s, progress=progress)
    if not spec.members:
        return [path]
    extracted = _unpack(path, spec.members, dest)
    if not keep_archive:
        path.unlink()
    return extracted


def _matches(path: Path, spec: RemoteFile) -> bool:
    """Whether an existing file has the expected checksum (True when none is known)."""
    with path.open("rb") as stream:
        digests = _hash_stream(iter(lambda: stream.read(_CHUNK_BYTES), b""))
    return _mismatch(digests, spec) is None


def _hash_stream(chunks: Iterator[bytes], sink: IO[bytes] | None = None) -> dict[str, str]:
    """SHA-256 and MD5 of a stream of chunks, optionally copying them to ``sink``."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    for chunk in chunks:
        sha.update(chunk)
        md5.update(chunk)
        if sink is not None:
            sink.write(chunk)
    return {"sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def _mismatch(digests: Mapping[str, str], spec: RemoteFile) -> str | None:
    """A description of the first checksum that differs, or None when all known ones agree."""
    for algorithm, expected in (("sha256", spec.sha256), ("md5", spec.md5)):
        if expected is not None and digests[algorithm] != expected.lower():
            return f"{algorithm} {digests[algorithm]}, expected {expected}"
    return None


def _download_verified(url: str, path: Path, spec: RemoteFile, *, timeout_s: float, progress: bool) -> None:
    """Stream ``url`` to a temporary file next to ``path``; rename it into place only if verified."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as sink, _open_url(url, path, timeout_s) as response:
            total = int(response.headers.get("Content-Length") or 0)
            chunks = _reported(iter(lambda: response.read(_CHUNK_BYTES), b""), spec.name, total, progress)
            digests = _hash_stream(chunks, sink)
        problem = _mismatch(digests, spec)
        if problem:
            raise DataError(
                f"checksum mismatch for {url}: got {problem}; the partial file was deleted. "
                f"Retry later or from another mirror (base_url), and do not use the file"
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _open_url(url: str, path: Path, timeout_s: float):
    try:
        return urllib.request.urlopen(url, timeout=timeout_s)  # noqa: S310 - fixed https hosts or a caller's mirror
    except (urllib.error.URLError, OSError) as err:
        raise DataError(
            f"could not download {url} ({err}): check the network, or fetch the file by hand and save it as {path}"
        ) from err


def _reported(chunks: Iterator[bytes], name: str, total: int, progress: bool) -> Iterator[bytes]:
    """Pass chunks through, printing a progress line on stderr when asked."""
    done = 0
    for chunk in chunks:
        done += len(chunk)
        if progress:
            of = f" / {total / 1e6:.1f}" if total else ""
            print(f"\r{name}: {done / 1e6:.1f}{of} MB", end="", file=sys.stderr, flush=True)
        yield chunk
    if progress:
        print(file=sys.stderr, flush=True)


def _unpack(archive: Path, members: tuple[str, ...], dest: Path) -> list[Path]:
    """Extract the named members (by base name, ignoring folders inside the archive) atomically."""
    wanted = set(members)
    try:
        for base, stream in _archive_members(archive):
            if base in wanted:
                _write_atomic(stream, dest / base)
                wanted.discard(base)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as err:
        raise DataError(f"corrupt archive {archive} ({err}): delete it and download again") from err
    if wanted:
        raise DataError(f"archive {archive} lacks {sorted(wanted)}: it is not the expected file")
    return [dest / m for m in members]


def _archive_members(archive: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """(base name, readable stream) of every regular file in a zip or tar archive."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    with zf.open(info) as stream:
                        yield PurePosixPath(info.filename).name, stream
        return
    with tarfile.open(archive, "r:*") as tf:
        for member in tf:
            stream = tf.extractfile(member) if member.isfile() else None
            if stream is not None:
                yield PurePosixPath(member.name).name, stream


def _write_atomic(stream: IO[bytes], path: Path) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as sink:
            shutil.copyfileobj(stream, sink, _CHUNK_BYTES)
        os.replace(tmp_name, path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)


# --- description ----------------------------------------------------------------------------------


def describe(target: str | RunOptions = "", cfg: RunOptions | None = None) -> str:
    """What ``fedgan data info`` prints: the data sets found, and for a config its partition.

    ``target`` is a data dir, or a config whose ``data_dir`` is used and whose partition is described.
    """
    from common.run_options import RunOptions

    if isinstance(target, RunOptions):
        target, cfg = target.data_dir, target
    data_dir = target
    lines = [f"data root: {data_root(data_dir).resolve()}"]
    for name in DATASET_NAMES:
        if name == "synthetic":
            lines.append("synthetic: generated in code, nothing to download")
            continue
        lines += _describe_folder(name, resolve_data_dir(name, data_dir))
    if cfg is not None:
        lines += _describe_config(cfg)
    return "\n".join(lines)


def _describe_folder(name: str, folder: Path) -> list[str]:
    files = sorted(p for p in folder.glob("*") if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []
    if not files:
        return [f"{name}: not found in {folder} (run `fedgan data download {name}`)"]
    return [f"{name}: {folder}"] + [f"  {p.name:44s} {p.stat().st_size / 1e6:10.2f} MB" for p in files]


def _describe_config(cfg: RunOptions) -> list[str]:
    """Partition sizes and class balance of ``cfg``, or why they cannot be computed."""
    head = f"config: dataset={cfg.dataset} partition={cfg.partition} num_clients={cfg.num_clients}"
    try:
        sizes = partition_sizes(cfg)
        # Bounded: the labels of a huge federation are not needed to summarise it.
        shown = min(cfg.num_clients, 200)
        per_client = [client_labels(cfg, k) for k in range(shown)]
    except (DataError, ValueError) as err:
        return [head, f"  unavailable: {err}"]
    counts = np.stack([np.bincount(y, minlength=num_classes_for(cfg)) for y in per_client])
    balance = counts.sum(0) / max(counts.sum(), 1)
    present = (counts > 0).sum(1)
    fits = "ok" if min(sizes) >= cfg.batch_size else "TOO SMALL"
    return [
        head,
        f"  images per client: {_spread(sizes)}, total {sum(sizes)}",
        f"  smallest partition vs batch_size={cfg.batch_size}: {fits}",
        f"  classes per client (first {shown}): {_spread(present)}",
        "  class balance: " + " ".join(f"{c}:{100 * b:.1f}%" for c, b in enumerate(balance)),
    ]


def _spread(values) -> str:
    return f"min {min(values)}, median {int(np.median(values))}, max {max(values)}"
