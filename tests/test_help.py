"""Every flag's help, as `python <script> --help` shows it, is one line of at most 160 characters that says what
the flag does: no file names, no names of the package's internals, no measurement history, nothing about the
environments of another script. What needs more words is in docs/flags.md.

tyro prints a field's docstring as it is written, line breaks included, so the help is read from the field
docstrings of each script's `Args` and of the `ppolab.RunSettings` it inherits, the most derived one where a
script declares a setting again (as tyro does).
"""

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap

import pytest

from scripts import SCRIPTS

MAX_LENGTH = 160

# the environments each script trains; its help names no others
ENVIRONMENTS = {
    "classic control": ["classic control", "classic-control", "CartPole", "Acrobot", "MountainCar"],
    "MuJoCo": ["MuJoCo", "Hopper", "HalfCheetah", "Walker2d"],
    "Atari": ["Atari", "ALE", "Breakout", "Pong"],
    "Procgen": ["Procgen", "starpilot", "Starpilot"],
}
TRAINS = {
    "ppo": ["classic control"],
    "ppo_continuous_action": ["MuJoCo"],
    "ppo_atari": ["Atari"],
    "ppo_atari_lstm": ["Atari"],
    "ppo_atari_envpool": ["Atari"],
    "ppo_procgen": ["Procgen"],
    "ppo_atari_multigpu": ["Atari"],
    "ppo_shared_memory_lstm": ["classic control", "Atari"],
    "ppo_continuous_action_redis": ["MuJoCo"],
}
# names a user knows without reading the code (a CamelCase word otherwise names a class of the code)
KNOWN_NAMES = {"PyTorch", "NumPy", "TensorBoard", "MuJoCo", "CartPole", "MountainCar", "HalfCheetah"}
NOT_IN_HELP = [
    (re.compile(r"[\w/.-]+\.(md|py|json|sh|txt|csv)\b|\b(benchmark|results|tests|docs)/"), "a file name"),
    (re.compile(r"\bppolab\b"), "the package"),
    (re.compile(r"\b[A-Z][a-z0-9]+[A-Z]\w*(?!-v\d)\b"), "a class name"),
    (
        re.compile(
            r"measur|\b20\d\d-\d\d-\d\d\b|\b(first|second|third|fourth|fifth|sixth|seventh|eighth)\s+(and|run|try)"
        ),
        "history",
    ),
    (re.compile(r"\b(above|below)\b"), "a place in the source"),
]


def problems(text: str | None, script: str) -> list[str]:
    """What is wrong with `text` as the help of a flag of `script`."""
    if text is None:
        return ["no help"]
    found = ["more than one line"] if "\n" in text else []
    if len(text) > MAX_LENGTH:
        found.append(f"longer than {MAX_LENGTH} characters: {len(text)}")
    for pattern, what in NOT_IN_HELP:
        found += [
            f"{what}: {match.group()}"
            for match in pattern.finditer(text)
            if not (what == "a class name" and match.group() in KNOWN_NAMES)
        ]
    for environments, words in ENVIRONMENTS.items():
        if environments not in TRAINS[script]:
            found += [f"another script's environments: {w}" for w in words if re.search(rf"\b{re.escape(w)}", text)]
    return found


def declared_help(cls) -> dict[str, str | None]:
    """field -> its docstring (None if it has none), for the fields that the dataclass `cls` declares itself."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        field.target.id: following.value.value
        if isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
        else None
        for field, following in zip(body, body[1:] + [None])
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
    }


def flag_help(name: str) -> dict[str, str | None]:
    """Every field of the script's Args (a flag) -> its help."""
    args = importlib.import_module(name).Args
    found = {}
    for cls in reversed(args.__mro__):
        if dataclasses.is_dataclass(cls):
            found.update(declared_help(cls))
    return {field.name: found.get(field.name) for field in dataclasses.fields(args)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_one_line_of_help_for_users(name):
    bad = {flag: found for flag, text in flag_help(name).items() if (found := problems(text, name))}
    assert not bad, bad


def test_the_check_sees_what_does_not_belong_in_help():
    """The check itself, on help texts that each break one rule."""
    for text, script, what in [
        ("CPU threads for PyTorch; the default is chosen in\n    the results", "ppo", "more than one line"),
        ("the number of parallel game environments " * 5, "ppo", "longer than"),
        ("each evaluation pauses training; its cost is in benchmark/results/evaluation.md", "ppo", "a file name"),
        ("2048 by default, as ppo_continuous_action.py", "ppo_continuous_action_redis", "a file name"),
        ("run the update in NumPy (NumpyPolicy, NumpyUpdate)", "ppo", "a class name"),
        ("off: ppolab.distributed.CommTimer says what is measured", "ppo_atari_multigpu", "the package"),
        ("faster on an idle machine (seventh and eighth measurements)", "ppo_atari_envpool", "history"),
        ("idle threads sleeping (OMP_WAIT_POLICY above)", "ppo_atari", "a place in the source"),
        ("the Atari scripts' limit of a game, as in Procgen", "ppo_continuous_action", "another script's"),
        (None, "ppo", "no help"),
    ]:
        assert any(found.startswith(what) for found in problems(text, script)), (text, what)
    for text, script in [
        ("the Atari game: `Breakout` (read as `BreakoutNoFrameskip-v4`), or `ALE/Breakout-v5`", "ppo_atari"),
        ("if toggled, the final model is saved to `runs/<run>/model.pt` and evaluated", "ppo"),
        ("CPU threads for PyTorch and NumPy's BLAS (0 keeps their defaults)", "ppo_procgen"),
    ]:
        assert not problems(text, script), text
