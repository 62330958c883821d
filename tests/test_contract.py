"""The correctness contract on every script, from a few tiny in-process runs per script on environments
whose episodes end in both ways that Gymnasium's TimeLimit can end them: terminated *and* truncated on
the same step (odd-numbered episodes), truncated only (even-numbered ones); the rewards tell the two
apart (tests/fake_envs.py). Per script:

- truncation bootstrap: compute_gae sees a final value (or a termination flag, envpool's reset-row
  form) of 0 where the episode also terminated, and the bootstrapped value where it was only truncated;
- ratio 1 at the first minibatch of every update;
- same seed, same run (episodes, weights); another seed, another run;
- every metric of the one vocabulary once per iteration, the per-iteration line;
- --eval-every: an evaluation at each of its iterations, best_model.pt that --evaluate reads, and a
  training that runs as without it (the same-seed run evaluates, the other does not);
- the checkpoint: the shared keys, an RNG dict that restores, and a run interrupted after its second
  checkpoint and resumed from it ends where an uninterrupted run ends.
"""

import numpy as np
import pytest
import torch

from helpers import (
    ITERATIONS,
    LINE,
    METRICS,
    RUNS,
    assert_progress_lines,
    batch_size,
    check_resume_after_interruption,
    load,
    make_args,
    read_scalars,
)
from ppolab.checkpoints import non_finite, rng_state, set_rng_state
from scripts import NEXT_STEP_GAE, SCRIPTS


def test_every_script_has_a_run():
    assert sorted(RUNS) == sorted(SCRIPTS)


RESULTS = {}  # script name -> its runs, made once and shared by the tests below


@pytest.fixture
def runs(contract, tmp_path_factory, capsys):
    """Two runs with the same seed (the second evaluates every iteration) and one with another, each with
    a checkpoint every iteration, and the compute_gae calls of the first."""
    script, calls = contract
    if script.__name__ not in RESULTS:
        results, folder = {}, tmp_path_factory.mktemp(script.__name__)
        for name, seed, eval_every in (("a", 3, 0), ("b", 3, 1), ("c", 4, 0)):
            first_call = len(calls)
            torch.backends.cudnn.conv.fp32_precision = torch.backends.cudnn.rnn.fp32_precision = "tf32"
            run_dir = script.main(make_args(script, folder / name, seed=seed, eval_every=eval_every))
            precision = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision)
            results[name] = dict(
                run_dir=run_dir,
                scalars=read_scalars(run_dir),
                stdout=capsys.readouterr().out,
                checkpoint=load(f"{run_dir}/checkpoint.pt"),
                gae_calls=calls[first_call:],
                cudnn_precision=precision,
            )
        RESULTS[script.__name__] = results
    return script, RESULTS[script.__name__]


def test_truncation_is_bootstrapped_unless_the_step_also_terminated(runs):
    script, results = runs
    calls = results["a"]["gae_calls"]
    assert len(calls) >= ITERATIONS
    both = only_truncated = 0
    for call in calls:
        done = call["dones"].bool()
        terminated_too, truncated_only = done & (call["rewards"] < 0), done & (call["rewards"] == 0)
        both, only_truncated = both + int(terminated_too.sum()), only_truncated + int(truncated_only.sum())
        if script.__name__ in NEXT_STEP_GAE:  # the reset-row form: the flag zeroes the next value
            assert (call["terminations"][terminated_too] == 1).all()
            assert (call["terminations"][truncated_only] == 0).all()
        else:
            assert (call["final_values"][terminated_too] == 0).all(), "a terminated step was bootstrapped"
            assert (call["final_values"][truncated_only] != 0).all(), "a truncation was not bootstrapped"
    assert both > 0 and only_truncated > 0  # both kinds of end happened


def test_ratio_one_metrics_line_and_determinism(runs):
    script, results = runs
    a = results["a"]
    batch = batch_size(RUNS[script.__name__])
    per_iteration = [batch * k for k in range(1, ITERATIONS + 1)]
    for tag in METRICS:
        assert tag in a["scalars"], tag
        if not tag.startswith("charts/episodic"):
            assert [step for step, _ in a["scalars"][tag]] == per_iteration, tag
    assert max(value for _, value in a["scalars"]["debug/first_minibatch_ratio_deviation"]) < 1e-5
    assert_progress_lines(a["stdout"], LINE, a["scalars"]["charts/episodic_return"], ITERATIONS, batch)
    assert a["stdout"].startswith(f"run folder: {a['run_dir']}\nwatch it with: tensorboard --logdir ")
    # --torch-deterministic (the default) turns cuDNN's TF32 off for convolutions and LSTMs
    assert a["cudnn_precision"] == ("ieee", "ieee")
    # same seed, same run; another seed, another run
    returns = {name: [value for _, value in r["scalars"]["charts/episodic_return"]] for name, r in results.items()}
    assert returns["a"] and returns["a"] == returns["b"]
    weights = {name: r["checkpoint"]["model"] for name, r in results.items()}
    assert all(torch.equal(value, weights["b"][key]) for key, value in weights["a"].items())
    assert any(not torch.equal(value, weights["c"][key]) for key, value in weights["a"].items())


def test_evaluation_every_iteration_keeps_the_best_model(runs):
    """Run b evaluated after every iteration (run a, with the same seed, never: the test above finds both
    runs the same, so evaluating leaves the training's random streams alone)."""
    script, results = runs
    last = ITERATIONS * batch_size(RUNS[script.__name__])
    steps = [batch_size(RUNS[script.__name__]) * k for k in range(1, ITERATIONS + 1)]
    evaluations = results["b"]["scalars"]["eval/mean_return"]
    # one evaluation per iteration, then the final one of --save-model at the last step
    assert [step for step, _ in evaluations] == steps + [last]
    assert [step for step, _ in results["a"]["scalars"]["eval/mean_return"]] == [last]
    episodes = results["b"]["scalars"]["eval/episodic_return"]
    assert [step for step, _ in episodes] == steps + [last]  # --eval-episodes 1
    means = [value for _, value in evaluations[:ITERATIONS]]
    best = int(np.argmax(means))  # the first of the best
    best_model = load(f"{results['b']['run_dir']}/best_model.pt")
    assert (best_model["iteration"], best_model["global_step"]) == (best + 1, steps[best])
    assert f"evaluation at global_step={steps[-1]}: mean return" in results["b"]["stdout"]
    # --evaluate reads it, and plays the episodes it was chosen on (ppo_procgen's builds an agent for
    # Procgen's 15 actions, which the fake envpool's 4-action weights do not fit: test_ppo_procgen.py has it)
    if script.__name__ == "ppo_procgen":
        return
    returns = script.main(script.Args(evaluate=f"{results['b']['run_dir']}/best_model.pt", eval_episodes=1, cuda=False))
    assert np.mean(returns) == pytest.approx(means[best], rel=1e-5)


def test_checkpoint_holds_the_shared_keys_and_an_rng_dict_that_restores(runs):
    script, results = runs
    checkpoint = results["a"]["checkpoint"]
    assert {"model", "optimizer", "iteration", "global_step", "args", "rng"} <= set(checkpoint)
    assert checkpoint["iteration"] == ITERATIONS
    assert checkpoint["global_step"] == ITERATIONS * batch_size(RUNS[script.__name__])
    assert script.Args(**checkpoint["args"]).seed == 3
    rng = checkpoint["rng"]
    assert isinstance(rng, dict) and {"torch", "numpy", "python"} <= set(rng)
    assert "cuda" not in rng  # a CPU run; a CUDA run adds the generator of its device (test_gpu.py)
    cpu = torch.device("cpu")
    set_rng_state(rng, cpu)
    first = (torch.rand(3), np.random.rand(3))
    set_rng_state(rng_state(cpu), cpu)  # a round trip of the current state changes nothing
    set_rng_state(rng, cpu)
    again = (torch.rand(3), np.random.rand(3))
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])


def test_resume_after_an_interruption_ends_where_the_full_run_ends(runs, tmp_path, monkeypatch):
    script, results = runs
    check_resume_after_interruption(
        script,
        lambda folder: make_args(script, tmp_path / folder, seed=3),
        ITERATIONS,
        batch_size(RUNS[script.__name__]),
        monkeypatch,
        full_dir=results["a"]["run_dir"],
        cuda=False,
    )


def test_clipfrac_is_the_mean_over_the_updates_minibatches(contract, tmp_path, monkeypatch):
    """losses/clipfrac is what CleanRL users compare it with: the mean over all minibatches of the
    update, not the last minibatch's. Each ppo_loss call here reports its own call number."""
    script, _ = contract
    real_loss, numbers = script.ppo_loss, []

    def numbered(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        numbers.append(float(len(numbers)))
        return loss, {**stats, "clipfrac": torch.tensor(numbers[-1])}

    monkeypatch.setattr(script, "ppo_loss", numbered)
    # the loss is PyTorch's here: NumpyUpdate, where a script has one, computes its own (and would see that
    # this one differs, and fall back, after two calls of its check)
    no_numpy = {"numpy_update": False} if hasattr(script, "NumpyUpdate") else {}
    run_dir = script.main(make_args(script, tmp_path, save_model=False, checkpoint_every=0, **no_numpy))
    logged = [value for _, value in read_scalars(run_dir)["losses/clipfrac"]]
    per_update = len(numbers) // ITERATIONS
    assert per_update > 1 and len(numbers) == ITERATIONS * per_update
    assert logged == pytest.approx([np.mean(numbers[k * per_update : (k + 1) * per_update]) for k in range(ITERATIONS)])


def test_a_run_that_diverges_ends_in_one_line_and_keeps_its_last_finite_checkpoint(
    contract, tmp_path, monkeypatch, capsys
):
    """From the third update on the advantages are NaN (as a NaN reward or observation would make them): the run
    ends at iteration 3 with exit 1 and one line, and the checkpoint of iteration 2, finite, is the last one."""
    script, _ = contract
    spy, calls = script.compute_gae, []

    def nan_from_the_third_update(**kwargs):
        calls.append(1)
        advantages, returns = spy(**kwargs)
        return (advantages * float("nan"), returns) if len(calls) >= 3 else (advantages, returns)

    monkeypatch.setattr(script, "compute_gae", nan_from_the_third_update)
    with pytest.raises(SystemExit) as exit_info:
        script.main(make_args(script, tmp_path, seed=3))
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "iteration 3: losses/" in errors[0] and "the training diverged" in errors[0], errors
    (checkpoint,) = tmp_path.glob("*/checkpoint.pt")
    assert load(checkpoint)["iteration"] == 2 and non_finite(load(checkpoint)) is None
    assert not (checkpoint.parent / "model.pt").exists()
