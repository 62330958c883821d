"""The fast path, per script, on the CPU:

- under the fake CUDA device of tests/fake_cuda.py a few tiny iterations (the contract's runs,
  tests/helpers.py) raise nothing a real GPU would raise, and the rollout makes exactly one copy to
  the device (non-blocking, from pinned memory) and one back per environment step, and no other sync;
- `--compile` and the eager code from the same seed make the same run, to float tolerance;
- `--cudagraphs` without CUDA is a one-line error, exit 2;
- a script that defaults to more than one PyTorch thread lets OpenMP's idle threads sleep;
- the NumPy policy step of the small-MLP scripts is `Agent.act`: same actions and log-probs; the values
  these scripts compute after the rollout are the critic's values of the stored observations;
- their NumPy update step is `update_step`: same parameters, Adam state and statistics, step after
  step; a run with it and one without agree; and a run whose `ppo_loss` no longer matches it falls
  back to `update_step`, with a line saying so;
- a run's first lines say which steps run as NumPy mirrors and how to run the PyTorch code instead.
"""

import copy
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fake_cuda import FakeCuda
from helpers import ITERATIONS, RUNS, load, make_args, read_scalars
from ppolab.fast_path import (
    NUMPY_COMPUTES,
    NumpyPolicy,
    NumpyUpdate,
    agent_kind,
    code_fingerprint,
    numpy_update_agrees,
)
from scripts import NUMPY_POLICY, NUMPY_UPDATE, REPO, SCRIPTS, script_path

# the rollout runs in other processes (on the CPU): the learner's rollout phase makes no copies at all
BETA = torch.tensor(1.0)  # PPO-Penalty's beta, which update_step takes (unused by the default clip objective)
ROLLOUT_ELSEWHERE = {"ppo_continuous_action_redis", "ppo_shared_memory_lstm"}


def rollout_steps(name: str) -> int:
    return 0 if name in ROLLOUT_ELSEWHERE else ITERATIONS * RUNS[name]["num_steps"]


def test_under_a_fake_gpu_no_device_error_and_one_copy_each_way_per_step(contract, tmp_path):
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


def test_the_fake_gpu_sees_a_sync_in_the_rollout(contract, tmp_path, monkeypatch):
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
        script.main(
            make_args(
                script,
                tmp_path,
                cuda=True,
                total_timesteps=make_args(script, tmp_path).batch_size,
                save_model=False,
                checkpoint_every=0,
            )
        )
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


def test_compiled_and_eager_runs_of_one_seed_agree(contract, tmp_path, inductor_draws_like_eager):
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


def openmp_settings(name: str, **env) -> str:
    """What the OpenMP runtime that PyTorch loads reports at start (OMP_DISPLAY_ENV) in `name.py --help`,
    with no OMP_WAIT_POLICY of the caller's and the given variables set."""
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, "OMP_DISPLAY_ENV": "VERBOSE", **env}
    result = subprocess.run(
        [sys.executable, f"{name}.py", "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    if "OPENMP DISPLAY ENVIRONMENT" not in result.stderr:
        pytest.skip("PyTorch's OpenMP runtime here is not GNU libgomp, which this test reads")
    return result.stderr


def test_a_script_on_more_than_one_thread_lets_idle_openmp_threads_sleep():
    """The scripts whose default is more than one PyTorch thread set OMP_WAIT_POLICY=PASSIVE before PyTorch
    loads OpenMP: libgomp then spins 0 times before an idle thread sleeps (300,000 when unset). A policy the
    user set is kept."""
    threaded = [name for name in SCRIPTS if importlib.import_module(name).Args().torch_threads > 1]
    assert threaded == ["ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_procgen"]
    for name in threaded:
        assert "GOMP_SPINCOUNT = '0'" in openmp_settings(name), name
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in openmp_settings(threaded[0], OMP_WAIT_POLICY="ACTIVE")


def uses_the_fast_path(name: str) -> bool:
    return "ppolab.numpy_fast_path(" in script_path(name).read_text()


def test_the_scripts_with_the_numpy_steps_are_listed():
    assert [name for name in SCRIPTS if uses_the_fast_path(name)] == NUMPY_POLICY == NUMPY_UPDATE


@pytest.mark.parametrize("name", NUMPY_POLICY)
def test_the_numpy_policy_step_is_agent_act(name):
    """Same weights, same generator state: same actions, and log-probs to float precision, also after an optimizer
    step (NumpyPolicy reads the parameters' memory, no copy) and when the batch size changes (its noise tensors are
    kept per shape); the generator is left where `act` leaves it (the policy draws what act draws, no more)."""
    script = importlib.import_module(name)
    torch.manual_seed(0)
    agent = script.Agent(5, 3)
    policy = NumpyPolicy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.1, fused=True)
    for rows in (7, 7, 2, 7):
        obs = torch.randn(rows, 5) * 3
        state = torch.get_rng_state()
        expected = agent.act(obs)
        after_act = torch.get_rng_state()
        torch.set_rng_state(state)
        got = [torch.from_numpy(x) for x in policy(obs.numpy())]
        for a, b in zip(got, expected):  # integer actions: exactly equal
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert torch.equal(torch.get_rng_state(), after_act)
        optimizer.zero_grad()
        agent.get_action_and_value(obs)[1].sum().backward()  # the weights change in place
        optimizer.step()


@pytest.mark.parametrize("name", NUMPY_POLICY)
def test_the_values_computed_after_the_rollout_belong_to_the_stored_observations(name, tmp_path, monkeypatch):
    """These scripts take the rollout's values from one critic pass after it. At each iteration's first
    minibatch nothing has been updated yet, so the critic's values of the minibatch's (shuffled)
    observations must be the values the minibatch carries, row by row."""
    script = importlib.import_module(name)
    real_update, calls, checked = script.update_step, [], []

    def checking_update(agent, optimizer, args, kl_beta, **minibatch):  # the loop passes the minibatch by keyword
        if len(calls) % (args.update_epochs * args.num_minibatches) == 0:
            with torch.no_grad():
                torch.testing.assert_close(agent.get_value(minibatch["obs"]), minibatch["values"], rtol=1e-5, atol=1e-6)
            checked.append(len(calls))
        calls.append(1)
        return real_update(agent, optimizer, args, kl_beta, **minibatch)

    monkeypatch.setattr(script, "update_step", checking_update)
    script.main(make_args(script, tmp_path, numpy_update=False, save_model=False, checkpoint_every=0))
    assert len(checked) == ITERATIONS and len(calls) > ITERATIONS


def minibatch(script, agent, n: int, seed: int):
    """A minibatch whose stored log-probs and values are off from the agent's, so that the ratio and the
    value change are clipped for some samples and not for others."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, agent.critic[0].in_features, generator=generator) * 2
    if script.__name__ == "ppo":
        actions = torch.randint(0, agent.actor[-1].out_features, (n,), generator=generator)
    else:
        actions = torch.randn(n, agent.actor_mean[-1].out_features, generator=generator)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    noise = torch.randn(4, n, generator=generator)
    return obs, actions, logprobs + 0.3 * noise[0], noise[1] * 3 + 1, values + noise[2], values + 0.3 * noise[3]


@pytest.mark.parametrize("name", NUMPY_UPDATE)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"norm_adv": False, "clip_vloss": False, "ent_coef": 0.1},
        {"max_grad_norm": 100.0},  # no clipping
        {"policy_objective": "fixed-kl", "kl_beta": 0.7},  # PPO-Penalty: the KL-penalised surrogate
        {"policy_objective": "adaptive-kl", "kl_beta": 3.0},
    ],
)
@pytest.mark.parametrize("torch_steps_first", [0, 2])
def test_the_numpy_update_step_is_update_step(name, options, torch_steps_first):
    """From the same agent and optimizer, step after step on changing minibatches: the same statistics, the
    same parameters and Adam state; NumpyUpdate made on a fresh optimizer or on one that has stepped (it
    carries Adam's moments into its flat vectors); and a PyTorch step after NumPy steps continues as after
    PyTorch steps (Adam's state is kept in Adam's own format)."""
    script = importlib.import_module(name)
    args = script.Args(**options)
    torch.manual_seed(0)
    agent = script.Agent(5, 3)
    if name == "ppo_continuous_action":
        with torch.no_grad():
            agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.4]]))
    agents = [agent, copy.deepcopy(agent)]
    optimizers = [torch.optim.Adam(a.parameters(), lr=torch.tensor(3e-3), eps=1e-5, fused=True) for a in agents]
    beta = torch.tensor(args.kl_beta)  # PPO-Penalty's beta, as train makes it
    for k in range(torch_steps_first):
        batch = minibatch(script, agents[0], 64, seed=100 + k)
        for a, o in zip(agents, optimizers):
            script.update_step(a, o, args, beta, *batch)
    numpy_step = NumpyUpdate(agents[1], optimizers[1], args, beta)
    clipped = []
    for k in range(6):
        if k == 3:
            beta.mul_(2)  # as adapt_kl_beta changes it between updates: both steps follow
        batch = minibatch(script, agents[0], 64, seed=k)
        expected = script.update_step(agents[0], optimizers[0], args, beta, *batch)
        got = numpy_step(*batch) if k < 5 else script.update_step(agents[1], optimizers[1], args, beta, *batch)
        assert expected.keys() == got.keys()
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-6, msg=f"step {k}: {key}")
        clipped.append(float(expected["clipfrac"]))
        for p, q in zip(*(a.parameters() for a in agents)):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=f"step {k}")
    for p, q in zip(*(a.parameters() for a in agents)):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optimizers[1].state[q][key], optimizers[0].state[p][key], rtol=1e-4, atol=1e-7)
    assert 0 < np.mean(clipped) < 1  # some samples clipped, some not: both branches of the gradient ran


@pytest.mark.parametrize("name", NUMPY_UPDATE)
def test_the_start_of_run_check_leaves_the_agent_and_adam_state_alone(name):
    """numpy_update_agrees steps copies: after a --resume the optimizer already holds Adam's moments, and the
    check must not move them (nor the parameters)."""
    script = importlib.import_module(name)
    torch.manual_seed(0)
    agent = script.Agent(5, 3)
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(3e-3), eps=1e-5, fused=True)
    for k in range(2):
        script.update_step(agent, optimizer, script.Args(), BETA, *minibatch(script, agent, 64, seed=k))
    before = copy.deepcopy((agent.state_dict(), optimizer.state_dict()))
    assert numpy_update_agrees(agent, optimizer, script.Args(), BETA, script.update_step)
    for saved, now in zip(before, (agent.state_dict(), optimizer.state_dict())):
        torch.testing.assert_close(now, saved, rtol=0, atol=0)


@pytest.mark.parametrize("name", NUMPY_UPDATE)
def test_a_loss_replaced_at_run_time_makes_the_run_fall_back_to_update_step(name, tmp_path, monkeypatch, capsys):
    """The fast path reads the functions the run will call, not the file: a `ppo_loss` replaced on the module
    (as a notebook or a test would) is not the code NumpyUpdate computes, so the run says so and trains every
    minibatch with update_step, whose loss is the replaced one. (Edits to the file: test_fast_path_edits.py.)"""
    script = importlib.import_module(name)
    real_loss, calls = script.ppo_loss, []

    def changed_loss(*args, **kwargs):  # a researcher's new term: an extra penalty on the values
        calls.append(1)
        loss, stats = real_loss(*args, **kwargs)
        return loss + 0.1 * args[2].square().mean(), stats

    monkeypatch.setattr(script, "ppo_loss", changed_loss)
    args = make_args(script, tmp_path, save_model=False, checkpoint_every=0)
    script.main(args)
    assert (
        "NumpyUpdate steps aside, the update step runs as update_step in PyTorch: ppo_loss is not the code it computes"
    ) in capsys.readouterr().out
    assert len(calls) == ITERATIONS * args.update_epochs * args.num_minibatches


def test_every_script_with_the_numpy_mirrors_is_listed_and_can_turn_them_off():
    """The scripts that call ppolab.numpy_fast_path are those these tests run on, and each has --no-numpy-update."""
    using = [name for name in SCRIPTS if "ppolab.numpy_fast_path(" in script_path(name).read_text()]
    assert using == NUMPY_POLICY == NUMPY_UPDATE
    assert all(importlib.import_module(name).Args(numpy_update=False).numpy_update is False for name in using)


TO_PYTORCH = "--no-numpy-update runs this file's PyTorch code"


@pytest.mark.parametrize("name", NUMPY_UPDATE)
@pytest.mark.parametrize("case", ["as written", "--no-numpy-update", "another loss"])
def test_the_first_lines_say_which_steps_run_as_numpy_mirrors(name, case, tmp_path, monkeypatch, capsys):
    """Before its first iteration a run on the CPU says which steps run as NumPy mirrors of the file's code and how
    to run the PyTorch code instead; then, for a mirror that steps aside, why. With --no-numpy-update it says
    nothing of NumPy."""
    script = importlib.import_module(name)
    if case == "another loss":
        real_loss = script.ppo_loss

        def another_loss(*args, **kwargs):  # computes the same, but is not the code the mirror was written from
            return real_loss(*args, **kwargs)

        monkeypatch.setattr(script, "ppo_loss", another_loss)
    args = make_args(script, tmp_path, numpy_update=case != "--no-numpy-update", save_model=False, checkpoint_every=0)
    script.main(args)
    lines = capsys.readouterr().out.splitlines()
    first = lines[: next(i for i, line in enumerate(lines) if line.startswith("iteration "))]
    said = [line for line in first if "NumPy" in line or "Numpy" in line]
    expected = {
        "as written": [
            "on the CPU Agent.act and update_step run as NumPy mirrors (ppolab.NumpyPolicy and ppolab.NumpyUpdate: the "
            "same computation, faster); " + TO_PYTORCH
        ],
        "--no-numpy-update": [],
        "another loss": [
            "on the CPU Agent.act runs as a NumPy mirror (ppolab.NumpyPolicy: the same computation, faster); "
            + TO_PYTORCH,
            "NumpyUpdate steps aside, the update step runs as update_step in PyTorch: ppo_loss is not the code it "
            "computes",
        ],
    }
    assert said == expected[case]
    assert not [line for line in lines[len(first) :] if "NumPy" in line or "Numpy" in line]


@pytest.mark.parametrize("name", NUMPY_UPDATE)
def test_the_fingerprints_are_those_of_the_code_as_it_stands(name):
    """ppolab.fast_path.NUMPY_COMPUTES holds the fingerprints of the functions the NumPy steps compute: the
    script as it stands uses its fast path. After a change to one of them (and to the NumPy code with it),
    put the printed fingerprint into NUMPY_COMPUTES."""
    script = importlib.import_module(name)
    functions = {
        "Agent.act": script.Agent.act,
        "Agent.get_action_and_value": script.Agent.get_action_and_value,
        "Agent.get_value": script.Agent.get_value,
        "ppo_loss": script.ppo_loss,
        "update_step": script.update_step,
    }
    kind = agent_kind(script.Agent(3, 2))
    assert {key: code_fingerprint(f) for key, f in functions.items()} == NUMPY_COMPUTES[kind]


@pytest.mark.parametrize("name", NUMPY_UPDATE)
def test_runs_with_and_without_the_numpy_update_agree(name, tmp_path, capsys):
    script = importlib.import_module(name)
    runs = {}
    for numpy_update in (False, True):
        run_dir = script.main(
            make_args(script, tmp_path / str(numpy_update), seed=5, numpy_update=numpy_update, save_model=False)
        )
        runs[numpy_update] = (read_scalars(run_dir), load(f"{run_dir}/checkpoint.pt")["model"])
    assert "NumpyUpdate does not compute" not in capsys.readouterr().out  # the NumPy run used it
    (torch_run, torch_weights), (numpy_run, numpy_weights) = runs[False], runs[True]
    assert [v for _, v in torch_run["charts/episodic_return"]] == [v for _, v in numpy_run["charts/episodic_return"]]
    for key in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl", "losses/clipfrac"):
        assert [v for _, v in numpy_run[key]] == pytest.approx([v for _, v in torch_run[key]], rel=1e-3, abs=1e-5), key
    for key, value in torch_weights.items():
        torch.testing.assert_close(numpy_weights[key], value, rtol=1e-4, atol=1e-5)
