"""ppo_loss and explained_variance of every script on small inputs whose answers follow from the formulas."""

import math

import numpy as np
import pytest
import torch

from ppolab.run import explained_variance


def loss_inputs(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=g, dtype=torch.float64)
    return dict(
        newlogprob=old.clone(),
        entropy=torch.rand(n, generator=g, dtype=torch.float64) + 0.5,
        newvalue=torch.randn(n, generator=g, dtype=torch.float64),
        oldlogprob=old,
        advantages=torch.randn(n, generator=g, dtype=torch.float64),
        returns=torch.randn(n, generator=g, dtype=torch.float64),
        oldvalues=torch.randn(n, generator=g, dtype=torch.float64),
        kl_beta=torch.tensor(1.0, dtype=torch.float64),
    )


def test_ratio_one_has_zero_kl_and_clipfrac(every_script):
    x = loss_inputs()
    _, stats = every_script.ppo_loss(**x, args=every_script.Args())
    assert stats["approx_kl"].item() == 0.0
    assert stats["old_approx_kl"].item() == 0.0
    assert stats["clipfrac"].item() == 0.0
    assert stats["policy_loss"].item() == pytest.approx(-x["advantages"].mean().item(), abs=1e-12)


def test_clipfrac_counts_ratios_outside_the_range(every_script):
    x = loss_inputs(n=4)
    ratios = torch.tensor([1.0, 1.5, 0.5, 1.1], dtype=torch.float64)
    x["newlogprob"] = x["oldlogprob"] + ratios.log()
    _, stats = every_script.ppo_loss(**x, args=every_script.Args(clip_coef=0.2))
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    logratio = ratios.log()
    assert stats["old_approx_kl"].item() == pytest.approx((-logratio).mean().item())
    assert stats["approx_kl"].item() == pytest.approx(((ratios - 1) - logratio).mean().item())
    assert stats["approx_kl"].item() > 0


@pytest.mark.parametrize(
    "ratio, advantage, clipped",
    [
        (1.5, 1.0, True),  # above 1 + clip, positive advantage: no incentive to go further
        (0.5, 1.0, False),  # below the range, positive advantage: still pushed up
        (0.5, -1.0, True),  # below 1 - clip, negative advantage: no incentive to go further
        (1.5, -1.0, False),  # above the range, negative advantage: still pushed down
    ],
)
def test_policy_gradient_vanishes_only_where_clipped(every_script, ratio, advantage, clipped):
    x = loss_inputs(n=3)
    x["advantages"] = torch.full((3,), advantage, dtype=torch.float64)
    newlogprob = (x["oldlogprob"] + math.log(ratio)).requires_grad_()
    x["newlogprob"] = newlogprob
    loss, _ = every_script.ppo_loss(**x, args=every_script.Args(clip_coef=0.2))
    loss.backward()
    expected = 0.0 if clipped else -advantage * ratio / 3  # d/dlogp of -A * exp(logp - old) / n
    torch.testing.assert_close(newlogprob.grad, torch.full((3,), expected, dtype=torch.float64))


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_value_loss_on_hand_computed_numbers(every_script, clip_vloss):
    x = loss_inputs(n=2)
    x["oldvalues"] = torch.tensor([0.0, 0.0], dtype=torch.float64)
    x["newvalue"] = torch.tensor([1.0, -0.1], dtype=torch.float64)
    x["returns"] = torch.tensor([2.0, 1.0], dtype=torch.float64)
    _, stats = every_script.ppo_loss(**x, args=every_script.Args(clip_coef=0.2, clip_vloss=clip_vloss))
    # element 0: new value 1.0 moved 1.0 from 0.0, clipped to 0.2; element 1 moved only -0.1
    unclipped = [(1.0 - 2.0) ** 2, (-0.1 - 1.0) ** 2]
    clipped = [(0.2 - 2.0) ** 2, (-0.1 - 1.0) ** 2]
    if clip_vloss:
        expected = 0.5 * (max(unclipped[0], clipped[0]) + max(unclipped[1], clipped[1])) / 2
    else:
        expected = 0.5 * (unclipped[0] + unclipped[1]) / 2
    assert stats["value_loss"].item() == pytest.approx(expected, rel=1e-12)


def test_entropy_and_value_coefficients_enter_the_total_loss(every_script):
    x = loss_inputs()
    x["newlogprob"] = x["oldlogprob"] + 0.1 * torch.randn(8, dtype=torch.float64)
    base, stats = every_script.ppo_loss(**x, args=every_script.Args(ent_coef=0.0, vf_coef=0.0))
    assert base.item() == pytest.approx(stats["policy_loss"].item(), rel=1e-12)
    loss, stats = every_script.ppo_loss(**x, args=every_script.Args(ent_coef=0.3, vf_coef=0.7))
    assert stats["entropy"].item() == pytest.approx(x["entropy"].mean().item(), rel=1e-12)
    expected = stats["policy_loss"] - 0.3 * x["entropy"].mean() + 0.7 * stats["value_loss"]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert stats["value_loss"].item() > 0 and loss.item() != pytest.approx(base.item())


def test_explained_variance():
    """The package's, every single-process script's (multigpu's sums: test_ppo_atari_multigpu.py)."""
    y = np.array([1.0, 2.0, 4.0, 7.0])
    assert explained_variance(y, y) == pytest.approx(1.0)
    assert explained_variance(np.full(4, y.mean()), y) == pytest.approx(0.0)
    assert explained_variance(y[::-1].copy(), y) < 0
    assert math.isnan(explained_variance(y, np.ones(4)))
