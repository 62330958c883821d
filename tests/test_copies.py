"""The deliberately repeated pieces stay one contract: every script is in the per-piece lists the topic
tests run on, the copies meant to be the same are the same code, and the shared concepts have the same
names and shapes everywhere (read from the scripts' source, so nothing has to run)."""

import ast

import pytest

from scripts import (IDENTICAL, NEXT_STEP_GAE, REPO, SAME_STEP_GAE, SCRIPTS, keyword_only_arguments, script_path,
                     top_level_definitions, without_docstrings)

DEFINITIONS = {name: top_level_definitions(name) for name in SCRIPTS}


def test_every_training_script_is_listed():
    found = sorted(path.stem for path in REPO.glob("ppo*.py"))
    assert found == sorted(SCRIPTS)


@pytest.mark.parametrize("piece", sorted(IDENTICAL))
def test_every_script_with_a_piece_is_in_its_list(piece):
    having = {name for name in SCRIPTS if piece in DEFINITIONS[name]}
    listed = [name for group in IDENTICAL[piece] for name in group]
    assert len(listed) == len(set(listed)), f"{piece}: a script is in two groups"
    assert having == set(listed), f"{piece}: defined in {sorted(having)}, listed for {sorted(listed)}"


def test_gae_lists_name_the_scripts_by_their_reset_convention():
    same_step = [n for n in SCRIPTS if keyword_only_arguments(n, "compute_gae") == ["final_values"]]
    next_step = [n for n in SCRIPTS if keyword_only_arguments(n, "compute_gae") == ["terminations"]]
    assert same_step == SAME_STEP_GAE and next_step == NEXT_STEP_GAE
    assert sorted(same_step + next_step) == sorted(SCRIPTS)


@pytest.mark.parametrize("piece", sorted(IDENTICAL))
def test_copies_meant_to_be_the_same_are_the_same(piece):
    for group in IDENTICAL[piece]:
        codes = {name: without_docstrings(DEFINITIONS[name][piece]) for name in group}
        reference = group[0]
        differing = [name for name in group if codes[name] != codes[reference]]
        assert not differing, f"{piece} differs from {reference}.py's copy in {differing}"


def positional_parameters(name: str, function: str) -> list[str]:
    node = DEFINITIONS[name][function]
    return [arg.arg for arg in node.args.posonlyargs + node.args.args]


@pytest.mark.parametrize("function, parameters", [
    ("compute_gae", ["rewards", "values", "dones", "last_value", "gamma", "gae_lambda"]),
    ("evaluate", ["agent", "args", "episodes", "deterministic", "seed", "device"]),
    ("save_checkpoint", ["path", "agent", "optimizer", "args", "iteration", "global_step"]),
    ("run_evaluation", ["path", "args"]),
    ("load_checkpoint", ["path"]),
])
def test_shared_functions_take_the_same_positional_arguments(function, parameters):
    """A call copied from one script into another either means the same or fails: the extras of a
    variant are keyword-only."""
    differing = {name: positional_parameters(name, function) for name in SCRIPTS
                 if positional_parameters(name, function) != parameters}
    assert not differing


def test_make_env_takes_the_same_first_arguments_and_uses_idx():
    having = [name for name in SCRIPTS if "make_env" in DEFINITIONS[name]]
    assert len(having) >= 5
    for name in having:
        assert positional_parameters(name, "make_env")[:4] == ["env_id", "idx", "capture_video", "run_dir"], name
        uses = {node.id for node in ast.walk(DEFINITIONS[name]["make_env"]) if isinstance(node, ast.Name)}
        assert "idx" in uses, f"{name}.make_env never uses idx"


def calls_of(name: str, function: str) -> list[ast.Call]:
    tree = ast.parse(script_path(name).read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == function]


@pytest.mark.parametrize("name", SCRIPTS)
def test_training_loops_call_compute_gae_by_keyword(name):
    calls = calls_of(name, "compute_gae")
    assert calls, f"{name} never calls compute_gae"
    assert all(not call.args for call in calls), f"{name} passes compute_gae positional arguments"


def string_constants(name: str) -> set[str]:
    tree = ast.parse(script_path(name).read_text())
    strings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    return strings


@pytest.mark.parametrize("name", SCRIPTS)
def test_one_vocabulary_of_metric_names_and_printed_words(name):
    strings = string_constants(name)
    text = "\n".join(strings)
    for tag in ("perf/rollout_time", "perf/update_time", "charts/episodic_return",
                "debug/first_minibatch_ratio_deviation"):
        assert any(tag in s for s in strings), f"{name} does not log {tag}"
    for old in ("perf/collection_time", "perf/learning_time", "perf/learn_time", "games=", "mean_score",
                "mean score"):
        assert old not in text, f"{name} still says {old}"
