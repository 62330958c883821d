"""The step-by-step LSTM loop: the reference that tests/test_ppo_atari_lstm.py holds an agent's `run_lstm` to,
and what `python -m benchmark.studies.speed throughput --straightforward` runs in the recurrent scripts in place of `run_lstm`."""

import torch


def lstm_step_by_step(agent, hidden, starts, state, cuts=None):
    """The usual recurrent PPO loop, the reference for an agent's `run_lstm`: one LSTM call per time
    step, the state zeroed where an episode starts. Same arguments and results as `run_lstm` (`cuts`,
    where `run_lstm` may join steps into one call, is not needed here: every step is its own call)."""
    h, c = state
    outputs = []
    for t in range(hidden.shape[0]):
        keep = (1.0 - starts[t]).view(1, -1, 1)
        out, (h, c) = agent.lstm(hidden[t : t + 1], (h * keep, c * keep))
        outputs.append(out)
    return torch.cat(outputs), (h, c)
