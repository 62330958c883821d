"""A straggler injected into a torchrun job of ppo_atari_multigpu.py from outside the script: with this folder first on
PYTHONPATH and STRAGGLER_DELAY=S in the environment, the job's last rank (RANK = WORLD_SIZE - 1) sleeps S seconds after
each step of its vector environment. Python imports `sitecustomize` at start-up, before the script; the launcher and
the other ranks are left alone. Used by `benchmark.studies.scaling multigpu --straggler-delay` and by the tests of
preemption."""

import os
import time

delay = float(os.environ.get("STRAGGLER_DELAY", 0))
if delay > 0 and "RANK" in os.environ and int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
    import gymnasium.vector

    step = gymnasium.vector.SyncVectorEnv.step

    def slow_step(self, actions):
        result = step(self, actions)
        time.sleep(delay)
        return result

    gymnasium.vector.SyncVectorEnv.step = slow_step
