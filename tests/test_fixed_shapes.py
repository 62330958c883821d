"""Fixed-shape minibatches in the envpool scripts (ppo_atari_envpool.py, ppo_procgen.py): a minibatch keeps
envpool's reset rows with mask 0, so all minibatches have one shape (what torch.compile and CUDA graphs
want). The update must still be the one of the minibatch with the reset rows dropped, as the scripts
computed it before: same gradient, same statistics. The reference below is that earlier code."""

import copy

import pytest
import torch
import torch.nn as nn

import ppo
import ppo_atari_envpool
import ppo_procgen

SCRIPTS = {ppo_atari_envpool: (4, 84, 84), ppo_procgen: (3, 64, 64)}  # script -> one observation's shape
N_ACTIONS, ROWS = 5, 12
BETA = torch.tensor(1.0)  # PPO-Penalty's beta, which update_step takes (unused by the default clip objective)
RESET_ROWS = [1, 6, 7, 11]  # where the mask is 0


def minibatch(obs_shape: tuple, agent: nn.Module) -> dict[str, torch.Tensor]:
    """A minibatch whose reset rows differ from the real ones everywhere (observations, advantages far
    from the others' mean, returns), so any place where they leak into a mean changes the numbers."""
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (ROWS,) + obs_shape, dtype=torch.uint8, generator=g)
    actions = torch.randint(0, N_ACTIONS, (ROWS,), generator=g)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    mask = torch.ones(ROWS)
    mask[RESET_ROWS] = 0.0
    advantages = torch.randn(ROWS, generator=g) + 8.0 * (1 - mask)
    return {
        "obs": obs,
        "actions": actions,
        "logprobs": logprobs + 0.3 * torch.randn(ROWS, generator=g),  # ratios away from 1: some are clipped
        "advantages": advantages,
        "returns": values + torch.randn(ROWS, generator=g) + 5.0 * (1 - mask),
        "values": values + 0.2 * torch.randn(ROWS, generator=g),
        "mask": mask,
    }


@pytest.mark.parametrize("clip_vloss", [True, False])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.__name__)
def test_masked_fixed_shape_minibatch_gives_the_gradient_of_the_dropped_rows(script, clip_vloss):
    torch.manual_seed(0)
    args = script.Args(clip_vloss=clip_vloss, max_grad_norm=1e9)  # no clipping: the raw gradients compare
    masked_agent = script.Agent(N_ACTIONS)
    dropped_agent = copy.deepcopy(masked_agent)
    batch = minibatch(SCRIPTS[script], masked_agent)
    real = batch["mask"].bool()

    # lr 0: the optimizer step leaves the weights, the gradients stay in .grad to compare
    stats = script.update_step(
        masked_agent, torch.optim.SGD(masked_agent.parameters(), lr=0.0), args, kl_beta=BETA, **batch
    )
    # the update as the scripts made it before fixed shapes: ppo.py's plain update_step, on the real rows only
    reference = ppo.update_step(
        dropped_agent,
        torch.optim.SGD(dropped_agent.parameters(), lr=0.0),
        args,
        BETA,
        **{k: v[real] for k, v in batch.items() if k != "mask"},
    )

    assert stats.keys() == reference.keys()
    for name in stats:
        torch.testing.assert_close(stats[name], reference[name], rtol=1e-5, atol=1e-6, msg=name)
    assert 0 < float(stats["clipfrac"]) < 1  # the clipped branch is exercised
    for (name, p), q in zip(masked_agent.named_parameters(), dropped_agent.parameters()):
        assert p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.__name__)
def test_reset_rows_change_nothing_in_the_update(script):
    # whatever the reset rows hold, the update is the same: a second minibatch with other reset rows
    torch.manual_seed(0)
    args = script.Args(max_grad_norm=0.5)
    agents = [script.Agent(N_ACTIONS)]
    agents.append(copy.deepcopy(agents[0]))
    batch = minibatch(SCRIPTS[script], agents[0])
    other = {k: v.clone() for k, v in batch.items()}
    reset = torch.tensor(RESET_ROWS)
    other["obs"][reset] = 255 - other["obs"][reset]
    other["advantages"][reset] = -100.0
    other["returns"][reset] = 50.0
    other["logprobs"][reset] = -20.0  # a ratio of e^20 there, if it counted
    results = []
    for agent, b in zip(agents, (batch, other)):
        optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
        results.append(script.update_step(agent, optimizer, args, kl_beta=BETA, **b))
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], msg=name)
    for p, q in zip(agents[0].parameters(), agents[1].parameters()):
        torch.testing.assert_close(p, q)
