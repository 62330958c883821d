"""Running statistics of a stream of batches: what observation normalisation and reward scaling divide by."""

import numpy as np
import torch


class RunningMeanStd:
    """Running mean and variance of a stream of batches (the parallel algorithm of Chan et al.)."""

    def __init__(self, shape: tuple = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray):
        """Adds a batch x of shape (B,) + shape. It runs at every environment step, so it avoids
        np.mean/np.var, whose Python-level overhead is most of the cost on a handful of numbers, and
        skips the batch's own spread where the batch is one sample (one environment's step)."""
        n = x.shape[0]
        batch_mean = np.add.reduce(x, axis=0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * (n / total)
        # the summed squared deviations from the mean: the old ones, the batch's own, and the shift's
        squares = self.var * self.count + np.square(delta) * (self.count * n / total)
        if n > 1:
            squares += np.add.reduce(np.square(x - batch_mean), axis=0)
        self.var = squares / total
        self.count = total

    def state_dict(self) -> dict:
        """The statistics as data (tensors and a number), as a checkpoint holds them."""
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": self.count}  # copies

    def load_state_dict(self, state: dict):
        self.mean, self.var = state["mean"].numpy().copy(), state["var"].numpy().copy()
        self.count = float(state["count"])
