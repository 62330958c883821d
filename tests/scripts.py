"""Which of the repeated pieces each training script holds: the per-piece lists that the topic tests run
on, read from here so that each copy of a piece is under test. The scripts themselves are the one list of
benchmark/scripts.py. tests/test_copies.py fails when a script that has a piece is missing from that
piece's list (or a new script from SCRIPTS)."""

import ast
from pathlib import Path

from benchmark.scripts import ROOT as REPO
from benchmark.scripts import SCRIPTS

MODULES = ["ppo", "ppo_continuous_action"]
# several processes each; their process layout is part of their lesson, and so comes before their loop
MULTI_PROCESS = [
    "ppo_atari_multigpu",
    "ppo_shared_memory_lstm",
    "ppo_continuous_action_redis",
]  # vector-observation scripts, tested on the fake envs too

# compute_gae in its two forms: same-step autoreset (keyword `final_values`) and envpool's next-step
# reset with its reset rows (keyword `terminations`)
SAME_STEP_GAE = [
    "ppo",
    "ppo_continuous_action",
    "ppo_atari",
    "ppo_atari_lstm",
    "ppo_atari_multigpu",
    "ppo_shared_memory_lstm",
    "ppo_continuous_action_redis",
]
NEXT_STEP_GAE = ["ppo_atari_envpool", "ppo_procgen"]

# Functions and classes that several scripts repeat on purpose: every top-level definition that two or more
# scripts hold as the same code. Within each group the copies are the same text (tests/test_copies.py); a piece
# with more than one group names an intended difference, and the comment says why it exists.
ATARI = ["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]  # ale-py's games
IDENTICAL = {
    # the plain mean over the minibatch / the mean over the samples a 0/1 mask keeps (envpool's fixed-shape minibatches)
    "ppo_loss": [
        [name for name in SCRIPTS if name not in ("ppo_atari_envpool", "ppo_procgen")],
        ["ppo_atari_envpool", "ppo_procgen"],
    ],
    "adapt_kl_beta": [SCRIPTS],
    "layer_init": [SCRIPTS],
    "compute_gae": [SAME_STEP_GAE, NEXT_STEP_GAE],  # the two reset conventions
    # gymnasium's vector RecordEpisodeStatistics (classic control, MuJoCo) / a per-env one below the
    # Atari wrappers, whose info arrives in final_info with same-step autoreset
    "finished_episodes": [["ppo", "ppo_continuous_action", "ppo_continuous_action_redis"], ATARI],
    "atari_id": [ATARI],
    "step_in_reset": [ATARI],
    "NoopReset": [ATARI],
    "MaxAndSkip": [ATARI],
    "EpisodicLife": [ATARI],
    "FireReset": [ATARI],
    "ObsNormalizer": [["ppo_continuous_action", "ppo_continuous_action_redis"]],
    "env_actions": [["ppo_continuous_action", "ppo_continuous_action_redis"]],  # a Gaussian's clipped, a Beta's scaled
    # one minibatch's gradient step: the plain form / with the all-reduce of the gradients / with the
    # 0/1 mask of fixed-shape minibatches (reset rows kept, not counted) / with the recurrent state
    "update_step": [
        ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_continuous_action_redis"],
        ["ppo_atari_multigpu"],
        ["ppo_atari_envpool", "ppo_procgen"],
        ["ppo_atari_lstm"],
        ["ppo_shared_memory_lstm"],  # the same code, over the workers' chunks
    ],
    "minibatch_indices": [["ppo_atari_envpool", "ppo_procgen"]],  # envpool's fixed-shape minibatches
    "episode_cuts": [["ppo_atari_lstm", "ppo_shared_memory_lstm"]],  # where the LSTM's sequence is cut
    # the Nature CNN over frame stacks / the categorical MLP / the Gaussian MLP / the CNN + LSTM / the IMPALA CNN
    # / the LSTM over classic control or Atari / the Gaussian MLP of the Redis learner
    "Agent": [
        ["ppo_atari", "ppo_atari_envpool", "ppo_atari_multigpu"],
        ["ppo"],
        ["ppo_continuous_action"],
        ["ppo_atari_lstm"],
        ["ppo_procgen"],
        ["ppo_shared_memory_lstm"],
        ["ppo_continuous_action_redis"],
    ],
    # a finished episode on its way to the log: from a rank to rank 0 / from a worker to the learner
    "Episode": [["ppo_atari_multigpu"], ["ppo_shared_memory_lstm"]],
    # one environment: gymnasium's ids (classic control; MuJoCo, the same for the Redis samplers) / ale-py's games
    # with their wrappers (frame stack; one frame for the LSTM; the workers' classic control or Atari)
    "make_env": [
        ["ppo"],
        ["ppo_continuous_action", "ppo_continuous_action_redis"],
        ["ppo_atari", "ppo_atari_multigpu"],
        ["ppo_atari_lstm"],
        ["ppo_shared_memory_lstm"],
    ],
    # the vector environment: the same in the two single-process ale-py scripts, else each script's own
    "make_envs": [
        ["ppo_atari", "ppo_atari_lstm"],
        ["ppo"],
        ["ppo_continuous_action"],
        ["ppo_atari_envpool"],
        ["ppo_procgen"],
        ["ppo_atari_multigpu"],
        ["ppo_shared_memory_lstm"],
        ["ppo_continuous_action_redis"],
    ],
    # how a saved policy plays: with frozen observation statistics (MuJoCo), else each script's own
    "evaluate": [
        ["ppo_continuous_action", "ppo_continuous_action_redis"],
        ["ppo"],
        ["ppo_atari"],
        ["ppo_atari_lstm"],
        ["ppo_atari_envpool"],
        ["ppo_procgen"],
        ["ppo_atari_multigpu"],
        ["ppo_shared_memory_lstm"],
    ],
    # the entry point: the same in the two plain single-process scripts and in the two ale-py ones, else its own
    "main": [
        ["ppo", "ppo_continuous_action"],
        ["ppo_atari", "ppo_atari_lstm"],
        ["ppo_atari_envpool"],
        ["ppo_procgen"],
        ["ppo_atari_multigpu"],
        ["ppo_shared_memory_lstm"],
        ["ppo_continuous_action_redis"],
    ],
}

# The policy step in NumPy beside Agent.act, for the small-MLP scripts on the CPU (tests/test_fast_path.py
# checks it against act)
NUMPY_POLICY = ["ppo", "ppo_continuous_action"]
# The update step in NumPy beside update_step, for the same scripts (tests/test_fast_path.py checks it against
# update_step)
NUMPY_UPDATE = ["ppo", "ppo_continuous_action"]


def script_path(name: str) -> Path:
    return REPO / f"{name}.py"


def top_level_definitions(name: str) -> dict[str, ast.AST]:
    """The module-level functions, classes and upper-case constants of a script, by name."""
    tree = ast.parse(script_path(name).read_text())
    definitions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
        ):
            definitions[node.targets[0].id] = node
    return definitions


def without_docstrings(node: ast.AST) -> str:
    """The code of a definition as an AST dump, docstrings removed (comments are not in the AST)."""
    node = ast.parse(ast.unparse(node)).body[0]  # a copy
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if (
            isinstance(child, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            child.body = body[1:] or [ast.Pass()]
    return ast.dump(node)


def keyword_only_arguments(name: str, function: str) -> list[str]:
    node = top_level_definitions(name)[function]
    return [arg.arg for arg in node.args.kwonlyargs]


def shape(name: str) -> tuple[int, int, int]:
    """A script's shape, to watch: its length in lines, the line its training loop (`for iteration in range(...)`
    in `train`) starts at, and the length of `train`."""
    source = script_path(name).read_text()
    train = top_level_definitions(name)["train"]
    loop = next(
        node
        for node in ast.walk(train)
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == "iteration"
    )
    return len(source.splitlines()), loop.lineno, train.end_lineno - train.lineno + 1
