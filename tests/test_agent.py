"""The rollout's `act()` is a faster path to what `get_action_and_value()` computes: same actions
(for the same RNG state in the discrete case), same log-probabilities and values."""

import torch

import ppo
import ppo_continuous_action


def test_discrete_act_draws_what_categorical_sample_draws():
    agent = ppo.Agent(obs_dim=5, n_actions=4)
    with torch.no_grad():  # a larger last layer than the init's, so the policy is far from uniform
        agent.actor[-1].weight.mul_(300)
    x = torch.randn(256, 5)
    torch.manual_seed(0)
    action, logprob, value = agent.act(x)
    torch.manual_seed(0)
    with torch.no_grad():
        ref_action, ref_logprob, _, ref_value = agent.get_action_and_value(x)
    assert torch.equal(action, ref_action)
    torch.testing.assert_close(logprob, ref_logprob)
    torch.testing.assert_close(value, ref_value)
    assert len(action.unique()) > 1


def test_continuous_act_logprob_is_the_gaussian_density_of_its_action():
    agent = ppo_continuous_action.Agent(obs_dim=5, act_dim=3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-1.0, 0.0, 0.5]]))
    x = torch.randn(256, 5)
    action, logprob, value = agent.act(x)
    with torch.no_grad():
        _, ref_logprob, _, ref_value = agent.get_action_and_value(x, action)
    torch.testing.assert_close(logprob, ref_logprob)
    torch.testing.assert_close(value, ref_value)
    # the noise has the policy's standard deviation in each dimension
    with torch.no_grad():
        spread = (action - agent.actor_mean(x)).std(0)
    torch.testing.assert_close(spread, agent.actor_logstd.exp()[0].detach(), atol=0.15, rtol=0.15)
