"""Downloads against a loopback HTTP server serving tiny files in the official formats."""

from __future__ import annotations

import functools
import hashlib
import http.server
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from common.data import DataError, clear_cache, load_dataset
from common.data.download import SOURCES, describe, download
from common.data.formats import mnist_filenames
from common.data.testing import write_emnist, write_mnist_like, write_tff_h5
from common.methods import ExperimentConfig


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture
def server(tmp_path: Path):
    """(served folder, base URL, request log) of an HTTP server on 127.0.0.1 in a thread."""
    served = tmp_path / "served"
    served.mkdir()
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}/", handler.requests
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _serve_mnist(served: Path) -> dict[str, str]:
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 5)):
        write_mnist_like(served, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), np.arange(n) % 10, split)
    return {p.name: _sha256(p) for p in served.iterdir()}


def test_download_verifies_and_files_load(server, tmp_path: Path) -> None:
    served, url, requests = server
    checksums = _serve_mnist(served)
    paths = download("mnist", tmp_path / "data", base_url=url, checksums=checksums, progress=False)
    assert sorted(p.name for p in paths) == sorted(checksums)
    assert {p.parent for p in paths} == {tmp_path / "data" / "mnist"}  # under the root, where loaders look
    assert all(_sha256(p) == checksums[p.name] for p in paths)
    assert len(load_dataset("mnist", str(tmp_path / "data"))) == 12
    assert not list((tmp_path / "data" / "mnist").glob(".*"))  # no temporary files left
    requests.clear()
    download("mnist", tmp_path / "data", base_url=url, checksums=checksums, progress=False)
    assert requests == []  # verified files already present are not fetched again


def test_checksum_mismatch_deletes_partial_file(server, tmp_path: Path) -> None:
    served, url, _ = server
    checksums = _serve_mnist(served)
    checksums["train-labels-idx1-ubyte.gz"] = "0" * 64
    dest = tmp_path / "mnist"
    with pytest.raises(DataError, match="checksum mismatch .*train-labels-idx1-ubyte.gz") as err:
        download("mnist", tmp_path, base_url=url, checksums=checksums, progress=False)
    assert "deleted" in str(err.value)
    assert not (dest / "train-labels-idx1-ubyte.gz").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["train-images-idx3-ubyte.gz"]  # verified before the failure


def test_official_table_rejects_fake_files(server, tmp_path: Path) -> None:
    """Without injected checksums the real table is used, and tiny fakes do not match it."""
    served, url, _ = server
    _serve_mnist(served)
    with pytest.raises(DataError, match="sha256"):
        download("mnist", tmp_path, base_url=url, progress=False)
    assert list((tmp_path / "mnist").iterdir()) == []


def test_emnist_zip_is_unpacked(server, tmp_path: Path) -> None:
    served, url, _ = server
    upright = np.zeros((3, 28, 28), np.uint8)
    upright[:, 0, :] = 255  # top row: asymmetric, so a missing un-transpose would show
    members = tmp_path / "members"
    for split in ("byclass", "bymerge", "balanced", "letters", "digits", "mnist"):
        for part in ("train", "test"):
            write_emnist(members, split, upright, np.array([1, 2, 3]), split=part)
    with zipfile.ZipFile(served / "gzip.zip", "w") as zf:
        for path in members.iterdir():
            zf.write(path, f"gzip/{path.name}")  # NIST's zip keeps them in a gzip/ folder
    checksums = {"gzip.zip": _sha256(served / "gzip.zip")}
    paths = download("emnist", tmp_path / "data", base_url=url, checksums=checksums, progress=False)
    assert len(paths) == 24 and not (tmp_path / "data" / "emnist" / "gzip.zip").exists()
    dataset = load_dataset("emnist", str(tmp_path / "data"), emnist_split="digits")
    np.testing.assert_array_equal(dataset.images, upright)


def test_femnist_tarballs_are_unpacked(server, tmp_path: Path) -> None:
    served, url, _ = server
    checksums = {}
    for archive, stem in (
        ("fed_emnist_digitsonly.tar.bz2", "fed_emnist_digitsonly"),
        ("fed_emnist.tar.bz2", "fed_emnist"),
    ):
        with tarfile.open(served / archive, "w:bz2") as tf:
            for split in ("train", "test"):
                h5 = write_tff_h5(
                    tmp_path / "h5" / f"{stem}_{split}.h5", {"f0000_14": (np.full((2, 28, 28), 255), [3, 4])}
                )
                tf.add(h5, f"datasets/{h5.name}")
        checksums[archive] = _sha256(served / archive)
    paths = download("femnist", tmp_path / "data", base_url=url, checksums=checksums, progress=False)
    assert sorted(p.name for p in paths) == sorted(
        f"{stem}_{split}.h5" for stem in ("fed_emnist", "fed_emnist_digitsonly") for split in ("train", "test")
    )
    dataset = load_dataset("femnist", str(tmp_path / "data"))
    assert list(dataset.labels) == [3, 4] and dataset.images.min() == 255  # TFF 0.0 pixels are full ink


def test_corrupt_archive_and_unreachable_host(server, tmp_path: Path) -> None:
    served, url, _ = server
    (served / "gzip.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="corrupt archive|lacks"):
        download("emnist", tmp_path / "e", base_url=url, checksums={"gzip.zip": None}, progress=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    with pytest.raises(DataError, match="could not download .* save it as"):
        download("mnist", tmp_path / "m", base_url=closed, timeout_s=2, progress=False)


def test_progress_goes_to_stderr(server, tmp_path: Path, capsys) -> None:
    served, url, _ = server
    checksums = _serve_mnist(served)
    download("mnist", tmp_path / "m", base_url=url, checksums=checksums, progress=True)
    captured = capsys.readouterr()
    assert "train-images-idx3-ubyte.gz" in captured.err and captured.out == ""


def test_table_has_no_invented_hashes() -> None:
    for source in SOURCES.values():
        for remote in source.files:
            assert remote.sha256 is None or len(remote.sha256) == 64
            assert remote.sha256 is not None or remote.md5 is not None or remote.members
    assert download("synthetic", "/nonexistent") == []


def test_describe_lists_files_and_partition(tmp_path: Path) -> None:
    clear_cache()
    write_mnist_like(tmp_path / "mnist", np.zeros((40, 28, 28), np.uint8), np.arange(40) % 10)
    text = describe(
        str(tmp_path),
        ExperimentConfig(dataset="mnist", data_dir=str(tmp_path), partition="iid", num_clients=4, batch_size=16),
    )
    assert mnist_filenames("train")[0] in text and "fedgan data download emnist" in text
    assert "min 10, median 10, max 10, total 40" in text and "TOO SMALL" in text
    assert "0:10.0%" in text
    broken = describe(ExperimentConfig(dataset="emnist", data_dir=str(tmp_path), partition="iid"))
    assert str(tmp_path / "mnist") in broken  # a config alone: its data_dir is described
    assert "unavailable: missing data file" in broken
