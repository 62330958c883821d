"""Same seed, same machine, same thread count: same numbers. The seeds, the deterministic kernels, the device."""

import random

import numpy as np
import torch


def seed_everything(seed: int, torch_deterministic: bool):
    """Seeds Python's, NumPy's and PyTorch's generators; with `torch_deterministic` cuDNN picks deterministic
    kernels and computes float32 convolutions and LSTMs in full float32, not TF32."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic
    if torch_deterministic:
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"


def pick_device(cuda: bool) -> torch.device:
    """The GPU when there is one and --cuda (the default), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() and cuda else "cpu")
