"""ppo.py and ppo_continuous_action.py run as a user runs them, for a few iterations: files, metrics, stdout, the
first-minibatch ratio, and evaluation of the saved model."""

import importlib
import re

import pytest

from helpers import (
    LINE,
    METRICS,
    REAL_ENV,
    assert_evaluation_videos,
    assert_progress_lines,
    load,
    only_run_dir,
    read_scalars,
    run_script,
)
from scripts import MODULES

ITERATIONS, EVAL_EPISODES = 4, 3
NUM_ENVS = {"ppo": 4, "ppo_continuous_action": 1}  # the scripts' defaults
NUM_STEPS = {"ppo": 32, "ppo_continuous_action": 64}


@pytest.fixture(scope="module", params=MODULES)
def e2e(request, tmp_path_factory):
    """One short run of each script from the command line, shared by the tests of this file."""
    name = request.param
    cwd = tmp_path_factory.mktemp(name)
    batch = NUM_ENVS[name] * NUM_STEPS[name]
    result = run_script(
        name,
        "--env-id",
        REAL_ENV[name],
        "--total-timesteps",
        ITERATIONS * batch + batch // 2,
        "--num-steps",
        NUM_STEPS[name],
        "--save-model",
        "--checkpoint-every",
        1,
        "--eval-episodes",
        EVAL_EPISODES,
        cwd=cwd,
    )
    run_dir = only_run_dir(cwd / "runs") if result.returncode == 0 else None
    return dict(
        name=name,
        cwd=cwd,
        batch=batch,
        result=result,
        run_dir=run_dir,
        scalars=read_scalars(run_dir) if run_dir else None,
    )


def test_run_exits_cleanly_and_writes_its_files(e2e):
    assert e2e["result"].returncode == 0, e2e["result"].stderr
    assert "Traceback" not in e2e["result"].stderr
    run_dir = e2e["run_dir"]
    assert run_dir.name.startswith(f"{REAL_ENV[e2e['name']]}__{e2e['name']}__1__")
    assert list(run_dir.glob("events.out.tfevents.*"))
    checkpoint, model = load(run_dir / "checkpoint.pt"), load(run_dir / "model.pt")
    assert checkpoint["iteration"] == model["iteration"] == ITERATIONS
    assert checkpoint["global_step"] == model["global_step"] == ITERATIONS * e2e["batch"]


def test_all_metrics_are_logged(e2e):
    scalars = e2e["scalars"]
    missing = [tag for tag in METRICS if tag not in scalars]
    assert not missing
    per_iteration = [e2e["batch"] * k for k in range(1, ITERATIONS + 1)]
    for tag in METRICS:
        if not tag.startswith("charts/episodic"):
            assert [step for step, _ in scalars[tag]] == per_iteration, tag
    assert len(scalars["eval/episodic_return"]) == EVAL_EPISODES


def test_stdout_has_a_line_per_iteration_with_episodes(e2e):
    assert_progress_lines(
        e2e["result"].stdout, LINE, e2e["scalars"]["charts/episodic_return"], ITERATIONS, e2e["batch"]
    )


def test_ratio_is_one_at_the_first_minibatch(e2e):
    deviations = [value for _, value in e2e["scalars"]["debug/first_minibatch_ratio_deviation"]]
    assert len(deviations) == ITERATIONS
    assert max(deviations) < 1e-5


def test_saved_model_evaluates_as_after_training(e2e):
    script = importlib.import_module(e2e["name"])
    logged = [value for _, value in e2e["scalars"]["eval/episodic_return"]]
    returns = script.main(
        script.Args(evaluate=str(e2e["run_dir"] / "model.pt"), eval_episodes=EVAL_EPISODES, cuda=False)
    )
    # the episodes are logged at one global step, where the event file does not keep their order
    assert sorted(returns) == pytest.approx(sorted(logged), rel=1e-6)


def test_evaluate_flag_prints_the_training_evaluation(e2e):
    trained = re.search(r"^evaluation: 3 episodes, mean return (-?[\d.]+)", e2e["result"].stdout, re.M)
    # another --seed on the command line: the evaluation still plays the trained run's episodes
    result = run_script(
        e2e["name"],
        "--evaluate",
        e2e["run_dir"] / "model.pt",
        "--eval-episodes",
        EVAL_EPISODES,
        "--seed",
        7,
        cwd=e2e["cwd"],
    )
    assert result.returncode == 0, result.stderr
    evaluated = re.search(r"^evaluation of .*model\.pt on \S+: 3 episodes, mean return (-?[\d.]+)", result.stdout, re.M)
    assert trained and evaluated and evaluated[1] == trained[1]


def test_evaluate_capture_video_records_every_episode(e2e, capsys):
    script = importlib.import_module(e2e["name"])
    episodes = 2 if e2e["name"] == "ppo" else 1  # MuJoCo's off-screen rendering on a CPU is slow
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", episodes, episodes, capsys)
