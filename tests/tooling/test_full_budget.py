"""benchmark.full_budget: run folders exported as curves (data), the table and plots made from the curves alone (and
the committed table regenerated from the committed curves), the readings RULE states (no verdict short of 90% of the
published budget or for fewer than three seeds; Welch's test for three or more), CleanRL's envpool score, re-typed
rows, runs carried to a new machine (stash, unstash) and joined into one curve; and the fullbudget block of ppo.sh in
quick mode."""

import json
import re
import time

import numpy as np
import pytest

from benchmark.full_budget import (
    cleanrl_score,
    document,
    export,
    load_runs,
    main,
    plot_curves,
    read_curve,
    stash,
    unstash,
    verdict,
    welch,
)
from benchmark.scripts import machine, nvidia_gpus
from helpers import REPO
from ppolab.tracking import tensorboard_writer
from test_ppo_sh import ppo_sh

REFERENCES = {
    ("ppo_atari.py", "Pong"): {"mean": 20.0, "std": 0.1, "steps": 1000, "seeds": 3, "source": "page P"},
    ("ppo_atari_envpool.py", "Pong-v5"): {
        "mean": 20.0,
        "std": 0.1,
        "steps": 1000,
        "seeds": 3,
        "source": "page E",
        "metric": "avg_episodic_return",
    },
}
CURVES = REPO / "benchmark" / "results" / "fullbudget" / "curves"


def write_run(root, seed, returns, last_step, script="ppo_atari", env_id="Pong", opened=None, budget=1000):
    """A run folder (one process's events file; called again, a resume's) with the arguments the scripts write and an
    episode every 10 s from `opened`."""
    folder = root / f"{env_id}__{script}__{seed}__1700000000"
    writer = tensorboard_writer(str(folder), {"seed": seed, "torch_threads": 2, "total_timesteps": budget})
    opened = time.time() if opened is None else opened
    for k, value in enumerate(returns, start=1):
        step = k * last_step // len(returns)
        writer.add_scalar("charts/episodic_return", value, step, walltime=opened + 10 * k)
        writer.add_scalar("charts/episodic_length", 100 + k, step, walltime=opened + 10 * k)
    writer.close()
    return folder


def reading(text: str, script: str, env_id: str) -> str:
    """The reading cell of a script's row in the scores table."""
    row = next(line for line in text.splitlines() if line.startswith(f"| {script} | {env_id} | "))
    return row.strip("|").split("|")[-1].strip()


def test_export_writes_every_episode_as_data_and_the_code_of_each_start_from_the_job_log(tmp_path):
    root, curves = tmp_path / "runs", tmp_path / "curves"
    folder = write_run(root, 1, [1.0, 2.0, 3.0], last_step=300)
    log = root / "logs" / "ppo_atari" / "Pong__1.log"
    log.parent.mkdir(parents=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() - 60))
    log.write_text(f"$ python ppo_atari.py\n# code: {'a' * 40} at {started}\nrun folder: {folder}\n")
    export(root, curves)
    curve = read_curve(curves / "Pong__ppo_atari__1.csv.gz")
    assert list(curve["global_step"]) == [100, 200, 300] and list(curve["return"]) == [1.0, 2.0, 3.0]
    assert list(curve["length"]) == [101, 102, 103] and list(np.diff(curve["seconds"])) == pytest.approx([10, 10])
    record = json.loads((curves / "Pong__ppo_atari__1.json").read_text())
    assert (record["budget"], record["steps"], record["threads"]) == (1000, 300, ["2"])
    assert record["code"] == [{"commit": "a" * 40, "started": started, "from_step": 100}]
    first = (curves / "Pong__ppo_atari__1.csv.gz").read_bytes()
    (curves / "Pong__ppo_atari__1.json").write_text(json.dumps({**record, "exported": "earlier"}, indent=1) + "\n")
    export(root, curves)
    assert (curves / "Pong__ppo_atari__1.csv.gz").read_bytes() == first  # the same curve, the same bytes
    # a finished run's record is not rewritten by every export (its export time stays that of the last change)
    assert json.loads((curves / "Pong__ppo_atari__1.json").read_text()) == {**record, "exported": "earlier"}


def test_a_stashed_run_resumes_on_a_new_machine_and_exports_one_curve_and_a_finished_job_keeps_only_its_log(tmp_path):
    import torch

    root, to = tmp_path / "runs", tmp_path / "stash"
    folder = write_run(root, 1, [1.0, 2.0, 3.0, 4.0], last_step=400)  # episodes at steps 100..400, 10 s apart
    torch.save({"global_step": 250, "model": torch.zeros(3)}, folder / "checkpoint.pt")
    finished = write_run(root, 2, [5.0], last_step=1000)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() - 5))
    for seed, run_dir, end in ((1, folder, "interrupted\n"), (2, finished, "# exit 0\n")):
        log = root / "logs" / "ppo_atari" / f"Pong__{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ python ppo_atari.py\n# code: {'a' * 40} at {started}\nrun folder: {run_dir}\n{end}")
    assert len(stash(root, to)) == 2
    assert sorted(path.name for path in to.iterdir()) == [
        "Pong__ppo_atari__1.checkpoint.pt.gz", "Pong__ppo_atari__1.json", "Pong__ppo_atari__1.prior.csv.gz",
        "Pong__ppo_atari__2.json",
    ]  # fmt: skip
    assert stash(root, to) == []  # the checkpoint has not moved on: nothing is rewritten
    assert str(tmp_path) not in (to / "Pong__ppo_atari__1.json").read_text()  # no path of this machine is committed
    # the machine is lost; on the new one the runs folder lies elsewhere
    new_root = tmp_path / "elsewhere"
    unstash(to, new_root)
    restored = new_root / folder.name
    assert torch.load(restored / "checkpoint.pt", weights_only=True)["global_step"] == 250
    assert not (new_root / finished.name).exists()
    assert (new_root / "logs" / "ppo_atari" / "Pong__2.log").read_text().endswith("# exit 0\n")
    assert f"run folder: {restored}\n" in (new_root / "logs" / "ppo_atari" / "Pong__1.log").read_text()
    # the resumed run: the episodes from the checkpoint on (the replayed 300 and later)
    writer = tensorboard_writer(str(restored), {"seed": 1, "torch_threads": 1, "total_timesteps": 1000})
    for step, value in ((300, 30.0), (500, 50.0), (600, 60.0)):
        writer.add_scalar("charts/episodic_return", value, step, walltime=time.time() + step / 100)
        writer.add_scalar("charts/episodic_length", step, step, walltime=time.time() + step / 100)
    writer.close()
    export(new_root, tmp_path / "curves")
    curve = read_curve(tmp_path / "curves" / "Pong__ppo_atari__1.csv.gz")
    assert list(curve["global_step"]) == [100, 200, 300, 500, 600]
    assert list(curve["return"]) == [1.0, 2.0, 30.0, 50.0, 60.0]
    assert list(np.diff(curve["seconds"])) == pytest.approx([10, 3, 2, 1], abs=0.1)  # training time goes on from 20 s
    record = json.loads((tmp_path / "curves" / "Pong__ppo_atari__1.json").read_text())
    assert record["threads"] == ["2", "1"] and record["code"] == [
        {"commit": "a" * 40, "started": started, "from_step": 100}
    ]
    assert record["seconds"] == pytest.approx(20 + 6, abs=0.1)


def test_cleanrl_score_is_the_mean_of_the_last_values_of_the_20_game_running_mean():
    returns = np.arange(150, dtype=float) ** 1.5
    running = [np.mean(returns[max(0, k - 19) : k + 1]) for k in range(len(returns))]  # the slow reference
    assert cleanrl_score(returns, 100) == pytest.approx(np.mean(running[-100:]))
    assert cleanrl_score(returns, 100) < np.mean(returns[-100:])  # on a rising curve the running mean lags


@pytest.mark.parametrize(
    "scores, expected",
    [
        ([19.95], "one seed: inside the published mean ± 2 std (no verdict)"),
        ([1.0], "one seed: below the published mean − 2 std (no verdict)"),
        ([25.0, 26.0], "two seeds, their mean: above the published mean + 2 std (no verdict)"),
    ],
)
def test_one_or_two_seeds_are_placed_in_words_and_never_judged(scores, expected):
    assert verdict(scores, 20.0, 0.1, 3) == expected


def test_three_seeds_are_judged_by_welchs_test_and_an_equivalence_margin():
    from scipy import stats

    ours = [19.9, 20.0, 20.1]
    difference, p, low, high = welch(ours, 20.0, 0.5, 3)
    assert p == pytest.approx(stats.ttest_ind_from_stats(20.0, 0.1, 3, 20.0, 0.5, 3, equal_var=False).pvalue)
    assert low < difference < high and verdict(ours, 20.0, 0.5, 3).startswith("**matches**")
    assert verdict([10.0, 11.0, 12.0], 20.0, 0.5, 3).startswith("**below** (Welch p = ")
    assert verdict([100.0, 300.0, 500.0], 290.0, 150.0, 3).startswith("**undecided**")  # too spread to tell


def test_no_verdict_short_of_90_percent_of_the_published_budget_even_where_the_run_ended_its_own(tmp_path):
    """A quick run (its own --total-timesteps reached) is still unfinished against the published budget."""
    root, curves = tmp_path / "runs", tmp_path / "curves"
    for seed in (1, 2, 3):
        write_run(root, seed, [20.0] * 100, last_step=80, budget=80)  # 8% of the published 1,000 steps
    export(root, curves)
    text = document(load_runs(curves, 100), REFERENCES, curves, 100)
    assert reading(text, "ppo_atari.py", "Pong") == "unfinished (8% of the budget)"
    assert not re.search(r"matches|above|below|inside", text.split("## The runs")[0].split("| reading |")[1])


def plotted_axes(tmp_path, monkeypatch) -> list:
    """Exports the runs under tmp_path/runs and returns the axes of every figure plot_curves draws of them, in
    order (steps, then time, per script and game); none is written."""
    import benchmark.full_budget as full_budget

    axes = []
    monkeypatch.setattr(full_budget, "save_figure", lambda fig, path: axes.append(fig.axes[0]) or path)
    export(tmp_path / "runs", tmp_path / "curves")
    plot_curves(load_runs(tmp_path / "curves", 100), tmp_path / "plots", REFERENCES, 10)
    return axes


def test_the_plot_draws_the_finished_seeds_whole_and_an_unfinished_one_only_while_none_has_finished(
    tmp_path, monkeypatch
):
    """A seed just started must not cut the finished seeds' curve down to its own few steps."""
    root = tmp_path / "runs"
    write_run(root, 1, [20.0] * 100, last_step=1000)  # finished: the whole published budget
    write_run(root, 2, [5.0] * 10, last_step=100)  # 10% of it
    write_run(root, 3, [5.0] * 10, last_step=100, env_id="Pong-v5", script="ppo_atari_envpool")  # nothing finished
    steps_axes = plotted_axes(tmp_path, monkeypatch)[::2]
    by_label = {ax.lines[0].get_label(): max(ax.lines[0].get_xdata()) for ax in steps_axes}
    assert by_label == {"ppo_atari.py, seed 1": 1000, "ppo_atari_envpool.py, seed 3": 100}


def test_the_published_mean_is_drawn_inside_the_frame_with_room_around_it(tmp_path, monkeypatch):
    """The axes fit the curve; a published mean above all of it must still show, off the top frame."""
    # the mean of 20 lies inside the curve's own margin, at its edge
    write_run(tmp_path / "runs", 1, [0.0] * 10 + [19.5] * 90, last_step=1000)
    limits = [ax.get_ylim() for ax in plotted_axes(tmp_path, monkeypatch)]
    assert limits and all(high - 20.0 >= 0.04 * (high - low) for low, high in limits)


def test_envpool_rows_are_read_on_cleanrls_score_and_other_rows_on_the_plain_mean(tmp_path):
    root, curves = tmp_path / "runs", tmp_path / "curves"
    rising = list(np.linspace(0, 40, 200))
    write_run(root, 1, rising, last_step=1000, script="ppo_atari_envpool", env_id="Pong-v5")
    write_run(root, 1, rising, last_step=1000)
    export(root, curves)
    text = document(load_runs(curves, 100), REFERENCES, curves, 100)
    envpool = next(line for line in text.splitlines() if line.startswith("| ppo_atari_envpool.py | Pong-v5 | 1 |"))
    plain = next(line for line in text.splitlines() if line.startswith("| ppo_atari.py | Pong | 1 |"))
    assert f"CleanRL-style: {cleanrl_score(np.array(rising), 100):.2f} |" in envpool
    assert f"score: {np.mean(rising[-100:]):.2f} |" in plain


def test_a_retyped_row_is_shown_marked_and_a_record_without_curve_or_mark_is_refused(tmp_path, capsys):
    curves = tmp_path / "curves"
    curves.mkdir()
    row = {"exp_name": "ppo_atari", "env_id": "Pong", "seed": "1", "score": 19.9, "episodes": 900, "steps": 1000}
    (curves / "Pong__ppo_atari__1.json").write_text(json.dumps({**row, "seconds": 3600, "threads": ["2"]}))
    with pytest.raises(SystemExit) as exited:
        main(["table", str(curves)])
    assert exited.value.code == 2 and "has no curve beside it and is not a re-typed row" in capsys.readouterr().err
    record = {**row, "seconds": 3600, "threads": ["2"], "retyped": "re-typed from the table of a day"}
    (curves / "Pong__ppo_atari__1.json").write_text(json.dumps(record))
    main(["table", str(curves)])
    text = capsys.readouterr().out
    assert "| ppo_atari.py | Pong | 1 * | 19.90 | — |" in text and "re-typed from the table of a day" in text
    with pytest.raises(SystemExit):
        main(["table", str(tmp_path / "nowhere")])
    assert "no folder" in capsys.readouterr().err


def test_the_committed_table_and_curves_regenerate_from_the_committed_curve_data(tmp_path):
    """What a clean checkout holds is enough: the table made from benchmark/results/fullbudget/curves equals the
    committed benchmark/results/fullbudget.md, and a plot is made for every committed plot."""
    main(["table", str(CURVES), "--out", str(tmp_path / "t.md"), "--plots", str(tmp_path / "plots")])
    assert (tmp_path / "t.md").read_text() == (REPO / "benchmark" / "results" / "fullbudget.md").read_text()
    committed = {path.name for path in (REPO / "benchmark" / "results" / "fullbudget").glob("*.png")}
    assert committed and committed == {path.name for path in (tmp_path / "plots").glob("*.png")}


def test_quick_fullbudget_block_runs_its_three_lanes_exports_curves_and_writes_its_table(tmp_path):
    result = ppo_sh(
        REPO / "benchmark" / "ppo.sh", tmp_path, QUICK="1", BLOCKS="fullbudget", MORE_SEEDS="", FULL_PROCGEN="1"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    curves = tmp_path / "results" / "fullbudget" / "curves"
    assert sorted(path.name for path in curves.glob("*.json")) == [
        "Breakout-v5__ppo_atari_envpool__1.json",
        "BreakoutNoFrameskip-v4__ppo_atari_lstm__1.json",
        "BreakoutNoFrameskip-v4__ppo_atari_multigpu__1.json",
        "CartPole-v1__ppo_shared_memory_lstm__1.json",
        "StarpilotEasy-v0__ppo_procgen__1.json",
    ]
    text = (tmp_path / "results" / "fullbudget.md").read_text()
    assert reading(text, "ppo_atari_envpool.py", "Breakout-v5") == "unfinished (0% of the budget)"
    assert reading(text, "ppo_shared_memory_lstm.py", "CartPole-v1") == "no published score"
    record = json.loads((curves / "BreakoutNoFrameskip-v4__ppo_atari_lstm__1.json").read_text())
    assert record["code"] and record["code"][0]["commit"] != "unknown" and record["steps"] >= 2048
    # every job finished: the stash holds their logs alone (what a new machine needs to skip them)
    stashed = tmp_path / "results" / "fullbudget" / "resume"
    assert sorted(path.name for path in stashed.iterdir()) == [path.name for path in sorted(curves.glob("*.json"))]
    png = tmp_path / "results" / "fullbudget" / "Breakout-v5__ppo_atari_envpool.png"
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_procgen_lane_runs_only_where_cuda_is_unless_asked_and_a_bad_setting_is_one_line(tmp_path):
    # no seeds: the block only decides its lanes, then makes its table (of one re-typed row) from an empty runs folder
    (tmp_path / "runs" / "fullbudget").mkdir(parents=True)
    retyped = "BreakoutNoFrameskip-v4__ppo_atari__1.json"
    (tmp_path / "results" / "fullbudget" / "curves").mkdir(parents=True)
    (tmp_path / "results" / "fullbudget" / "curves" / retyped).write_text((CURVES / retyped).read_text())
    quiet = dict(QUICK="1", BLOCKS="fullbudget", FULL_SEEDS=" ", MORE_SEEDS="", CUDA_VISIBLE_DEVICES="")
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, **quiet)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ppo_procgen.py on starpilot runs where a CUDA GPU is" in result.stdout
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, **quiet, FULL_PROCGEN="0")
    assert result.returncode == 0 and "ppo_procgen.py" not in result.stdout, result.stdout + result.stderr
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, **quiet, FULL_PROCGEN="yes")
    assert result.returncode == 2 and result.stderr == "FULL_PROCGEN must be auto, 0 or 1, not 'yes'\n"


def test_a_record_names_the_machines_gpus_where_nvidia_smi_lists_them(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf 'NVIDIA H200\\nNVIDIA H200\\nNVIDIA A100\\n'\n")
    fake.chmod(0o755)
    try:
        nvidia_gpus.cache_clear()
        monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
        assert ", 2 x NVIDIA H200, 1 x NVIDIA A100, " in machine()
        nvidia_gpus.cache_clear()
        monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
        assert " x " not in machine() and "logical cores" in machine()
    finally:
        nvidia_gpus.cache_clear()
