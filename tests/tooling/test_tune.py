"""benchmark.tune: a tiny study of ppo.py on CartPole-v1 completes and writes its report, a second worker joins it
through the same SQLite file, a pruned trial's runs end on SIGTERM and its folder says so, the verdict runs the best
setting and the defaults on fresh seeds, and bad input (a storage URL, a script flag) ends in one line; then the
pieces on their own: the search spaces (every default value one its script takes), the space file, the score
ranges, the heartbeat of both kinds of storage, the Redis journal storage, the importances picture."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import ppolab
from benchmark.events import read_scalars
from benchmark.run_seeds import Job, start
from benchmark.scripts import import_script
from benchmark.tune import (
    check_setting,
    fail_stale,
    main,
    open_storage,
    parse_flags,
    plot_importances,
    redact,
    verdict_rule,
    write_report,
)
from benchmark.tune_space import SPACES, SpaceError, as_flags, min_max, read_space, sample, score_range
from helpers import alive, still_alive
from scripts import REPO

pytestmark = pytest.mark.exclusive  # trials side by side, heartbeats and SIGTERM

STEPS = "2048"  # one iteration of ppo.py's largest batch in its space (4 environments x 512 steps)


def tune(*argv, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "benchmark.tune", *map(str, argv)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def tiny(runs_dir, trials, *extra):
    return tune("ppo", "--env-id", "CartPole-v1", "--trials", trials, "--runs-dir", runs_dir, "--study", "tiny",
                "--poll", "1", *extra, "--", "--total-timesteps", STEPS, "--no-cuda")  # fmt: skip


def load(runs_dir, name="tiny"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{runs_dir / name / 'optuna.db'}")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A tiny study of two trials, run once for the tests that read it."""
    runs_dir = tmp_path_factory.mktemp("tune")
    result = tiny(runs_dir, 2)
    assert result.returncode == 0, result.stdout + result.stderr
    return runs_dir, result


def test_a_tiny_study_completes_and_writes_its_outputs(study_dir):
    runs_dir, result = study_dir
    study = load(runs_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        record = json.loads((runs_dir / "tiny" / f"trial-{trial.number:04d}" / "trial.json").read_text())
        assert record["state"] == "COMPLETE" and record["params"] == trial.params
        # the value: the run's last 100 episodes' mean return, from its events, normalised by CartPole's [0, 500]
        (run_dir,) = record["run_folders"]
        returns = [v for _, v in read_scalars(run_dir)["charts/episodic_return"]]
        assert trial.value == pytest.approx(np.mean(returns[-100:]) / 500)
        log = (runs_dir / "tiny" / f"trial-{trial.number:04d}" / "logs" / "CartPole-v1__1.log").read_text()
        assert log.startswith("$ ") and " ".join(as_flags(trial.params)) in log.splitlines()[0]
    best = max(study.trials, key=lambda t: t.value)
    command = result.stdout.split(f"best: trial {best.number}, value {best.value:.4f}:\n", 1)[1].splitlines()[0]
    assert (
        command
        == f"python ppo.py {' '.join(as_flags(best.params))} --total-timesteps {STEPS} --no-cuda --env-id CartPole-v1"
    )
    report = (runs_dir / "tiny" / "report.md").read_text()
    assert f"Best: trial {best.number}" in report and command in report
    rows = [line for line in report.splitlines() if re.match(r"\| \d+ \| complete \|", line)]
    assert len(rows) == 2 and all("learning-rate" in report and "CartPole-v1" in report for _ in rows)


def test_a_second_worker_joins_the_study_through_the_same_storage(study_dir, capsys):
    runs_dir, _ = study_dir
    joined = tiny(runs_dir, 3)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "2 of 3 trials finished" in joined.stdout and "trial 2 COMPLETE" in joined.stdout
    assert "trial 0 " not in joined.stdout and "trial 1 " not in joined.stdout  # not run again
    summaries = optuna.get_all_study_summaries(f"sqlite:///{runs_dir / 'tiny' / 'optuna.db'}")
    assert [s.study_name for s in summaries] == ["tiny"] and len(load(runs_dir).trials) == 3
    assert (runs_dir / "tiny" / "trial-0002" / "trial.json").is_file()
    # a worker with another setting does not join it
    with pytest.raises(SystemExit, match="2"):
        main(["ppo", "--env-id", "CartPole-v1", "--trials", "4", "--runs-dir", str(runs_dir), "--study", "tiny",
              "--", "--total-timesteps", "4096", "--no-cuda"])  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("tune: error: the study tiny was started with other flags after -- (")
    assert len(load(runs_dir).trials) == 3


def test_a_pruned_trials_run_ends_on_sigterm_and_its_folder_says_so(tmp_path):
    # a pruner that stops every trial at its first report (no normalised score reaches 2): the real pruning path
    result = tune("ppo", "--env-id", "CartPole-v1", "--trials", 1, "--runs-dir", tmp_path, "--study", "pruned",
                  "--pruner", "threshold:2", "--warmup", 0, "--reports", 20, "--poll", 0.5,
                  "--", "--total-timesteps", 400_000, "--no-cuda")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads((tmp_path / "pruned" / "trial-0000" / "trial.json").read_text())
    assert record["state"] == "PRUNED" and record["stopped"].startswith(
        "stopped by the pruner at step 20,000 of 400,000"
    )
    assert 20_000 <= record["steps"] < 400_000 == record["budget"]
    (pid,) = record["pids"]
    assert not alive(pid)
    log = (tmp_path / "pruned" / "trial-0000" / "logs" / "CartPole-v1__1.log").read_text()
    assert "ppo.py: terminated (SIGTERM)" in log.splitlines()[-1]  # the run said it was stopped, as on SIGTERM
    (trial,) = load(tmp_path, "pruned").trials
    assert trial.state == TrialState.PRUNED and trial.intermediate_values and trial.user_attrs["pruned_by_pruner"]
    assert "The pruner stopped 1 trial: they ran " in (tmp_path / "pruned" / "report.md").read_text()


def test_the_verdict_runs_the_best_and_the_defaults_on_fresh_seeds(study_dir, tmp_path, capsys):
    runs_dir, _ = study_dir
    study = load(runs_dir)
    out = tmp_path / "results" / "tune_tiny.md"
    verdict = ["verdict", "--study", "tiny", "--runs-dir", str(runs_dir), "--out", str(out), "--workers", "2"]
    with pytest.raises(SystemExit, match="2"):
        main([*verdict, "--seeds", "1", "7"])
    assert capsys.readouterr().err == "tune: error: seeds [1] were used while tuning: give fresh ones\n"
    main([*verdict, "--seeds", "7"])
    text = out.read_text()
    best = max((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert text.index("## Verdict") > text.index(f"Best: trial {best.number}")
    rows = {row.split(" | ")[1]: row for row in text.splitlines() if row.startswith("| CartPole-v1 |")}
    assert set(rows) == {"default", "tuned"}
    logs = runs_dir / "tiny" / "verdict" / "logs"
    assert " ".join(as_flags(best.params)) in (logs / "tuned" / "CartPole-v1__7.log").read_text().splitlines()[0]
    assert "--learning-rate" not in (logs / "default" / "CartPole-v1__7.log").read_text().splitlines()[0]
    assert (out.parent / "tune_tiny_CartPole-v1.png").is_file()
    assert f"python -m benchmark.tune verdict --study tiny --runs-dir {runs_dir} --out {out}" in text  # its own command
    capsys.readouterr()
    main([*verdict, "--seeds", "7"])  # again: the finished runs are kept, not run again
    assert "0 runs to do" in capsys.readouterr().out


def test_a_bad_storage_url_ends_in_one_line(tmp_path):
    result = tune("ppo", "--env-id", "CartPole-v1", "--trials", 1, "--runs-dir", tmp_path,
                  "--storage", "nosuchdb://me:secret@host/x")  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "tune: error: --storage nosuchdb://me:***@host/x: NoSuchModuleError: Can't load plugin: "
        "sqlalchemy.dialects:nosuchdb\n"
    )
    assert not any(tmp_path.iterdir())  # no study began


REFUSED = "ppo.py refuses the setting (the flags after --, an --env-id): "


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--", "--no-such-flag", "3"], REFUSED + "unknown flag --no-such-flag\n"),
        (["--", "--num-minibatches", "7"], REFUSED + "--num-minibatches 7 does not divide the batch size 512 "),
        (["--", "--seed", "3"], "--seed after --: the tuner gives each run its --env-id, --seed and --runs-dir itself"),
        (["--storage", "redis://:secret@127.0.0.1:1/0"], "--storage redis://:***@127.0.0.1:1/0: ConnectionError: "),
        (["--pruner", "mean"], "--pruner mean: median, none or threshold:LOW (a number)"),
    ],
    ids=["unknown-flag", "refused-value", "own-flag", "redis", "pruner"],
)
def test_bad_input_ends_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit, match="2"):
        main(["ppo", "--env-id", "CartPole-v1", "--trials", "1", "--runs-dir", str(tmp_path), *argv])
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"tune: error: {message}") and captured.err.count("\n") == 1
    assert "secret" not in captured.err and not any(tmp_path.iterdir())
    with pytest.raises(SystemExit, match="2"):
        main(["ppx", "--env-id", "CartPole-v1", "--trials", "1"])
    assert capsys.readouterr().err.startswith("tune: error: unknown script 'ppx': one of ppo, ppo_continuous_action")


# THE PIECES ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, env_id",
    [
        ("ppo", "CartPole-v1"),
        ("ppo_continuous_action", "HalfCheetah-v4"),
        ("ppo_continuous_action_redis", "HalfCheetah-v4"),
        ("ppo_shared_memory_lstm", "CartPole-v1"),
        ("ppo_procgen", "starpilot"),
        ("ppo_atari_lstm", "Breakout"),  # the Atari space's strictest script: a minibatch is whole environments
    ],
)
def test_every_rollout_and_minibatch_size_of_a_space_is_one_its_script_takes(script, env_id, monkeypatch):
    """Every combination of the space's sizes passes the script's own checks (and every flag of the space is one
    of the script's): a default space never samples a setting the script refuses."""
    monkeypatch.setattr(ppolab, "check_atari_game", lambda *args: None)  # the sizes are under test, not the game
    module = import_script(script)
    space = SPACES[script]
    assert all(name.replace("-", "_") in module.Args.__dataclass_fields__ for name in space)
    sizes = [name for name in ("num-steps", "num-chunks", "num-minibatches") if name in space]
    grid = np.array(np.meshgrid(*[space[name]["choices"] for name in sizes])).reshape(len(sizes), -1).T
    refused = []
    for values in grid:
        argv = [arg for name, value in zip(sizes, values) for arg in (f"--{name}", str(value))]
        _, problem = check_setting(module, [*argv, "--total-timesteps", "100000000"], [env_id])
        refused += [f"{argv}: {problem}"] if problem else []
    assert refused == []


def test_the_checks_are_the_scripts_own(monkeypatch):
    module = import_script("ppo")
    assert check_setting(module, ["--num-minibatches", "7"], ["CartPole-v1"]) == (
        None,
        "--num-minibatches 7 does not divide the batch size 512 (--num-envs 4 x --num-steps 128)",
    )
    assert parse_flags(module.Args, ["--policy-objective", "x"]) == (
        None,
        "--policy-objective: 'x' is not one of clip, adaptive-kl, fixed-kl",
    )


class Trial:
    """What `sample` asks of an Optuna trial, answered from a dict (the first choice, or low, when not in it)."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.values.get(name, choices[0])

    def suggest_int(self, name, low, high, step=1, log=False):
        self.asked.append(name)
        return self.values.get(name, low)

    def suggest_float(self, name, low, high, step=None, log=False):
        self.asked.append(name)
        return self.values.get(name, low)


def test_a_conditional_flag_is_sampled_only_with_its_condition():
    space = SPACES["ppo_continuous_action"]
    clip, adaptive = Trial({"policy-objective": "clip"}), Trial({"policy-objective": "adaptive-kl"})
    assert "kl-target" not in sample(clip, space) and "kl-beta" not in clip.asked
    params = sample(adaptive, space)
    assert params["kl-target"] == 0.003 and "kl-beta" not in params and "distribution" in params
    assert as_flags({"num-steps": 64, "norm-adv": False, "anneal-lr": True}) == [
        "--num-steps",
        "64",
        "--no-norm-adv",
        "--anneal-lr",
    ]


def test_a_space_file_changes_adds_and_removes_flags(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text(
        "distribution = false\n\n[learning-rate]\nlow = 1e-4\nhigh = 1e-3\nlog = true\n\n"
        '[norm-adv]\nchoices = [true, false]\n\n[kl-beta]\nchoices = [1.0]\nwhen = {policy-objective = "fixed-kl"}\n'
    )
    space = read_space(path, SPACES["ppo_continuous_action"])
    assert "distribution" not in space and space["learning-rate"] == {"low": 1e-4, "high": 1e-3, "log": True}
    assert list(space)[-1] == "norm-adv" and space["num-steps"] == SPACES["ppo_continuous_action"]["num-steps"]
    (tmp_path / "only.json").write_text(json.dumps({"inherit": False, "gamma": {"choices": [0.99, 0.999]}}))
    assert read_space(tmp_path / "only.json", SPACES["ppo"]) == {"gamma": {"choices": [0.99, 0.999]}}
    for text, message in [
        ("[gamma]\nlow = 1\nhigh = 0.9\n", "[gamma] needs numbers low < high"),
        ("[gamma]\nchoices = []\n", "[gamma]: choices must be a non-empty list"),
        ("[ent-coef]\nlow = 0.0\nhigh = 0.1\nlog = true\n", "[ent-coef]: log = true needs low > 0"),
        ("[gamma]\nchoice = [0.9]\n", "[gamma] has unknown keys ['choice']"),
        (
            'inherit = false\n[kl-beta]\nchoices = [1.0]\nwhen = {policy-objective = "fixed-kl"}\n',
            "[kl-beta]: when names policy-objective",
        ),  # fmt: skip
        ("[gamma\n", "cannot read"),
    ]:
        path.write_text(text)
        with pytest.raises(SpaceError, match=re.escape(message)):
            read_space(path, SPACES["ppo"])


def test_a_space_file_naming_a_flag_the_script_lacks_is_one_line(tmp_path, capsys):
    (tmp_path / "space.toml").write_text("[distribution]\nchoices = ['normal']\n")
    with pytest.raises(SystemExit, match="2"):
        main(["ppo", "--env-id", "CartPole-v1", "--trials", "1", "--space", str(tmp_path / "space.toml")])
    assert capsys.readouterr().err == "tune: error: the search space names --distribution, which ppo.py does not have\n"


def test_the_score_ranges():
    assert score_range("HalfCheetah-v4") == score_range("HalfCheetah-v5") == (-280.178953, 12135.0)
    assert score_range("ALE/Pong-v5") == score_range("PongNoFrameskip-v4") == score_range("Pong") == (-20.7, 14.6)
    assert score_range("Breakout-v5") == (1.7, 30.5) and score_range("dm_control/walker-walk-v0") == (0.0, 1000.0)
    assert score_range("CartPole-v1") == (0.0, 500.0) and score_range("NoSuch-v0") is None
    assert score_range("CartPole-v1", {"CartPole-v1": (10.0, 20.0)}) == (10.0, 20.0)
    assert min_max(250.0, (0.0, 500.0)) == 0.5 and min_max(-110.0, (-200.0, 0.0)) == 0.45


def test_the_verdict_rule_is_welchs_t_test():
    assert verdict_rule([10, 12, 14], [5, 6, 7]) == "better (Welch's t-test: p = 0.02)"
    assert verdict_rule([5, 6, 7], [10, 12, 14]) == "worse (Welch's t-test: p = 0.02)"
    assert verdict_rule([10, 12, 14], [10.5, 11, 11.5]) == "undecided (Welch's t-test: p = 0.48)"
    assert verdict_rule([500, 500], [200, 200]) == "better (every seed the same score on each side: no spread to test)"
    assert verdict_rule([500, 500], [500, 500]).startswith("undecided (every seed the same score")
    assert verdict_rule([3.0], [1.0, 2.0]) == "no verdict (one seed on a side: shown, not judged)"


def test_the_published_halfcheetah_verdict_says_what_the_rule_says_of_its_per_seed_scores():
    """benchmark/results/tune_halfcheetah.md: each setting's mean ± sample std and the tuned row's verdict are what
    the per-seed scores in the same table give (Welch's t-test, ddof 1), and the README says the same verdict."""
    text = (REPO / "benchmark" / "results" / "tune_halfcheetah.md").read_text()
    pattern = r"^\| HalfCheetah-v4 \| (default|tuned) \| ([-\d., ]+) \| ([^|]+) \| ([^|]*) \|$"
    rows = {found[0]: found[1:] for found in re.findall(pattern, text, re.M)}
    assert sorted(rows) == ["default", "tuned"], text
    scores = {name: [float(v) for v in cells[0].split(", ")] for name, cells in rows.items()}
    assert all(len(values) == 3 for values in scores.values())
    for name, values in scores.items():  # (from the scores as printed, to a tenth: the file's come from unrounded ones)
        mean, std = (float(v) for v in rows[name][1].split(" ± "))
        assert mean == pytest.approx(np.mean(values), abs=0.1) and std == pytest.approx(np.std(values, ddof=1), abs=0.1)
    said = verdict_rule(scores["tuned"], scores["default"])
    assert rows["tuned"][2].strip() == said and rows["default"][2].strip() == ""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"{said.split(' (')[0]} by Welch's t-test" in readme  # e.g. "undecided by Welch's t-test"


def test_the_committed_halfcheetah_study_reopens_and_gives_the_published_trials(tmp_path, capsys):
    """The study's database is in the repository: `report` reopens it, and its trials table and best trial are the
    results file's."""
    committed = (REPO / "benchmark" / "results" / "tune_halfcheetah.md").read_text()
    database = tmp_path / "tune_halfcheetah.db"  # a copy: opening a study may write to its file
    database.write_bytes((REPO / "benchmark" / "results" / "tune_halfcheetah.db").read_bytes())
    main(["report", "--study", "tune_halfcheetah", "--storage", str(database), "--out", str(tmp_path / "report.md")])
    capsys.readouterr()
    report = (tmp_path / "report.md").read_text()

    def trials(text: str) -> list[str]:
        return [line for line in text.splitlines() if re.match(r"\| \d+ \| (complete|pruned|fail)", line)]

    assert len(trials(committed)) >= 30 and trials(report) == trials(committed)
    best = re.search(r"^Best: trial \d+, value [\d.]+\.$", report, re.M)
    assert best and best[0] in committed


def fake_study(path, name="fake"):
    """A study in the SQLite file `path` as the tuner leaves one: its setting, two complete trials and a pruned one."""
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name=name, direction="maximize")
    attrs = {"script": "ppo", "env_ids": ["CartPole-v1"], "seeds": [1], "last": 100, "total_timesteps": 2048,
             "score_ranges": {"CartPole-v1": [0.0, 500.0]}, "command": "python -m benchmark.tune ppo ...",
             "machine": "host: a CPU", "space": {"learning-rate": {}}, "flags": ["--total-timesteps", "2048"]}  # fmt: skip
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    lr = optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)
    for value, rate, state in [(0.2, 1e-3, TrialState.COMPLETE), (0.8, 3e-4, TrialState.COMPLETE),
                               (0.1, 1e-2, TrialState.PRUNED)]:  # fmt: skip
        command = f"python ppo.py --learning-rate {rate} --total-timesteps 2048 --env-id CartPole-v1"
        study.add_trial(optuna.trial.create_trial(
            params={"learning-rate": rate}, distributions={"learning-rate": lr}, state=state,
            value=value if state == TrialState.COMPLETE else None, intermediate_values={1024: value},
            user_attrs={"command": command, "scores": {"CartPole-v1 seed 1": 500 * value}, "steps": 2048},
        ))  # fmt: skip
    return study


def test_the_report_reopens_a_study_from_its_database_file_in_the_repository(tmp_path, monkeypatch, capsys):
    """A study kept in a file named by its path inside the repository (here: the test's folder, where the command
    runs) is reopened by `report`, and the report names the file by that path, no machine's folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    fake_study(tmp_path / "results" / "tune_fake.db")
    main(["report", "--study", "fake", "--storage", "results/tune_fake.db", "--out", "results/tune_fake.md"])
    out = capsys.readouterr().out
    assert out == (
        "best: trial 1, value 0.8000:\npython ppo.py --learning-rate 0.0003 --total-timesteps 2048 --env-id CartPole-v1\n"
        "report: results/tune_fake.md\n"
    )
    text = (tmp_path / "results" / "tune_fake.md").read_text()
    assert "Study `fake` (sqlite:///results/tune_fake.db), written " in text and str(tmp_path) not in text
    assert "3 trials: 2 complete, 1 pruned, 0 failed, 0 running." in text and "Best: trial 1, value 0.8000." in text
    assert re.search(r"^\| 1 \| complete \| 0\.8000 \| 400\.0 \| 0\.0003 \|", text, re.M), text
    assert "Parameter importances: not drawn (2 complete trials, and they are drawn from 10)." in text
    # a file that is not there is one line, and is not made
    with pytest.raises(SystemExit, match="2"):
        main(["report", "--study", "fake", "--storage", "results/none.db"])
    assert capsys.readouterr().err == "tune: error: --storage results/none.db: no such file\n"
    assert not (tmp_path / "results" / "none.db").exists()


def test_redact():
    assert redact("postgresql://me:pw@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert (
        redact("redis://:pw@host:6379/0") == "redis://:***@host:6379/0" and redact("sqlite:///a.db") == "sqlite:///a.db"
    )


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_dead_workers_trial_fails_on_either_kind_of_heartbeat(tmp_path):
    """A database keeps Optuna's heartbeat; another storage (a journal) the trial's `heartbeat` attribute: either way
    a running trial whose worker stopped beating is failed by the next worker, one still beating is left alone."""
    database = open_storage(f"sqlite:///{tmp_path / 'x.db'}", heartbeat=1)
    journal = optuna.storages.InMemoryStorage()
    for storage in (database, journal):
        study = optuna.create_study(storage=storage, study_name="s")
        dead, living = study.ask(), study.ask()
        if storage is database:
            storage.record_heartbeat(dead._trial_id)
            # past the grace period of 3 heartbeats: SQLite's clock counts whole seconds, so 3.5 s may read as 3
            time.sleep(4.5)
            storage.record_heartbeat(living._trial_id)
        else:
            dead.set_user_attr("heartbeat", time.time() - 100)
            living.set_user_attr("heartbeat", time.time())
        fail_stale(study, storage, grace=3)
        assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.RUNNING]


def test_runs_started_with_die_with_parent_end_when_their_starter_is_killed(tmp_path):
    """The tuner's runs get SIGTERM when the tuner dies, even by SIGKILL (no run left training for nobody)."""
    starter = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from benchmark.run_seeds import Job, start; from pathlib import Path;"
         "job = Job('A', 1, ['sleep', '60'], Path(sys.argv[1]), die_with_parent=True); start(job);"
         "print(job.process.pid, flush=True); time.sleep(60)", str(tmp_path / "a.log")],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pid = int(starter.stdout.readline())
    assert alive(pid)
    starter.kill()
    starter.wait()
    assert not still_alive([pid])
    job = Job("B", 1, ["true"], tmp_path / "b.log")  # without it: as before, a process of its own session
    start(job)
    assert job.process.wait(timeout=10) == 0


def test_redis_as_the_shared_storage(tmp_path):
    """Two workers' storages on one Redis server (an Optuna journal) see the same study and its trials."""
    from ppolab.redis_server import start_redis_server, stop_processes

    server, url = start_redis_server()
    try:
        first = optuna.create_study(storage=open_storage(url, 60), study_name="shared", direction="maximize")
        first.tell(first.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.5)
        second = optuna.create_study(storage=open_storage(url, 60), study_name="shared", load_if_exists=True)
        second.tell(second.ask(), 0.7)
        assert [t.value for t in first.trials] == [0.5, 0.7] and first.best_value == 0.7
    finally:
        stop_processes([server])


def test_the_importances_are_drawn_once_enough_trials_are_complete(tmp_path):
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("env_ids", ["E"])

    def objective(trial):
        return 10 * trial.suggest_float("x", 0, 1) + trial.suggest_float("y", 0, 1)

    study.optimize(objective, n_trials=9)
    assert plot_importances(study, tmp_path / "i.png") is None and not (tmp_path / "i.png").exists()
    study.optimize(objective, n_trials=11)
    assert plot_importances(study, tmp_path / "i.png") == tmp_path / "i.png" and (tmp_path / "i.png").stat().st_size
    out = write_report(study, tmp_path / "r.md", "sqlite:///r.db")
    assert "![parameter importances](r_importances.png)" in out.read_text()


def test_the_events_are_read_as_they_are_written(tmp_path):
    """ScalarTail, the tuner's reader of a running run: each read adds what was written since, as read_scalars reads
    the whole folder."""
    from torch.utils.tensorboard import SummaryWriter

    from benchmark.events import ScalarTail, read_scalars

    writer, tail = SummaryWriter(str(tmp_path)), ScalarTail(tmp_path)
    writer.add_scalar("charts/episodic_return", 1.0, 10)
    writer.flush()
    assert tail.read() == {"charts/episodic_return": [(10, 1.0)]}
    writer.add_scalar("charts/episodic_return", 2.5, 20)
    writer.add_scalar("charts/SPS", 100.0, 20)
    writer.close()
    assert (
        tail.read()
        == read_scalars(tmp_path)
        == {
            "charts/episodic_return": [(10, 1.0), (20, 2.5)],
            "charts/SPS": [(20, 100.0)],
        }
    )
