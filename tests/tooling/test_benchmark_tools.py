"""The benchmark toolbox as a newcomer meets it: every tool (found on disk, not listed here) runs as
`python -m benchmark.<name>` and answers --help; no tool borrows a helper from another tool (the shared helpers are
benchmark.scripts and benchmark.events); benchmark/README.md names every tool; and every command that a results file
or a doc gives runs a tool that exists, with one of its subcommands."""

import ast
import re
import subprocess
import sys

import pytest

from scripts import REPO

BENCHMARK = REPO / "benchmark"
SHARED = {"benchmark.scripts", "benchmark.events"}  # the helpers: no command line, imported by any tool
# what the other tools build on: the runner's jobs and the reading of run folders
FOUNDATIONS = {"benchmark.run_seeds", "benchmark.scores"}
# a tool's own part in a module of its own: tune's search spaces; the GPU benchmark's measuring, which side_by_side
# runs beside CleanRL's and LeanRL's files on the same host
PARTS = {"benchmark.tune": {"benchmark.tune_space"}, "benchmark.side_by_side": {"benchmark.gpu"}}


def modules() -> dict[str, str]:
    """{dotted name: source} of every module of benchmark/ and benchmark/studies/."""
    paths = sorted(BENCHMARK.glob("*.py")) + sorted((BENCHMARK / "studies").glob("*.py"))
    return {
        ".".join(path.relative_to(REPO).with_suffix("").parts): path.read_text()
        for path in paths
        if path.name != "__init__.py"
    }


TOOLS = sorted(set(modules()) - SHARED - {"benchmark.tune_space"})


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """Every tool's --help, run at once in fresh processes."""
    started = {
        tool: subprocess.Popen(
            [sys.executable, "-m", tool, "--help"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for tool in TOOLS
    }
    return {tool: (process.wait(timeout=300), *process.communicate()) for tool, process in started.items()}


def test_the_tools_are_found_and_the_studies_are_grouped_apart():
    assert {"benchmark.run_seeds", "benchmark.scores", "benchmark.full_budget", "benchmark.tune"} <= set(TOOLS)
    assert {"benchmark.studies.speed", "benchmark.studies.scaling", "benchmark.studies.cleanrl"} <= set(TOOLS)
    assert not list(BENCHMARK.glob("*scaling*.py")) and not list(BENCHMARK.glob("*cleanrl*.py"))


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_answers_help_as_python_m(helps, tool):
    code, out, err = helps[tool]
    assert code == 0 and out.startswith("usage: "), f"python -m {tool} --help: exit {code}\n{out}{err}"


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_tool_imports_another_tool_for_a_helper(name):
    imported = set()
    for node in ast.walk(ast.parse(modules()[name])):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "benchmark":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            imported |= {n for n in names if n in modules()} or {node.module}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.split(".")[0] == "benchmark"}
    allowed = SHARED | PARTS.get(name, set()) | (set() if name in SHARED | FOUNDATIONS else FOUNDATIONS)
    assert imported - {name} <= allowed, f"{name} imports {sorted(imported - allowed - {name})}"


def test_the_readme_names_every_tool():
    readme = (BENCHMARK / "README.md").read_text()
    missing = [tool for tool in TOOLS if f"python -m {tool}" not in readme]
    assert not missing, f"benchmark/README.md's table lacks {missing}"


def documents():
    return sorted(BENCHMARK.glob("results/*.md")) + sorted(REPO.glob("docs/*.md")) + [BENCHMARK / "README.md"]


def test_every_command_in_the_results_and_docs_runs_a_tool_that_exists(helps):
    """`python -m benchmark.X SUB` names a tool, and where its usage offers subcommands (a positional {a,b}), one
    of them; no
    tool is run as a file."""
    wrong = []
    for path in documents():
        text = path.read_text()
        for tool, word in re.findall(r"python -m (benchmark(?:\.\w+)+)(?: +([\w-]+))?", text):
            if tool not in TOOLS:
                wrong.append(f"{path.name}: python -m {tool}")
                continue
            usage = helps[tool][1].split("\n\n")[0]
            while re.search(r"\[[^][]*\]", usage):  # the options, [--x {a,b}] among them: the positionals stay
                usage = re.sub(r"\[[^][]*\]", "", usage)
            choices = re.search(r"\{([\w,-]+)\}", usage)
            if choices and word and word not in choices.group(1).split(","):
                wrong.append(f"{path.name}: python -m {tool} {word} (subcommands: {choices.group(1)})")
        wrong += [f"{path.name}: {found}" for found in re.findall(r"python benchmark/\S+\.py", text)]
    assert not wrong, "\n".join(sorted(set(wrong)))
