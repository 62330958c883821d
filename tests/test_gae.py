"""compute_gae against a slow reference written as forward sums over each episode segment, on every
copy: the same-step autoreset scripts and the envpool scripts with their reset rows."""

import importlib

import pytest
import torch

from scripts import NEXT_STEP_GAE, SAME_STEP_GAE

GAMMA, LAMBDA = 0.9, 0.8


def reference_gae(rewards, values, terminated, truncated, final_obs_values, last_value, gamma, lam):
    """Advantages by the definition: for each environment, each step t sums
    (gamma * lambda)^(k - t) * delta_k forward over k until its episode ends or the rollout does."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            total = 0.0
            for k in range(t, T):
                if terminated[k, n]:
                    next_value = 0.0
                elif truncated[k, n]:
                    next_value = float(final_obs_values[k, n])
                elif k == T - 1:
                    next_value = float(last_value[n])
                else:
                    next_value = float(values[k + 1, n])
                delta = float(rewards[k, n]) + gamma * next_value - float(values[k, n])
                total += (gamma * lam) ** (k - t) * delta
                if terminated[k, n] or truncated[k, n]:
                    break
            adv[t, n] = total
    return adv


def reference_of(r: dict) -> torch.Tensor:
    """reference_gae of a rollout of random_rollout, at GAMMA and LAMBDA."""
    keys = ("rewards", "values", "terminated", "truncated", "final_obs_values", "last_value")
    return reference_gae(*(r[key] for key in keys), GAMMA, LAMBDA)


def random_rollout(seed, T=23, N=4):
    """Random rollout with terminations and truncations (never both), episodes across the end."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(T, N, generator=g)
    terminated = u < 0.12
    truncated = (u >= 0.12) & (u < 0.22)
    terminated[-1, 0], truncated[-1, 0] = False, False  # environment 0 is mid-episode at the end
    terminated[-1, 1], truncated[-1, 1] = False, True  # environment 1 is truncated at the last step
    terminated[-1, 2], truncated[-1, 2] = True, False  # environment 2 terminates at the last step
    assert terminated.any() and truncated[:-1].any()
    return dict(
        rewards=torch.randn(T, N, generator=g, dtype=torch.float64),
        values=torch.randn(T, N, generator=g, dtype=torch.float64),
        terminated=terminated,
        truncated=truncated,
        final_obs_values=torch.randn(T, N, generator=g, dtype=torch.float64),
        last_value=torch.randn(N, generator=g, dtype=torch.float64),
        garbage=100 * torch.randn(T, N, generator=g, dtype=torch.float64),
    )


@pytest.fixture(params=SAME_STEP_GAE)
def same_step(request):
    return importlib.import_module(request.param)


def script_gae(script, r, final_values):
    dones = (r["terminated"] | r["truncated"]).double()
    return script.compute_gae(
        r["rewards"], r["values"], dones, r["last_value"], GAMMA, LAMBDA, final_values=final_values
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_reference_with_truncation_bootstrap(same_step, seed):
    r = random_rollout(seed)
    # the caller's contract: V(final obs) at truncations, 0 at terminations, anything where not done
    final_values = torch.where(r["truncated"], r["final_obs_values"], r["garbage"])
    final_values = torch.where(r["terminated"], torch.zeros_like(final_values), final_values)
    advantages, returns = script_gae(same_step, r, final_values)
    expected = reference_of(r)
    torch.testing.assert_close(advantages, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(returns, expected + r["values"], rtol=1e-10, atol=1e-10)


def test_gae_zero_final_values_is_truncation_as_termination(same_step):
    r = random_rollout(3)
    final_values = torch.where(r["terminated"] | r["truncated"], torch.zeros_like(r["garbage"]), r["garbage"])
    advantages, _ = script_gae(same_step, r, final_values)
    no_truncation = torch.zeros_like(r["truncated"])
    expected = reference_of(dict(r, terminated=r["terminated"] | r["truncated"], truncated=no_truncation))
    torch.testing.assert_close(advantages, expected, rtol=1e-10, atol=1e-10)
    # and it differs from the bootstrapped version where a truncation happened
    bootstrapped = reference_of(r)
    assert not torch.allclose(advantages, bootstrapped)


def next_step_rollout(seed):
    """A rollout as envpool stores it: after every episode end comes one reset row (never itself an
    end), and values[t + 1] is the value of the final observation of an episode that ended at t."""
    r = random_rollout(seed)
    ended = r["terminated"] | r["truncated"]
    reset_row = torch.zeros_like(ended)
    reset_row[1:] = ended[:-1]
    for key in ("terminated", "truncated"):
        r[key] = r[key] & ~reset_row
    # a reset row's reward is 0 and its action ignored
    r["rewards"] = torch.where(reset_row, torch.zeros_like(r["rewards"]), r["rewards"])
    r["final_obs_values"] = torch.cat([r["values"][1:], r["last_value"].unsqueeze(0)])
    r["reset_row"] = reset_row
    return r


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", NEXT_STEP_GAE)
def test_next_step_reset_gae_matches_reference_on_real_rows(name, seed):
    script = importlib.import_module(name)
    r = next_step_rollout(seed)
    assert r["reset_row"].any() and r["truncated"].any()
    dones = (r["terminated"] | r["truncated"]).double()
    advantages, returns = script.compute_gae(
        r["rewards"], r["values"], dones, r["last_value"], GAMMA, LAMBDA, terminations=r["terminated"].double()
    )
    expected = reference_of(r)
    real = ~r["reset_row"]
    torch.testing.assert_close(advantages[real], expected[real], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(returns[real], (expected + r["values"])[real], rtol=1e-10, atol=1e-10)
    # treating truncation as termination (--no-bootstrap-truncation) changes the truncated rows
    cut, _ = script.compute_gae(r["rewards"], r["values"], dones, r["last_value"], GAMMA, LAMBDA, terminations=dones)
    assert not torch.allclose(cut[real & r["truncated"]], advantages[real & r["truncated"]])
