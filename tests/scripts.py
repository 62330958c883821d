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

# The scripts whose run machinery (checkpoints, resume, input checks, logging, Ctrl-C) is the package ppolab's:
# they hold no copy of it
ON_PPOLAB = [
    "ppo",
    "ppo_continuous_action",
    "ppo_atari",
    "ppo_atari_lstm",
    "ppo_atari_multigpu",
    "ppo_shared_memory_lstm",
]
OWN_MACHINERY = [s for s in SCRIPTS if s not in ON_PPOLAB]

# Functions and classes that several scripts repeat on purpose. Within each group the copies must be
# the same code (docstrings and comments may differ); a piece with more than one group names an
# intended difference, and the comment says why it exists.
IDENTICAL = {
    "fail": [OWN_MACHINERY],
    "ppo_loss": [SCRIPTS],
    "layer_init": [SCRIPTS],
    "rng_state": [OWN_MACHINERY],
    "set_rng_state": [OWN_MACHINERY],
    "explained_variance": [OWN_MACHINERY],
    "compute_gae": [SAME_STEP_GAE, NEXT_STEP_GAE],  # the two reset conventions
    # gymnasium's vector RecordEpisodeStatistics (classic control, MuJoCo) / a per-env one below the
    # Atari wrappers, whose info arrives in final_info with same-step autoreset
    "finished_episodes": [
        ["ppo", "ppo_continuous_action", "ppo_continuous_action_redis"],
        ["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"],
    ],
    "step_in_reset": [["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]],
    "NoopReset": [["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]],
    "MaxAndSkip": [["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]],
    "EpisodicLife": [["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]],
    "FireReset": [["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu", "ppo_shared_memory_lstm"]],
    "ProgressLine": [OWN_MACHINERY],
    "finish_tracking": [OWN_MACHINERY],
    "RunningMeanStd": [["ppo_procgen", "ppo_continuous_action_redis"]],
    # bad input, checkpoint files, resuming and Ctrl-C: the same rules in every script
    "check_numbers": [OWN_MACHINERY],
    "check_tracking": [OWN_MACHINERY],
    "check_runs_dir": [OWN_MACHINERY],
    "write_checkpoint_file": [OWN_MACHINERY],
    "CHECKPOINT_FORMAT": [OWN_MACHINERY],
    "as_data": [OWN_MACHINERY],
    "FORMAT_2_NUMPY": [OWN_MACHINERY],
    "read_checkpoint": [OWN_MACHINERY],
    "load_checkpoint": [OWN_MACHINERY],
    "resume_args": [OWN_MACHINERY],
    "make_run_dir": [OWN_MACHINERY],
    "resume_hint": [OWN_MACHINERY],
    "exit_on_ctrl_c": [OWN_MACHINERY],
    # a refused write (disk full) ends the run in one line, as Ctrl-C does
    "WRITE_ERRORS": [OWN_MACHINERY],
    "quiet_write_errors": [OWN_MACHINERY],
    "exit_on_write_error": [OWN_MACHINERY],
    # one minibatch's gradient step: the plain form / with the all-reduce of the gradients / with the
    # 0/1 mask of fixed-shape minibatches (reset rows kept, not counted) / with the recurrent state
    "update_step": [
        ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_continuous_action_redis"],
        ["ppo_atari_multigpu"],
        ["ppo_atari_envpool", "ppo_procgen"],
        ["ppo_atari_lstm"],
        ["ppo_shared_memory_lstm"],
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
