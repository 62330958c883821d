"""--distribution beta in the continuous scripts (ppo_continuous_action.py, ppo_continuous_action_redis.py): the Beta
policy's log-prob and entropy are torch.distributions.Beta's of softplus(x) + 1, its actions are inside the bounds
by construction (in training, in evaluations and on the samplers), the deterministic evaluation takes the mean,
checkpoints say which distribution they hold, unbounded action spaces are refused in one line, and the CPU fast path
steps aside for it in one line while the Gaussian keeps it."""

import importlib
import subprocess

import numpy as np
import pytest
import torch
from torch.distributions import Beta

from helpers import load, script_command

CONTINUOUS = ["ppo_continuous_action", "ppo_continuous_action_redis"]


@pytest.fixture(params=CONTINUOUS)
def script(request):
    return importlib.import_module(request.param)


def test_the_beta_policy_is_torch_beta_of_softplus_plus_one(script):
    torch.manual_seed(0)
    agent = script.Agent(3, 2, "beta")
    with torch.no_grad():  # away from the near-uniform start, so that alpha and beta differ
        agent.actor_alpha_beta[-1].weight.normal_(0, 2.0)
    x = torch.randn(5, 3)
    action, logprob, entropy, _ = agent.get_action_and_value(x)
    concentration = torch.nn.functional.softplus(agent.actor_alpha_beta(x)) + 1
    expected = Beta(concentration[:, :2], concentration[:, 2:])
    assert concentration.min() > 1 and not torch.allclose(concentration[:, :2], concentration[:, 2:])
    torch.testing.assert_close(logprob, expected.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, expected.entropy().sum(-1))
    assert ((action >= script.BETA_EDGE) & (action <= 1 - script.BETA_EDGE)).all()
    torch.testing.assert_close(agent.mean_action(x), expected.mean)
    # the rollout's step draws from the same distribution and scores its sample the same way
    sample, sample_logprob = agent.act(x)[:2]
    torch.testing.assert_close(sample_logprob, expected.log_prob(sample).sum(-1))


def test_beta_actions_are_scaled_into_the_bounds_and_gaussian_ones_clipped(script):
    low, high = np.array([-3.0, 0.5], np.float32), np.array([-1.0, 2.0], np.float32)
    edges = np.array([[script.BETA_EDGE, 1 - script.BETA_EDGE], [0.5, 0.25]], np.float32)
    scaled = script.env_actions(edges, low, high, "beta")
    np.testing.assert_allclose(scaled, [[-3.0, 2.0], [-2.0, 0.875]], atol=1e-5)
    assert ((scaled >= low) & (scaled <= high)).all()
    np.testing.assert_array_equal(script.env_actions(np.array([[-9.0, 9.0]]), low, high, "normal"), [[-3.0, 2.0]])


def run(name: str, tmp_path, *argv) -> subprocess.CompletedProcess:
    """The script on tests.fake_envs:Bounds-v0 (an action outside its bounds raises), a few iterations."""
    sampling = ["--num-chunks", 2, "--num-samplers", 1] if name == "ppo_continuous_action_redis" else ["--num-envs", 2]
    argv = ["--env-id", "tests.fake_envs:Bounds-v0", "--num-steps", 32, "--num-minibatches", 2, *sampling, *argv]
    return subprocess.run(script_command(name, *argv), cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_a_beta_run_trains_inside_the_bounds_and_its_model_says_so(name, tmp_path):
    """Training, its evaluations (--save-model: the final one; deterministic: the mean action) and --evaluate of the
    model step BoundsEnv, which raises on an action outside its bounds."""
    done = run(
        name, tmp_path, "--distribution", "beta", "--total-timesteps", 256, "--save-model", "--eval-deterministic"
    )
    assert done.returncode == 0, done.stderr
    (model,) = tmp_path.glob("runs/*/model.pt")
    checkpoint = load(model)
    assert checkpoint["args"]["distribution"] == "beta" and "model.actor_alpha_beta.0.weight" not in checkpoint
    assert any(key.startswith("actor_alpha_beta.") for key in checkpoint["model"])
    evaluated = subprocess.run(
        script_command(name, "--evaluate", model, "--eval-episodes", 2), cwd=tmp_path, capture_output=True, text=True
    )
    assert evaluated.returncode == 0 and ": 2 episodes, mean return" in evaluated.stdout, evaluated.stderr


@pytest.mark.parametrize("name", CONTINUOUS)
def test_a_gaussian_run_on_the_same_bounds_is_clipped_into_them(name, tmp_path):
    done = run(name, tmp_path, "--total-timesteps", 128)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", CONTINUOUS)
def test_beta_on_unbounded_actions_is_refused_in_one_line(name, tmp_path):
    done = subprocess.run(
        script_command(name, "--env-id", "tests.fake_envs:Unbounded-v0", "--distribution", "beta"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "error: --distribution beta scales actions to the bounds, and those of tests.fake_envs:Unbounded-v0" in line


def test_the_fast_path_steps_aside_for_the_beta_agent_in_one_line_each(tmp_path):
    normal = run("ppo_continuous_action", tmp_path, "--total-timesteps", 64)
    assert "steps aside" not in normal.stdout  # the Gaussian keeps it
    beta = run("ppo_continuous_action", tmp_path, "--total-timesteps", 64, "--distribution", "beta")
    aside = [line for line in beta.stdout.splitlines() if "steps aside" in line]
    assert len(aside) == 2 and all("Agent has the parts ['actor_alpha_beta', 'critic']" in line for line in aside)
