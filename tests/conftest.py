"""Shared test settings."""

import torch

# Tiny test models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP threads that wait
# for each other can make a millisecond op take seconds.
torch.set_num_threads(1)
