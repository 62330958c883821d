"""The speed study's ceiling for the envpool Atari script (benchmark.studies.speed ceiling): the bounds' arithmetic
and the FLOPs it counts."""

import pytest
import torch

from benchmark.studies.speed import ceiling_bounds, counted_flops


def test_the_bounds_spread_the_iterations_cpu_time_over_the_cores():
    # 1,000 steps: 1 s of environment (no products) and 3 s of network holding 60 GFLOP, on 2 cores
    pieces = {"environment": (1.0, 0), "network": (3.0, 60e9)}
    bounds = ceiling_bounds(1_000, pieces, peak=30e9, cores=2)
    assert bounds["practical"] == pytest.approx(2_000 / 4.0)  # every piece at its measured time
    assert bounds["flops"] == pytest.approx(2_000 / (1.0 + 2.0))  # 60 GFLOP at 30 GFLOP/s, the environment as is


def test_the_flops_of_a_forward_and_backward_pass_are_counted():
    layer = torch.nn.Linear(10, 20)
    x = torch.randn(5, 10)
    assert counted_flops(lambda: layer(x)) == 2 * 5 * 10 * 20
    # forward, then backward: the weight's gradient as many again; none for the input, which needs no gradient
    assert counted_flops(lambda: layer(x).sum().backward()) == 2 * (2 * 5 * 10 * 20)
