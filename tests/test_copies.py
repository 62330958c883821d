"""The deliberately repeated pieces stay one contract: every script is in the per-piece lists the topic
tests run on, the copies meant to be the same are the same code, and the shared concepts have the same
names and shapes everywhere (read from the scripts' source, so nothing has to run)."""

import ast
import io
import re
import tokenize

import pytest

from scripts import (
    IDENTICAL,
    MULTI_PROCESS,
    NEXT_STEP_GAE,
    REPO,
    SAME_STEP_GAE,
    SCRIPTS,
    keyword_only_arguments,
    script_path,
    top_level_definitions,
    without_docstrings,
)

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


@pytest.mark.parametrize(
    "function, parameters",
    [
        ("compute_gae", ["rewards", "values", "dones", "last_value", "gamma", "gae_lambda"]),
        ("evaluate", ["agent", "args", "episodes", "deterministic", "seed", "device"]),
        ("save_checkpoint", ["path", "agent", "optimizer", "args", "iteration", "global_step"]),
        ("run_evaluation", ["path", "args"]),
        ("load_checkpoint", ["path"]),
    ],
)
def test_shared_functions_take_the_same_positional_arguments(function, parameters):
    """A call copied from one script into another either means the same or fails: the extras of a
    variant are keyword-only."""
    differing = {
        name: positional_parameters(name, function)
        for name in SCRIPTS
        if positional_parameters(name, function) != parameters
    }
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
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function
    ]


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
    for tag in (
        "perf/rollout_time",
        "perf/update_time",
        "charts/episodic_return",
        "debug/first_minibatch_ratio_deviation",
    ):
        assert any(tag in s for s in strings), f"{name} does not log {tag}"
    for old in ("perf/collection_time", "perf/learning_time", "perf/learn_time", "games=", "mean_score", "mean score"):
        assert old not in text, f"{name} still says {old}"


# READING ORDER -----------------------------------------------------------------------------------

BANNER = "# PPO ENDS HERE."
# what a reader meets before the banner (PPO), and some of what stands after it (the machinery)
ALGORITHM = ["Args", "Agent", "compute_gae", "ppo_loss", "update_step", "train"]
MACHINERY = [
    "check_args",
    "save_checkpoint",
    "read_checkpoint",
    "resume_args",
    "evaluate",
    "ProgressLine",
    "exit_on_ctrl_c",
    "exit_on_write_error",
    "main",
    "NumpyPolicy",
    "NumpyUpdate",
    "SameStepVectorEnv",
]


def training_loops(name: str) -> list[tuple[ast.FunctionDef, ast.For]]:
    """(function, loop) for every `for iteration in range(...)` in a module-level function of the script."""
    tree = ast.parse(script_path(name).read_text())
    return [
        (function, node)
        for function in tree.body
        if isinstance(function, ast.FunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and node.target.id == "iteration"
        and isinstance(node.iter, ast.Call)
        and getattr(node.iter.func, "id", None) == "range"
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_ppo_comes_first_and_its_loop_early_in_a_short_function(name):
    """The reading order of DESIGN.md: the training loop (`for iteration in range(...)` in `train`) starts by
    line 500 (750 in the multi-process scripts) in a function of at most 200 lines; one banner says where PPO
    ends, after the algorithm's pieces and before the machinery."""
    ((function, loop),) = training_loops(name)
    assert function.name == "train"
    limit = 750 if name in MULTI_PROCESS else 500
    assert loop.lineno <= limit, f"the training loop starts at line {loop.lineno}"
    assert function.end_lineno - function.lineno + 1 <= 200, (
        f"train is {function.end_lineno - function.lineno + 1} lines"
    )
    lines = script_path(name).read_text().splitlines()
    banners = [number for number, line in enumerate(lines, 1) if line.startswith(BANNER)]
    assert len(banners) == 1, banners
    definitions = DEFINITIONS[name]
    before = [piece for piece in ALGORITHM if definitions[piece].lineno > banners[0]]
    after = [piece for piece in MACHINERY if piece in definitions and definitions[piece].lineno < banners[0]]
    assert not before and not after, f"after the banner: {before}; before it: {after}"


# a timing or speed figure: a number with a unit of time, SPS, or "times faster/slower"
MEASUREMENT = re.compile(
    r"(?<![\w.])\d[\d,]*(\.\d+)?\s*(ms|us|µs|s|seconds|minutes|hours|SPS)(?!\w)"
    r"|\d(\.\d+)?x (faster|slower|the speed)"
)


def prose(name: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (also the Args fields' docstrings, which --help shows)."""
    source = script_path(name).read_text()
    texts = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return texts + [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


def test_the_measurement_pattern_finds_measurements():
    found = [
        text
        for text in (
            "takes 2.5 ms eager",
            "about 300 us",
            "54 s for 10 games",
            "3,784 SPS",
            "a 1.3x faster update",
            "1.9 ms compiled (after 9 s",
            "in 0.83 ms",
        )
        if MEASUREMENT.search(text)
    ]
    missed = [
        text
        for text in (
            "10 episodes",
            "4x this many frames",
            "2x(1, B, H)",
            "eps 1e-5",
            "27,000 steps",
            "60% of the ranks",
            "detail 2 of the 37",
        )
        if MEASUREMENT.search(text)
    ]
    assert len(found) == 7 and not missed, missed


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_timing_figures_in_docstrings_comments_or_help(name):
    """Measurements age: they live in benchmark/results/, and the code points there."""
    figures = [(line, match.group()) for line, text in prose(name) for match in MEASUREMENT.finditer(text)]
    assert not figures, figures
