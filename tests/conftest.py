import os

import torch

# Two cores on CI: keep each test process from oversubscribing them.
torch.set_num_threads(2)
os.environ.setdefault("FEDGAN_CLIENT_THREADS", "2")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
