"""ppo.py learns CartPole-v1 with its default hyperparameters (about a minute on one CPU core)."""

import numpy as np
import pytest

import ppo
from helpers import read_scalars

THRESHOLD = 195.0  # CartPole's classic "solved" score


@pytest.mark.learning
def test_ppo_learns_cartpole(tmp_path):
    run_dir = ppo.main(ppo.Args(env_id="CartPole-v1", seed=1, total_timesteps=150_000, save_model=True,
                                runs_dir=str(tmp_path)))
    scalars = read_scalars(run_dir)
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert np.mean(returns[:20]) < 50  # it starts out unable to balance
    assert np.mean(returns[-20:]) >= THRESHOLD
    evaluation = [value for _, value in scalars["eval/episodic_return"]]
    assert len(evaluation) == 10 and np.mean(evaluation) >= THRESHOLD
