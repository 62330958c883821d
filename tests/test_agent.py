"""The rollout's `act()` is a faster path to what `get_action_and_value()` computes: same actions
(for the same RNG state in the discrete case) and log-probabilities (the values of these scripts come
from one `get_value` after the rollout). And the written-out
log-probability and entropy of `get_action_and_value()` are those of torch.distributions."""

import pytest
import torch
from torch.distributions import Categorical, Normal

import ppo
import ppo_continuous_action
import ppo_continuous_action_redis


def test_discrete_act_draws_what_categorical_sample_draws():
    agent = ppo.Agent(obs_dim=5, n_actions=4)
    with torch.no_grad():  # a larger last layer than the init's, so the policy is far from uniform
        agent.actor[-1].weight.mul_(300)
    x = torch.randn(256, 5)
    torch.manual_seed(0)
    action, logprob = agent.act(x)
    torch.manual_seed(0)
    with torch.no_grad():
        ref_action, ref_logprob, _, _ = agent.get_action_and_value(x)
    assert torch.equal(action, ref_action)
    torch.testing.assert_close(logprob, ref_logprob)
    assert len(action.unique()) > 1


def test_continuous_act_logprob_is_the_gaussian_density_of_its_action():
    agent = ppo_continuous_action.Agent(obs_dim=5, act_dim=3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-1.0, 0.0, 0.5]]))
    x = torch.randn(256, 5)
    action, logprob = agent.act(x)
    with torch.no_grad():
        _, ref_logprob, _, _ = agent.get_action_and_value(x, action)
    torch.testing.assert_close(logprob, ref_logprob)
    # the noise has the policy's standard deviation in each dimension
    with torch.no_grad():
        spread = (action - agent.actor_mean(x)).std(0)
    torch.testing.assert_close(spread, agent.actor_logstd.exp()[0].detach(), atol=0.15, rtol=0.15)


def test_discrete_logprob_and_entropy_are_categoricals():
    torch.manual_seed(0)
    agent = ppo.Agent(obs_dim=5, n_actions=4)
    with torch.no_grad():  # far from uniform, so a wrong entropy or a wrong entry shows
        agent.actor[-1].weight.mul_(1000)
    x, action = torch.randn(256, 5), torch.randint(0, 4, (256,))
    with torch.no_grad():
        _, logprob, entropy, _ = agent.get_action_and_value(x, action)
        dist = Categorical(logits=agent.actor(x))
    torch.testing.assert_close(logprob, dist.log_prob(action))
    torch.testing.assert_close(entropy, dist.entropy())
    assert entropy.std() > 0.2  # states differ in their entropy


@pytest.mark.parametrize("script", [ppo_continuous_action, ppo_continuous_action_redis])
def test_continuous_logprob_and_entropy_are_normals(script):
    torch.manual_seed(0)
    agent = script.Agent(obs_dim=5, act_dim=3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-1.0, 0.0, 0.5]]))
        agent.actor_mean[-1].weight.mul_(100)
    x, action = torch.randn(256, 5), torch.randn(256, 3)
    with torch.no_grad():
        _, logprob, entropy, _ = agent.get_action_and_value(x, action)
        mean = agent.actor_mean(x)
        dist = Normal(mean, agent.actor_logstd.expand_as(mean).exp())
    torch.testing.assert_close(logprob, dist.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
