"""benchmark.studies.options from run folders written here: the objective table normalises as the PPO paper's Table 1
(0 = random, 1 = the best setting), the bootstrap table counts the runs on their backs and leaves out the unfinished
ones, a results file keeps its hand-written verdict."""

from torch.utils.tensorboard import SummaryWriter

from benchmark.studies import options as studies


def write_run(root, block, name, score, steps=studies.STEPS):
    writer = SummaryWriter(str(root / block / name))
    for step in range(1, 101):
        writer.add_scalar("charts/episodic_return", score, step * steps // 100)
    writer.add_scalar("charts/SPS", 1000.0, steps)
    writer.close()


def test_the_objective_table_normalises_between_random_and_the_best_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(studies, "random_return", lambda env_id: 0.0)
    for env in ("Hopper-v4", "HalfCheetah-v4", "Walker2d-v4"):
        for seed, (clip, adaptive, fixed) in enumerate([(100.0, 50.0, 80.0), (100.0, 70.0, 80.0)], 1):
            write_run(tmp_path, "mujoco", f"{env}__ppo_continuous_action__{seed}__1", clip)
            write_run(tmp_path, "objective", f"{env}__ppo_continuous_action_adaptive_kl__{seed}__1", adaptive)
            write_run(tmp_path, "objective", f"{env}__ppo_continuous_action_fixed_kl__{seed}__1", fixed)
    text = studies.objective(tmp_path)
    assert "| Hopper-v4 | adaptive-kl | 50.0 (1), 70.0 (2) | 60.00 ± 10.00 |" in text
    assert "over Hopper-v4, HalfCheetah-v4, Walker2d-v4:" in text
    assert "| clip | 0.0, 0.0, 0.0 | 1.00 | 0.82 (clipping, epsilon = 0.2) |" in text
    assert "| adaptive-kl | 0.0, 0.0, 0.0 | 0.60 | 0.74 (adaptive KL, d_targ = 0.01) |" in text
    assert "| fixed-kl | 0.0, 0.0, 0.0 | 0.80 | 0.71 (fixed KL, beta = 1) |" in text


def test_the_bootstrap_table_counts_the_runs_on_their_backs(tmp_path, monkeypatch):
    backs = {"1": (True, -0.9), "2": (False, 0.95), "3": (True, -0.8)}
    monkeypatch.setattr(studies, "on_its_back", lambda path: backs[path.parent.name.split("__")[2]])
    for seed, score in (("1", 1700.0), ("2", 3300.0), ("3", 1800.0)):
        write_run(tmp_path, "bootstrap", f"HalfCheetah-v4__ppo_continuous_action__{seed}__1", score)
        (tmp_path / "bootstrap" / f"HalfCheetah-v4__ppo_continuous_action__{seed}__1" / "checkpoint.pt").touch()
    write_run(tmp_path, "bootstrap", "HalfCheetah-v4__ppo_continuous_action__4__1", 900.0, steps=200_000)  # running
    text = studies.bootstrap(tmp_path)
    assert "| with the bootstrap | 4 |" not in text
    assert studies.unfinished(tmp_path, ["bootstrap"]) == (
        "\n\nUnfinished runs, left out of the tables: HalfCheetah-v4__ppo_continuous_action__4__1 (200,000 steps)."
    )
    assert "| with the bootstrap | 2 | 3300.00 | upright (0.95) |" in text
    assert (
        "| with the bootstrap | 3 | 2266.67 ± 731.82 | 2 of 3 with a checkpoint | 3300.00 | 1750.00 ± 50.00 |" in text
    )
    assert "| without it | 0 | not run | 0 of 0 with a checkpoint |" in text
    assert "Fisher" not in text  # one side has no runs: nothing to compare


def test_a_results_file_keeps_its_verdict(tmp_path):
    studies.write("dmc", "| table |", tmp_path, "python -m benchmark.studies.options runs")
    path = tmp_path / "study_dmc.md"
    path.write_text(path.read_text().replace("(not yet)", "Written by hand."))
    studies.write("dmc", "| another table |", tmp_path, "python -m benchmark.studies.options runs")
    text = path.read_text()
    assert (
        "| another table |" in text and "| table |\n" not in text and text.endswith("## Verdict\n\nWritten by hand.\n")
    )


def test_fishers_exact_test_and_the_difference_interval_as_worked_out_by_hand():
    # 3 of 10 against 0 of 10: with 3 flipped in all, P(k of them in the first 10) = C(10,k) C(10,3-k) / C(20,3)
    # = 120, 450, 450, 120 over 1140; the splits no more likely than k=3 are k=0 and k=3: 240/1140
    assert abs(studies.fisher_exact(3, 10, 0, 10) - 240 / 1140) < 1e-12
    assert abs(studies.fisher_exact(2, 4, 2, 4) - 1.0) < 1e-12  # the most likely split: every split counts
    difference, low, high = studies.difference_ci([1.0, 1.0, 1.0], [3.0, 3.0, 3.0])
    assert (difference, low, high) == (2.0, 2.0, 2.0)  # no spread: every resample gives the same difference
    difference, low, high = studies.difference_ci([0.0, 10.0], [5.0, 5.0])
    assert difference == 0.0 and (low, high) == (-5.0, 5.0)  # the resampled first side's means are 0, 5 or 10


def test_the_studies_go_to_the_runs_folder_unless_told_and_dmc_gives_cleanrls_budget(tmp_path, capsys):
    write_run(tmp_path, "dmc", "dm_control-walker-walk-v0__ppo_continuous_action__1__1700000000", 400.0)
    studies.main([str(tmp_path), "--only", "dmc"])
    text = (tmp_path / "studies" / "study_dmc.md").read_text()  # not benchmark/results/: a reader's runs stay theirs
    assert "| dm_control/walker-walk-v0 | 400.0 (1) | 400.00 | 392.51 ± 56.25 (8M steps, 10 seeds) |" in text
    studies.main([str(tmp_path), "--only", "dmc", "--out-dir", str(tmp_path / "elsewhere")])
    assert (tmp_path / "elsewhere" / "study_dmc.md").is_file()
