"""PPO-Penalty beside PPO-Clip (--policy-objective clip / adaptive-kl / fixed-kl, --kl-target, --kl-beta; section 4 of
the PPO paper, Schulman et al. 2017), in every script: each objective's loss and gradient against values worked out
by hand on a batch of two samples, the adaptive beta's rule, the flags' checks, and runs that log, save and resume
their beta as an uninterrupted run does. (The CPU fast path computes the penalty exactly: test_fast_path.py.)"""

import math

import pytest
import torch

from helpers import make_args, read_scalars

# The batch: log-ratios 0.1 and -0.2 (ratios e^0.1 = 1.1051709 and e^-0.2 = 0.8187308), advantages 1 and -2.
#   the unclipped surrogate, mean(-A * ratio):          (-1.1051709 + 2 * 0.8187308) / 2 = 0.2661453
#   the KL estimate, mean((ratio - 1) - log-ratio):   (0.0051709 + 0.0187308) / 2     = 0.0119508
#   PPO-Penalty with beta 0.5:                          0.2661453 + 0.5 * 0.0119508     = 0.2721207
#   PPO-Clip with clip_coef 0.05: the ratios clipped to 1.05 and 0.95, each term the larger of the two:
#                                                       (max(-1.1052, -1.05) + max(1.6375, 1.9)) / 2 = 0.425
# The gradient of PPO-Penalty's loss with respect to each new log-prob, (-A * ratio + beta * (ratio - 1)) / n:
#   (-1.1051709 + 0.5 * 0.1051709) / 2 = -0.5262927,   (1.6374615 + 0.5 * -0.1812692) / 2 = 0.7734134
SURROGATE, KL, PENALISED, CLIPPED = 0.2661453, 0.0119508, 0.2721207, 0.425
PENALTY_GRADIENT = [-0.5262927, 0.7734134]


def loss_of(script, objective: str, **fields) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """The policy loss alone (no value loss, no entropy) of the batch above, its statistics, and its gradient
    with respect to the new log-probs."""
    newlogprob = torch.tensor([0.1, -0.2], dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros(2, dtype=torch.float64)
    args = script.Args(policy_objective=objective, ent_coef=0.0, vf_coef=0.0, **fields)
    loss, stats = script.ppo_loss(
        newlogprob=newlogprob,
        entropy=zeros,
        newvalue=zeros,
        oldlogprob=zeros,
        advantages=torch.tensor([1.0, -2.0], dtype=torch.float64),
        returns=zeros,
        oldvalues=zeros,
        args=args,
        kl_beta=torch.tensor(0.5, dtype=torch.float64),
    )
    loss.backward()
    return loss, stats, newlogprob.grad


@pytest.mark.parametrize("objective", ["adaptive-kl", "fixed-kl"])
def test_the_penalty_objective_is_the_surrogate_plus_beta_times_the_kl(every_script, objective):
    loss, stats, gradient = loss_of(every_script, objective)
    assert loss.item() == pytest.approx(PENALISED, abs=1e-6)
    assert stats["policy_loss"].item() == pytest.approx(PENALISED, abs=1e-6)
    assert stats["approx_kl"].item() == pytest.approx(KL, abs=1e-6)
    assert gradient.tolist() == pytest.approx(PENALTY_GRADIENT, abs=1e-6)


def test_the_clip_objective_clips_and_has_no_penalty(every_script):
    loss, stats, gradient = loss_of(every_script, "clip", clip_coef=0.05)
    assert loss.item() == pytest.approx(CLIPPED, abs=1e-6)
    assert stats["approx_kl"].item() == pytest.approx(KL, abs=1e-6)  # measured all the same
    assert stats["clipfrac"].item() == 1.0
    assert gradient.tolist() == [0.0, 0.0]  # both ratios clipped: no gradient through the policy
    # and with a clip range wide enough to clip nothing, the surrogate alone: beta is not in the loss
    assert loss_of(every_script, "clip", clip_coef=0.5)[0].item() == pytest.approx(SURROGATE, abs=1e-6)


# THE ADAPTIVE BETA -------------------------------------------------------------------------------

# kls of an update of 2 epochs of 2 minibatches, the update's KL d (the mean of the last epoch's two), and what
# beta (1.0 before) becomes with kl_target 0.01: halved below 0.01 / 1.5, doubled above 0.015, else kept
RULE = [
    ([0.004, 0.006, 0.003, 0.004], 0.5),  # d = 0.0035
    ([0.004, 0.006, 0.007, 0.007], 1.0),  # d = 0.007, just above 0.00667
    ([0.004, 0.006, 0.014, 0.0159], 1.0),  # d = 0.01495, just below 0.015
    ([0.004, 0.006, 0.015, 0.016], 2.0),  # d = 0.0155
    ([0.05, 0.05, 0.001, 0.001], 0.5),  # the last epoch's KL counts, not the update's mean (0.0255 would double)
]


@pytest.mark.parametrize("kls, after", RULE)
def test_the_adaptive_beta_halves_or_doubles_once_per_update_on_the_last_epochs_kl(every_script, kls, after):
    args = every_script.Args(policy_objective="adaptive-kl", kl_target=0.01, num_minibatches=2)
    beta, stats = torch.tensor(1.0), {}
    every_script.adapt_kl_beta(beta, [torch.tensor(kl) for kl in kls], args, stats)
    assert beta.item() == after
    assert stats["kl_beta"].item() == 1.0  # the beta this update trained with is logged


@pytest.mark.parametrize("objective", ["clip", "fixed-kl"])
def test_the_other_objectives_keep_beta(every_script, objective):
    args = every_script.Args(policy_objective=objective, num_minibatches=2)
    beta, stats = torch.tensor(1.0), {}
    every_script.adapt_kl_beta(beta, [torch.tensor(0.5)] * 4, args, stats)
    assert beta.item() == 1.0
    assert ("kl_beta" in stats) == (objective == "fixed-kl")  # no beta to log where there is no penalty


# THE FLAGS ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, said",
    [
        (dict(kl_target=0.0), "--kl-target must be positive"),
        (dict(kl_beta=-1.0), "--kl-beta must be zero or positive"),
        (dict(policy_objective="adaptive-kl", kl_beta=0.0), "--kl-beta must be positive with --policy-objective"),
    ],
)
def test_bad_penalty_settings_are_refused_in_one_line(every_script, fields, said, capsys):
    import ppolab

    args = every_script.Args(**fields)
    with pytest.raises(SystemExit) as exit_info:
        ppolab.checks.check_numbers(args)
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err


def test_fixed_kl_with_a_zero_beta_is_the_unclipped_surrogate(capsys):
    """Beta 0 with fixed-kl is a valid setting: the PPO paper's "no clipping or penalty" row."""
    import ppo
    import ppolab

    ppolab.checks.check_numbers(ppo.Args(policy_objective="fixed-kl", kl_beta=0.0))
    assert capsys.readouterr().err == ""


# RUNS: LOGGED, SAVED, RESUMED --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action", "ppo_atari"])
def test_a_resumed_run_continues_with_the_saved_beta(name, tmp_path):
    """adaptive-kl with a target far above these runs' KL: beta halves at every update. A run stopped after
    iteration 2 and resumed logs the betas of a run that was not stopped, and its checkpoints hold them."""
    script = pytest.importorskip(name)
    options = dict(policy_objective="adaptive-kl", kl_target=10.0, kl_beta=4.0, save_model=False)
    whole = script.main(make_args(script, tmp_path / "whole", **options))
    first = make_args(script, tmp_path / "parts", **options)
    first.total_timesteps = 2 * first.batch_size
    parts = script.main(first)
    checkpoint = torch.load(f"{parts}/checkpoint.pt", weights_only=True)
    assert checkpoint["kl_beta"].item() == 1.0  # 4 halved twice
    # as `--resume` reads the command line: the checkpoint's arguments, then the flags given
    script.main(
        script.Args(
            **{**checkpoint["args"], "resume": f"{parts}/checkpoint.pt", "total_timesteps": 3 * first.batch_size}
        )
    )
    betas = [value for _, value in read_scalars(whole)["losses/kl_beta"]]
    assert betas == [4.0, 2.0, 1.0]
    assert [value for _, value in read_scalars(parts)["losses/kl_beta"]] == betas
    assert torch.load(f"{parts}/checkpoint.pt", weights_only=True)["kl_beta"].item() == 0.5
    assert math.isclose(torch.load(f"{whole}/checkpoint.pt", weights_only=True)["kl_beta"].item(), 0.5)
