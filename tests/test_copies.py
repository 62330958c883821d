"""The shape every script keeps (docs/design.md describes it), read from the scripts' source so that
nothing has to run:

- the deliberately repeated pieces (ppo_loss, compute_gae, the Atari wrappers, ...) are one contract: every
  script that has one is in its list (the topic tests run on those lists), the copies are the same text after
  the formatter, comments and docstrings included, and they stand in the same section of every script;
- the shared concepts have the same names and shapes everywhere;
- the reading order: PPO first, one banner, the loop in a short `train` that uses nothing defined below the banner
  but the package (each file's length and where its loop starts are printed, not checked: conftest.py);
- no timing figures in code: measurements live in benchmark/results/.
"""

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
)

DEFINITIONS = {name: top_level_definitions(name) for name in SCRIPTS}
SOURCES = {name: script_path(name).read_text() for name in SCRIPTS}


def test_every_training_script_is_listed():
    found = sorted(path.stem for path in REPO.glob("ppo*.py"))
    assert found == sorted(SCRIPTS)


# THE REPEATED PIECES -----------------------------------------------------------------------------


@pytest.mark.parametrize("piece", sorted(IDENTICAL))
def test_every_script_with_a_piece_is_in_its_list(piece):
    having = {name for name in SCRIPTS if piece in DEFINITIONS[name]}
    listed = [name for group in IDENTICAL[piece] for name in group]
    assert len(listed) == len(set(listed)), f"{piece}: a script is in two groups"
    assert having == set(listed), f"{piece}: defined in {sorted(having)}, listed for {sorted(listed)}"


def text_of(name: str, piece: str) -> str:
    """The source text of a top-level definition, decorators and the comment lines right above it included."""
    node, lines = DEFINITIONS[name][piece], SOURCES[name].splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while first > 0 and lines[first - 1].startswith("#") and not lines[first - 1].rstrip().endswith("-"):
        first -= 1
    return "\n".join(lines[first : node.end_lineno])


SECTION = re.compile(r"^# ([A-Z].*?) -{5,}$")


def section_of(name: str, piece: str) -> str:
    """The title of the section (`# THE NETWORK ------`) a top-level definition stands in; below the banner, the
    banner's."""
    lines = SOURCES[name].splitlines()[: DEFINITIONS[name][piece].lineno]
    titles = [
        BANNER if line.startswith(BANNER) else m[1]
        for line in lines
        if (m := SECTION.match(line)) or line.startswith(BANNER)
    ]
    return titles[-1] if titles else ""


@pytest.mark.parametrize("piece", sorted(IDENTICAL))
def test_the_copies_of_a_piece_are_the_same_text_in_the_same_section(piece):
    """Within each group the copies are textually identical (comments and docstrings included, the formatter
    having run), so a reader meets the same words for the same code in every file; a piece with more than one
    group names an intended difference (tests/scripts.py says why)."""
    for group in IDENTICAL[piece]:
        reference = group[0]
        differing = [name for name in group if text_of(name, piece) != text_of(reference, piece)]
        assert not differing, f"{piece} differs from {reference}.py's copy in {differing}"
        sections = {name: section_of(name, piece) for name in group}
        assert len(set(sections.values())) == 1, f"{piece} stands in different sections: {sections}"


def test_the_text_comparison_sees_a_comment():
    """The comparison itself: one changed comment makes two copies differ."""
    text = text_of("ppo", "ppo_loss")
    assert "#" in text and text.replace("# KL(old || new)", "# KL(new || old)") != text


def test_gae_lists_name_the_scripts_by_their_reset_convention():
    same_step = [n for n in SCRIPTS if keyword_only_arguments(n, "compute_gae") == ["final_values"]]
    next_step = [n for n in SCRIPTS if keyword_only_arguments(n, "compute_gae") == ["terminations"]]
    assert same_step == SAME_STEP_GAE and next_step == NEXT_STEP_GAE
    assert sorted(same_step + next_step) == sorted(SCRIPTS)


# ONE VOCABULARY ----------------------------------------------------------------------------------


def positional_parameters(name: str, function: str) -> list[str]:
    node = DEFINITIONS[name][function]
    return [arg.arg for arg in node.args.posonlyargs + node.args.args]


@pytest.mark.parametrize(
    "function, parameters",
    [
        ("compute_gae", ["rewards", "values", "dones", "last_value", "gamma", "gae_lambda"]),
        ("evaluate", ["checkpoint", "episodes", "deterministic", "seed"]),
        ("train", ["args", "run"]),
        ("main", ["args"]),
    ],
)
def test_shared_functions_take_the_same_positional_arguments(function, parameters):
    """A call copied from one script into another either means the same or fails: the extras of a
    variant are keyword-only."""
    differing = {
        name: positional_parameters(name, function)
        for name in SCRIPTS
        if positional_parameters(name, function)[: len(parameters)] != parameters
        or (function != "train" and len(positional_parameters(name, function)) != len(parameters))
    }
    assert not differing


def test_make_env_takes_the_same_first_arguments_and_uses_idx():
    having = [name for name in SCRIPTS if "make_env" in DEFINITIONS[name]]
    assert len(having) >= 5
    for name in having:
        assert positional_parameters(name, "make_env")[:4] == ["env_id", "idx", "capture_video", "run_dir"], name
        uses = {node.id for node in ast.walk(DEFINITIONS[name]["make_env"]) if isinstance(node, ast.Name)}
        assert "idx" in uses, f"{name}.make_env never uses idx"


@pytest.mark.parametrize("name", SCRIPTS)
def test_environments_are_made_with_the_extras_by_keyword(name):
    """make_env's and make_envs' first four arguments are the shared ones; a variant's extras (the episode limit, the
    video's name and trigger, ...) are named where they are passed."""
    calls = calls_of(name, "make_env") + calls_of(name, "make_envs")
    assert calls and not [f"{call.lineno}: {ast.unparse(call)}" for call in calls if len(call.args) > 4]


def calls_of(name: str, function: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(ast.parse(SOURCES[name]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_training_loops_call_compute_gae_by_keyword(name):
    calls = calls_of(name, "compute_gae")
    assert calls, f"{name} never calls compute_gae"
    assert all(not call.args for call in calls), f"{name} passes compute_gae positional arguments"


def optimizer_lines(source: str) -> list[str]:
    """The lines that make the optimizer: the comment above it, the learning rate's tensor and the optimizer."""
    lines = source.splitlines()
    made = [i for i, line in enumerate(lines) if "optimizer = torch.optim." in line]
    return [lines[i - 2 : i + 1] for i in made]


def test_every_script_makes_its_optimizer_in_the_same_words():
    """One text in every script, the comment that says why included (a copied one-liner, as the pieces are)."""
    made = {name: optimizer_lines(SOURCES[name]) for name in SCRIPTS}
    assert all(len(lines) == 1 for lines in made.values()), made
    texts = {"\n".join(lines[0]) for lines in made.values()}
    assert len(texts) == 1, texts
    assert next(iter(texts)).lstrip().startswith("#")


def string_constants(source: str) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


PACKAGE_STRINGS = set().union(*(string_constants(p.read_text()) for p in (REPO / "ppolab").glob("*.py")))


@pytest.mark.parametrize("name", SCRIPTS)
def test_one_vocabulary_of_metric_names_and_printed_words(name):
    """The metric names every script logs (through the package's Run, or its own code), and no old names."""
    strings = string_constants(SOURCES[name]) | PACKAGE_STRINGS
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


# READING ORDER -----------------------------------------------------------------------------

BANNER = "# PPO ENDS HERE."
# what a reader meets before the banner (PPO), and what stands after it (what is particular to the run)
ALGORITHM = ["Args", "Agent", "compute_gae", "ppo_loss", "update_step", "train"]
MACHINERY = ["check_args", "evaluate", "main"]


def training_loops(name: str, tree: ast.Module | None = None) -> list[tuple[ast.FunctionDef, ast.For]]:
    """(function, loop) for every `for iteration in range(...)` in a module-level function of the script."""
    return [
        (function, node)
        for function in (tree or ast.parse(SOURCES[name])).body
        if isinstance(function, ast.FunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and node.target.id == "iteration"
        and isinstance(node.iter, ast.Call)
        and getattr(node.iter.func, "id", None) == "range"
    ]


def banner_line(name: str) -> int:
    banners = [number for number, line in enumerate(SOURCES[name].splitlines(), 1) if line.startswith(BANNER)]
    assert len(banners) == 1, banners
    return banners[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_ppo_comes_first_and_the_loop_is_in_a_short_train(name):
    """The reading order: the training loop (`for iteration in range(...)`) is in `train`, a function of at most 200
    lines; one banner says where PPO ends, after the algorithm's pieces and before what is particular to the run.
    How long each file is and where its loop starts are printed at the end of the run (conftest.py), to watch, not
    to fail on."""
    ((function, loop),) = training_loops(name)
    assert function.name == "train"
    assert function.end_lineno - function.lineno + 1 <= 200, (
        f"train is {function.end_lineno - function.lineno + 1} lines"
    )
    banner, definitions = banner_line(name), DEFINITIONS[name]
    before = [piece for piece in ALGORITHM if definitions[piece].lineno > banner]
    after = [piece for piece in MACHINERY if definitions[piece].lineno < banner]
    assert not before and not after, f"after the banner: {before}; before it: {after}"


def names_below_the_banner_used_by_the_loop(name: str, source: str | None = None) -> set[str]:
    source = source or SOURCES[name]
    tree = ast.parse(source)
    ((_, loop),) = training_loops(name, tree)
    used = {node.id for node in ast.walk(loop) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    banner = banner_line(name)
    definitions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return {n for n in used if n in definitions and definitions[n].lineno > banner}


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_loop_uses_nothing_defined_below_the_banner(name):
    """A reader of the loop finds every name it uses above the banner, or in the package (`run.*`, `ppolab.*`):
    nothing it needs to follow stands in the part they were told they may skip."""
    assert not names_below_the_banner_used_by_the_loop(name)


def test_the_loop_check_sees_a_name_below_the_banner():
    """The check itself: `main` (below the banner in every script), called in ppo.py's loop, is seen."""
    lines = SOURCES["ppo"].splitlines()
    ((_, loop),) = training_loops("ppo")
    indent = lines[loop.lineno][: len(lines[loop.lineno]) - len(lines[loop.lineno].lstrip())]
    edited = "\n".join(lines[: loop.lineno] + [f"{indent}main()"] + lines[loop.lineno :])
    assert names_below_the_banner_used_by_the_loop("ppo", edited) == {"main"}


# THE PACKAGE'S CALLS -----------------------------------------------------------------------------


def names_imported_from_the_package(source: str) -> list[str]:
    """The package's names that `source` imports as its own (`from ppolab.x import y`, `import ppolab as p`), which
    then read as the script's: a script imports `ppolab` and its modules whole and writes `ppolab.<name>`."""
    return [
        alias.asname or alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] == "ppolab"
        or isinstance(node, ast.Import)
        for alias in node.names
        if isinstance(node, ast.ImportFrom) or (alias.name.split(".")[0] == "ppolab" and alias.asname)
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_package_name_is_written_ppolab_dot_name(name):
    assert not names_imported_from_the_package(SOURCES[name])


def test_the_import_check_sees_a_bare_name():
    """The check itself: a name imported from a module of the package, and the package under another name."""
    bare = "import ppolab\nimport ppolab.stops\nfrom ppolab.stops import launch_info\nimport ppolab.distributed as d\n"
    assert names_imported_from_the_package(bare) == ["launch_info", "d"]


# the calls whose arguments a long positional list would hide: the package's (`ppolab.*`, the run's `run.*`) and
# the update step's, each passed more than four arguments
KEYWORD_CALLS = re.compile(r"(ppolab|run)\..*|update")


def long_positional_calls(source: str) -> list[str]:
    """The package's and the update step's calls with more than four arguments that pass more than the first (the
    subject, e.g. `args`) by position, as `line: call`."""
    return [
        f"{node.lineno}: {ast.unparse(node.func)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and KEYWORD_CALLS.fullmatch(ast.unparse(node.func))
        and len(node.args) + len(node.keywords) > 4
        and len(node.args) > 1
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_long_calls_of_the_package_and_the_update_step_name_their_arguments(name):
    """`run.iteration(iteration=..., global_step=..., ...)`, not eight numbers and tensors in a row."""
    assert not long_positional_calls(SOURCES[name])


def test_the_keyword_check_sees_a_positional_call():
    calls = "run.iteration(i, step, stats, lr, values=v)\nupdate(a, b, c, d, e)\nppolab.check_args(args, a=1, b=2, c=3, d=4)"
    assert long_positional_calls(calls) == ["1: run.iteration", "2: update"]


# NO MEASUREMENTS IN CODE -------------------------------------------------------------------------

# a timing or speed figure: a number with a unit of time, SPS, or "times faster/slower"
MEASUREMENT = re.compile(
    r"(?<![\w.])\d[\d,]*(\.\d+)?\s*(ms|us|µs|s|seconds|minutes|hours|SPS)(?!\w)"
    r"|\d(\.\d+)?x (faster|slower|the speed)"
)


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (also the Args fields' docstrings, which --help shows)."""
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


@pytest.mark.parametrize("name", SCRIPTS + ["ppolab"])
def test_no_timing_figures_in_docstrings_comments_or_help(name):
    """Measurements age: they live in benchmark/results/, and the code points there."""
    files = sorted((REPO / "ppolab").glob("*.py")) if name == "ppolab" else [script_path(name)]
    figures = [
        (path.name, line, match.group())
        for path in files
        for line, text in prose(path.read_text())
        for match in MEASUREMENT.finditer(text)
    ]
    assert not figures, figures
