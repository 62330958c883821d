"""benchmark.full_budget: a row per run beside the published score, its verdict by the stated rule, an unfinished run
marked and never judged, a run whose folder is gone kept from the record; and the atari10m block of ppo.sh in quick
mode (both lanes, every run, the table)."""

import shutil
import time

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

import ppo_atari
import ppo_atari_envpool
from benchmark.full_budget import main, read_runs, table, verdict
from helpers import REPO
from ppolab.tracking import tensorboard_writer
from test_ppo_sh import ppo_sh

REFERENCES = {("ppo_atari.py", "Pong"): {"mean": 20.0, "std": 0.1, "steps": 1000, "seeds": 3, "source": "page P"}}


def write_run(root, seed, returns, last_step, arguments=None):
    """A run folder (one process's events file; called again, a resume's) that opens with the text of its
    `arguments` as the scripts' writer writes it, or with no such text."""
    folder = str(root / f"Pong__ppo_atari__{seed}__1700000000")
    writer = SummaryWriter(folder) if arguments is None else tensorboard_writer(folder, arguments)
    opened = time.time()  # a game ends every 10 s from here
    for k, value in enumerate(returns, start=1):
        writer.add_scalar("charts/episodic_return", value, k * last_step // len(returns), walltime=opened + 10 * k)
    writer.close()


@pytest.mark.parametrize(
    "score, mean, std, expected",
    [
        (19.1, 20.0, 0.1, "at the published level"),  # 2 * 0.1 is narrower than 5% of 20 = 1.0: the floor decides
        (18.9, 20.0, 0.1, "below"),
        (21.1, 20.0, 0.1, "above"),
        (170.0, 200.0, 20.0, "at the published level"),  # 2 * 20 = 40 is wider than 5% of 200: the stds decide
        (159.0, 200.0, 20.0, "below"),
        (-20.5, -21.0, 0.1, "at the published level"),  # the floor of a negative mean
    ],
)
def test_the_band_is_two_published_stds_with_a_floor_of_five_percent_of_the_mean(score, mean, std, expected):
    assert verdict(score, mean, std) == expected


def test_a_finished_run_is_judged_and_an_unfinished_one_is_marked(tmp_path):
    write_run(tmp_path, 1, [0.0] * 50 + [19.5] * 100, last_step=1000)
    write_run(tmp_path, 2, [0.0] * 10 + [21.0] * 10, last_step=500)
    rows = {
        line.split("|")[3].strip(): line
        for line in table(read_runs(tmp_path, 100), 1000, 100, REFERENCES, tmp_path).splitlines()[2:4]
    }
    assert "| 19.50 (150 episodes) | 1,000 |" in rows["1"] and rows["1"].endswith("| at the published level |")
    assert "| 0.4 h | 1 | — | 20.00 ± 0.10 (1k steps, 3 seeds) |" in rows["1"]  # 150 games of 10 s, 1,000 steps
    assert "unfinished: 10.50 (20 episodes) so far" in rows["2"] and "unfinished (50% of the budget)" in rows["2"]
    assert not any(word in rows["2"] for word in ("above", "below", "published level"))


def test_the_threads_column_gives_the_torch_threads_each_process_of_a_run_trained_with(tmp_path):
    """A run resumed with another --torch-threads shows both, in the order its processes ran, each once; a run
    whose events hold no arguments shows a dash."""
    for threads in (2, 1, 2):  # started with 2, resumed with 1, then with 2 again
        write_run(tmp_path, 1, [19.5] * 100, last_step=1000, arguments={"seed": 1, "torch_threads": threads})
    write_run(tmp_path, 2, [19.5] * 100, last_step=1000)
    lines = table(read_runs(tmp_path, 100), 1000, 100, REFERENCES, tmp_path).splitlines()[2:4]
    rows = {cells[3].strip(): cells for cells in (line.split("|") for line in lines)}
    assert (rows["1"][8].strip(), rows["2"][8].strip()) == ("2, 1", "—")


def test_the_written_file_names_its_command_and_rule(tmp_path, capsys):
    write_run(tmp_path / "runs", 1, list(np.linspace(0, 20, 120)), last_step=1000)
    main([str(tmp_path / "runs"), "--steps", "1000", "--out", str(tmp_path / "t.md")])
    text = (tmp_path / "t.md").read_text()
    assert f"`python -m benchmark.full_budget {tmp_path / 'runs'} --steps 1000 --out {tmp_path / 't.md'}`" in text
    assert "m ± max(2 s, 5% of |m|)" in text and "| ppo_atari.py | Pong | 1 |" in text


def test_a_run_whose_folder_is_gone_keeps_its_recorded_row_until_a_run_of_its_seed_replaces_it(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "t.md"
    write_run(runs, 1, [19.5] * 100, last_step=1000)
    write_run(runs, 2, [0.0] * 50 + [18.0] * 100, last_step=1000)

    def rows():
        main([str(runs), "--steps", "1000", "--out", str(out)])
        text = out.read_text()
        return {
            line.split("|")[3].strip(): line for line in text.splitlines() if line.startswith("| ppo_atari.py")
        }, text

    before, _ = rows()
    shutil.rmtree(next(runs.glob("Pong__ppo_atari__2__*")))
    kept, text = rows()
    assert kept["2 *"].replace("| 2 * |", "| 2 |") == before["2"] and kept["1"] == before["1"]
    assert (
        f"No folder under {runs} holds this row's run any more: the row is the one {tmp_path / 't.json'} recorded"
        in text
    )
    write_run(runs, 2, [21.0] * 100, last_step=1000)  # seed 2 again: its new folder replaces the record
    replaced, text = rows()
    assert set(replaced) == {"1", "2"} and "| 21.00 (100 episodes) |" in replaced["2"] and "No folder" not in text


def test_a_record_of_another_episode_count_or_without_a_rows_numbers_is_refused_in_one_line(tmp_path, capsys):
    write_run(tmp_path / "runs", 1, [19.5] * 100, last_step=1000)
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "t.md")])
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "runs"), "--out", str(tmp_path / "t.md"), "--last", "10"])
    assert exited.value.code == 2
    assert f"{tmp_path / 't.json'} cannot be read as the record of this table: its scores average the last 100 " in (
        capsys.readouterr().err
    )
    (tmp_path / "t.json").write_text('{"last": 100, "runs": [{"env_id": "Pong", "seed": "1"}]}')
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs"), "--out", str(tmp_path / "t.md")])
    assert "cannot be read as the record of this table: a row has no episodes, exp_name, " in capsys.readouterr().err


def test_quick_atari10m_block_runs_both_lanes_and_writes_its_table(tmp_path):
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, QUICK="1", BLOCKS="atari10m")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in (tmp_path / "results" / "atari10m.md").read_text().splitlines() if "| 1 |" in line]
    assert sorted(line.split("|")[2].strip() for line in rows) == [
        "BeamRider-v5",
        "Breakout-v5",
        "BreakoutNoFrameskip-v4",
        "Pong-v5",
    ]
    assert all("| 2,048 |" in line and "unfinished" not in line for line in rows)
    defaults = {str(ppo_atari.Args.torch_threads), str(ppo_atari_envpool.Args.torch_threads)}
    assert {line.split("|")[8].strip() for line in rows} == defaults  # the threads the runs really had
    assert (
        (tmp_path / "results" / "atari10m" / "Breakout-v5__ppo_atari_envpool.png").read_bytes().startswith(b"\x89PNG")
    )
