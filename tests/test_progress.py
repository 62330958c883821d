"""The per-iteration line: the first lines name the run folder and the TensorBoard command; the line comes
at the first and the last iteration even when no episode ended, and in between at most every few seconds.
ProgressLine is the same class in every script (tests/test_copies.py), so ppo.py's stands for all."""

import time

import ppo
from helpers import LINE, assert_progress_lines, read_scalars
from ppolab.run import ProgressLine


def test_lines_without_finished_episodes_say_so(tmp_path, capsys):
    # CartPole's shortest episodes take 8 steps: 2 iterations of 4 steps end none
    run_dir = ppo.main(
        ppo.Args(
            env_id="CartPole-v1",
            num_envs=1,
            num_steps=4,
            num_minibatches=1,
            update_epochs=1,
            total_timesteps=8,
            runs_dir=str(tmp_path),
            cuda=False,
        )
    )
    stdout = capsys.readouterr().out
    assert stdout.startswith(f"run folder: {run_dir}\nwatch it with: tensorboard --logdir {tmp_path}\n")
    assert "charts/episodic_return" not in read_scalars(run_dir)
    assert [m[3:] for m in LINE.findall(stdout)] == [("0", "nan"), ("0", "nan")]
    assert_progress_lines(stdout, LINE, [], 2, 4)


def test_at_most_one_line_every_few_seconds_and_always_the_last(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    progress = ProgressLine(every=5.0)
    printed = []
    for iteration, (seconds, returns) in enumerate(
        [(0, [1.0]), (2, [3.0]), (2, []), (1.5, [5.0, 7.0]), (1, [9.0]), (0.5, [])], start=1
    ):
        clock[0] += seconds
        line = progress.due(returns, last=iteration == 6)
        if line:
            printed.append((iteration, line))
    # the first; none until 5 s later (iteration 4 at 105.5 s), counting the episodes since the line before; the last
    assert printed == [
        (1, "episodes=1 mean_return=1.00"),
        (4, "episodes=3 mean_return=5.00"),
        (6, "episodes=1 mean_return=9.00"),
    ]
