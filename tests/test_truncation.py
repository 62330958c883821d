"""Truncation bootstrap end to end: on an environment cut by a time limit after TIME_LIMIT steps with
reward 1 and a constant observation, the critic learns the value of an endless episode only when the
final observation's value is bootstrapped."""

import numpy as np
import torch

from helpers import CONSTANT_ENV, TIME_LIMIT, load, tiny_args

GAMMA = 0.99


def learned_value(script, tmp_path, bootstrap: bool) -> float:
    args = tiny_args(
        script,
        tmp_path / str(bootstrap),
        env_id=CONSTANT_ENV[script.__name__],
        num_envs=4,
        num_steps=32,
        num_minibatches=4,
        update_epochs=4,
        total_timesteps=2000,
        learning_rate=1e-2,
        anneal_lr=False,
        clip_vloss=False,
        save_model=True,
        eval_episodes=1,
        gamma=GAMMA,
        bootstrap_truncation=bootstrap,
    )
    checkpoint = load(f"{script.main(args)}/model.pt")
    agent = script.Agent(2, 2)
    agent.load_state_dict(checkpoint["model"])
    obs = np.ones((1, 2), np.float32)
    if hasattr(script, "ObsNormalizer"):
        normalizer = script.ObsNormalizer((2,), args.obs_clip)
        normalizer.rms.load_state_dict(checkpoint["obs_rms"])
        obs = normalizer(obs, update=False)
    with torch.no_grad():
        return agent.get_value(torch.as_tensor(obs)).item()


def test_truncation_is_bootstrapped(script, tmp_path):
    with_bootstrap = learned_value(script, tmp_path, bootstrap=True)
    without = learned_value(script, tmp_path, bootstrap=False)
    if script.__name__ == "ppo":  # raw rewards: the values have known bounds
        episode_return = (1 - GAMMA**TIME_LIMIT) / (1 - GAMMA)  # the most any step of a cut episode sees
        assert 0 < without < episode_return
        assert with_bootstrap > 2 * episode_return  # on its way to 1 / (1 - gamma) = 100
    else:  # scaled rewards, identically in both runs: compare the runs with each other
        assert without > 0
        assert with_bootstrap > 3 * without
