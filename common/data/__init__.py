"""Data layer: readers of the real formats, the embedded synthetic writers, partitioners, and what
one client holds for a given configuration (``common/run_options.py``'s ``RunOptions``).

Everything here works on uint8 ``[N, 28, 28]`` images (ink high, background 0) and int64 labels;
only :func:`load_client_partition` converts to float tensors for training. No Flower import.
"""

from common.data.clients import (
    ClientData,
    check_partition_sizes,
    class_balance,
    clear_cache,
    client_arrays,
    client_data_from_arrays,
    client_labels,
    load_client_partition,
    num_classes_for,
    partition_key,
    partition_sizes,
)
from common.data.dataset import Dataset
from common.data.errors import DataError, PartitionError
from common.data.loading import (
    DATASET_NAMES,
    data_root,
    dataset_num_classes,
    download_dir,
    load_dataset,
    resolve_data_dir,
)
from common.data.partition import (
    apply_inversion,
    invert_clients,
    partition_by_writer,
    partition_dirichlet,
    partition_iid,
    partition_shards,
)
from common.data.synthetic import synthetic_dataset, synthetic_writer

__all__ = [
    "DATASET_NAMES",
    "ClientData",
    "DataError",
    "Dataset",
    "PartitionError",
    "apply_inversion",
    "check_partition_sizes",
    "class_balance",
    "clear_cache",
    "client_arrays",
    "client_data_from_arrays",
    "client_labels",
    "data_root",
    "dataset_num_classes",
    "download_dir",
    "invert_clients",
    "load_client_partition",
    "load_dataset",
    "num_classes_for",
    "partition_by_writer",
    "partition_dirichlet",
    "partition_key",
    "partition_iid",
    "partition_shards",
    "partition_sizes",
    "resolve_data_dir",
    "synthetic_dataset",
    "synthetic_writer",
]
