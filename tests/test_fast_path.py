"""The fast path, per script, on the CPU:

- under the fake CUDA device of tests/fake_cuda.py a few tiny iterations (the contract's runs,
  test_contract.py) raise nothing a real GPU would raise, and the rollout makes exactly one copy to
  the device (non-blocking, from pinned memory) and one back per environment step, and no other sync;
- `--compile` and the eager code from the same seed make the same run, to float tolerance;
- `--cudagraphs` without CUDA is a one-line error, exit 2;
- the NumPy policy step of the small-MLP scripts is `Agent.act`: same actions, log-probs, values.
"""

import importlib

import pytest
import torch

from fake_cuda import FakeCuda
from helpers import load, read_scalars
from scripts import NUMPY_POLICY, SCRIPTS, top_level_definitions
from test_contract import ITERATIONS, RUNS, contract, make_args  # noqa: F401  (contract is a fixture)

# the rollout runs in other processes (on the CPU): the learner's rollout phase makes no copies at all
ROLLOUT_ELSEWHERE = {"ppo_continuous_action_redis", "ppo_shared_memory_lstm"}


def rollout_steps(name: str) -> int:
    return 0 if name in ROLLOUT_ELSEWHERE else ITERATIONS * RUNS[name]["num_steps"]


def test_under_a_fake_gpu_no_device_error_and_one_copy_each_way_per_step(contract, tmp_path):  # noqa: F811
    script, _ = contract
    with FakeCuda(script) as fake:
        run_dir = script.main(make_args(script, tmp_path, cuda=True, save_model=False))
    assert not fake.violations, fake.violations
    rollout = {(kind, site): n for (kind, site, phase), n in fake.events.items() if phase == "rollout"}
    steps = rollout_steps(script.__name__)
    assert fake.count("H2D non_blocking from pinned memory") == steps, rollout
    assert fake.count("D2H") == steps, rollout
    assert sum(rollout.values()) == 2 * steps, rollout  # no other copy, no sync
    # the run went through: a checkpoint with the (fake) CUDA generator, the ratio 1 at the first minibatch
    assert "cuda" in load(f"{run_dir}/checkpoint.pt")["rng"]
    assert max(v for _, v in read_scalars(run_dir)["debug/first_minibatch_ratio_deviation"]) < 1e-5


def test_the_fake_gpu_sees_a_sync_in_the_rollout(contract, tmp_path, monkeypatch):  # noqa: F811
    """The harness itself: a per-step `.item()` added to the policy step is counted in the rollout."""
    script, _ = contract
    if script.__name__ in ROLLOUT_ELSEWHERE:
        pytest.skip("the rollout runs in other processes")
    real_act = script.Agent.act

    def act_with_a_sync(self, *args, **kwargs):
        out = real_act(self, *args, **kwargs)
        out[1].sum().item()
        return out

    monkeypatch.setattr(script.Agent, "act", act_with_a_sync)
    with FakeCuda(script) as fake:
        script.main(make_args(script, tmp_path, cuda=True, total_timesteps=make_args(script, tmp_path).batch_size,
                              save_model=False, checkpoint_every=0))
    assert fake.count("sync .item()") == RUNS[script.__name__]["num_steps"]


@pytest.fixture
def inductor_draws_like_eager(monkeypatch):
    """Compiled code draws its random numbers with eager PyTorch's generator (inductor has its own by
    default), so that a compiled run and an eager run of one seed sample the same actions."""
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_compiled_and_eager_runs_of_one_seed_agree(contract, tmp_path, inductor_draws_like_eager):  # noqa: F811
    script, _ = contract
    runs = {}
    for mode in (False, True):
        run_dir = script.main(make_args(script, tmp_path / str(mode), seed=5, compile=mode, save_model=False))
        runs[mode] = (read_scalars(run_dir), load(f"{run_dir}/checkpoint.pt")["model"])
        assert (torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0) == mode  # compiled only if asked
    (eager, eager_weights), (compiled, compiled_weights) = runs[False], runs[True]
    assert [v for _, v in eager["charts/episodic_return"]] == [v for _, v in compiled["charts/episodic_return"]]
    for name in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl"):
        assert [v for _, v in compiled[name]] == pytest.approx([v for _, v in eager[name]], rel=1e-3, abs=1e-5), name
    for key, value in eager_weights.items():
        torch.testing.assert_close(compiled_weights[key], value, rtol=1e-4, atol=1e-5)


def test_cudagraphs_without_cuda_is_a_one_line_error(every_script, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        every_script.main(every_script.Args(runs_dir=str(tmp_path / "runs"), cudagraphs=True))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and ": error: --cudagraphs needs CUDA" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_the_numpy_policy_steps_are_listed():
    assert [name for name in SCRIPTS if "NumpyPolicy" in top_level_definitions(name)] == NUMPY_POLICY


@pytest.mark.parametrize("name", NUMPY_POLICY)
def test_the_numpy_policy_step_is_agent_act(name):
    """Same weights, same generator state: same actions, and log-probs and values to float precision,
    also after an optimizer step (NumpyPolicy reads the parameters' memory, no copy)."""
    script = importlib.import_module(name)
    torch.manual_seed(0)
    agent = script.Agent(5, 3)
    policy = script.NumpyPolicy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.1, fused=True)
    for _ in range(3):
        obs = torch.randn(7, 5) * 3
        state = torch.get_rng_state()
        expected = agent.act(obs)
        torch.set_rng_state(state)
        got = policy(obs)
        for a, b in zip(got, expected):  # integer actions: exactly equal
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        optimizer.zero_grad()
        agent.get_action_and_value(obs)[1].sum().backward()  # the weights change in place
        optimizer.step()
