"""benchmark.studies.cleanrl speed without CleanRL's virtualenv: the command lines of both sides (same steps and
hyperparameters, parsed back by our script's own parser), the check of CleanRL's flags, the table's
medians, ranges and ratios from known timings, the resumable rounds, and the error when the
virtualenv is missing."""

import json
import sys

import pytest
import tyro

from benchmark.studies import cleanrl as peer


@pytest.fixture
def fake_peer(tmp_path):
    """A virtualenv folder with CleanRL's three scripts (empty files) where the real one has them."""
    package = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "cleanrl"
    package.mkdir(parents=True)
    for pair in peer.PAIRS.values():
        (package / pair.theirs).touch()
    return tmp_path / "venv"


def their_values(command: list[str]) -> dict[str, str]:
    """CleanRL's command line (`--flag value` throughout) as {field_name: value}."""
    flags = command[2:]
    assert all(f.startswith("--") for f in flags[::2]) and not any(v.startswith("--") for v in flags[1::2])
    return {f[2:].replace("-", "_"): v for f, v in zip(flags[::2], flags[1::2])}


@pytest.mark.parametrize("name", list(peer.PAIRS))
def test_both_sides_get_the_same_steps_and_hyperparameters(name, fake_peer):
    pair = peer.PAIRS[name]
    defaults = peer.our_defaults(pair)
    module = __import__(pair.ours)
    ours = peer.our_command(pair, 12_288, defaults, "/tmp/runs")
    theirs = peer.their_command(pair, 12_288, defaults, fake_peer)
    assert ours[1].endswith(f"/{pair.ours}.py")
    assert theirs[:2] == [str(fake_peer / "bin" / "python"), str(peer.cleanrl_script(fake_peer, pair))]
    # our parser reads back our defaults, with the pair's environment and steps, on the CPU, tracking nothing
    parsed = tyro.cli(module.Args, args=ours[2:])
    expected = module.Args(env_id=pair.env_id, total_timesteps=12_288, cuda=False, runs_dir="/tmp/runs")
    assert parsed == expected
    # CleanRL's line: the same values, booleans as True/False, nothing of ours that it lacks
    values = their_values(theirs)
    assert values.pop("env_id") == pair.env_id and values.pop("total_timesteps") == "12288"
    assert {key: values.pop(key) for key in peer.OFF} == dict.fromkeys(peer.OFF, "False")
    assert values == {key: str(getattr(expected, key)) for key in values}
    # the sizes that decide the work: envs, steps per rollout, minibatches, epochs
    assert {"num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate", "seed"} <= values.keys()
    assert "target_kl" not in values and expected.target_kl is None  # None on both sides: not passed


def test_hopper_and_breakout_keep_their_published_sizes(fake_peer):
    """The hyperparameters both sides get are the published ones of each variant (CleanRL's defaults)."""
    hopper = their_values(
        peer.their_command(peer.PAIRS["hopper"], 10**6, peer.our_defaults(peer.PAIRS["hopper"]), fake_peer)
    )
    assert (hopper["num_envs"], hopper["num_steps"], hopper["num_minibatches"], hopper["update_epochs"]) == (
        "1",
        "2048",
        "32",
        "10",
    )
    breakout = peer.PAIRS["breakout"]
    atari = their_values(peer.their_command(breakout, 10**7, peer.our_defaults(breakout), fake_peer))
    assert (atari["num_envs"], atari["clip_coef"], atari["ent_coef"]) == ("8", "0.1", "0.01")


def test_flags_of_cleanrl_that_the_command_leaves_unset_are_found():
    help_text = """usage: ppo.py [-h] [--exp-name EXP_NAME] [--seed SEED] [--env-id ENV_ID] [--num-envs NUM_ENVS]
      --wandb-entity WANDB_ENTITY   the entity
      --frame-skip FRAME_SKIP       a flag the benchmark does not know"""
    command = ["python", "ppo.py", "--seed", "1", "--env-id", "CartPole-v1", "--num-envs", "4"]
    assert peer.unmatched_flags(help_text, command, set()) == ["frame-skip"]
    assert peer.unmatched_flags(help_text, command + ["--frame-skip", "4"], set()) == []
    assert peer.unmatched_flags(help_text, command, {"frame-skip"}) == []  # None on our side too: left unset


def test_our_variants_time_the_other_compile_mode_and_asked_thread_counts():
    assert peer.our_variants({"torch_threads": 1}, []) == [("ours", ())]
    variants = peer.our_variants({"compile": False}, [2])
    assert variants == [
        ("ours", ()),
        ("ours --compile", ("--compile",)),
        ("ours --torch-threads 2", ("--torch-threads", "2")),
    ]
    assert [peer.mode({"compile": False}, label) for label, _ in variants] == ["eager", "compiled", "eager"]
    assert [label for label, _ in peer.our_variants({"compile": True}, [])] == ["ours", "ours --no-compile"]
    assert peer.mode({"compile": True}, "ours --no-compile") == "eager"
    assert peer.our_variants({"compile": True}, [1], split=False) == [
        ("ours", ()),
        ("ours --torch-threads 1", ("--torch-threads", "1")),
    ]


def record(pair, run, r, seconds, setting="plain", sps=None, compile_s=None, cold=False):
    return {
        "pair": pair,
        "steps": 1000,
        "setting": setting,
        "run": run,
        "round": r,
        "seconds": seconds,
        "sps": sps,
        "compile_s": compile_s,
        "cold": cold,
    }


def rows(text: str) -> dict[tuple[str, str], list[str]]:
    """The markdown table's rows as {(setting, run): cells} (first table), and the split table's cells."""
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].endswith(".py"):
            found["split", cells[2]] = cells
        elif len(cells) > 4 and cells[2] in ("plain", "busy"):
            found[cells[2], cells[3]] = cells
    return found


def test_table_medians_ranges_and_ratios_from_known_timings():
    records = [record("cartpole", "CleanRL", r, s, sps=v) for r, s, v in ((1, 30.0, 100), (2, 33.0, 90), (3, 36.0, 80))]
    records += [record("cartpole", "ours", r, s, sps=300) for r, s in ((1, 10.0), (2, 12.0), (3, 11.0))]
    records += [record("cartpole", "ours --compile", r, s) for r, s in ((1, 20.0), (2, 15.0))]  # round 3 missing
    text = peer.table(
        records,
        ["cartpole"],
        {"cartpole": 1000},
        ["plain"],
        3,
        {"cartpole": {"ours": "eager", "ours --compile": "compiled"}},
    )
    found = rows(text)
    theirs, ours, compiled = found["plain", "CleanRL"], found["plain", "ours"], found["plain", "ours --compile"]
    assert theirs[4:10] == ["30.0", "33.0", "36.0", "33.0", "30.0-36.0", "90"] and theirs[10] == ""
    assert ours[4:10] == ["10.0", "12.0", "11.0", "11.0", "10.0-12.0", "300"]
    # median 33 / median 11; the rounds' own ratios 30/10, 33/12, 36/11
    assert ours[10] == "3.00x (2.75x-3.27x)"
    # the compiled runs have rounds 1 and 2 only: compared with CleanRL's rounds 1 and 2 (31.5 / 17.5)
    assert compiled[4:8] == ["20.0", "15.0", "", "17.5"] and compiled[10] == "1.80x (1.50x-2.20x)"
    # the split: eager median 11, compiled median 17.5, no perf/compile_time logged
    assert found["split", "plain"][3:] == ["11.0", "17.5", "1.59", "+6.5", "not logged"]


def test_a_baseline_checkout_runs_its_own_script_and_is_tabulated_against_ours(tmp_path):
    """--baseline: the other checkout's script with our flags, and a table of its time over ours per round."""
    pair = peer.PAIRS["cartpole"]
    defaults = peer.our_defaults(pair)
    command = peer.our_command(pair, 1024, defaults, "/tmp/runs", (), tmp_path)
    assert (
        command[1] == str(tmp_path / "ppo.py")
        and command[2:] == peer.our_command(pair, 1024, defaults, "/tmp/runs")[2:]
    )
    assert peer.our_variants(defaults, [], baseline=True)[:2] == [("ours", ()), (peer.BASELINE, ())]
    records = [
        record("cartpole", label, r, seconds)
        for label, times in (("CleanRL", (30.0, 33.0)), ("ours", (10.0, 12.0)), (peer.BASELINE, (10.5, 12.6)))
        for r, seconds in zip((1, 2), times)
    ]
    text = peer.table(
        records, ["cartpole"], {"cartpole": 1000}, ["plain"], 2, {"cartpole": {"ours": "eager", peer.BASELINE: "eager"}}
    )
    assert "| cartpole (CartPole-v1) | 1,000 | plain | 1.05x (1.05x-1.05x) |" in text.splitlines()
    assert ("split", "plain") not in rows(text)  # two eager runs are no eager/compiled split


def test_table_takes_the_scripts_own_compile_time_and_marks_what_is_missing():
    records = [
        record("hopper", "CleanRL", 1, 50.0, setting="busy"),
        record("hopper", "ours", 1, 20.0, setting="busy"),
        record("hopper", "ours --no-compile", 1, 25.0, setting="busy", compile_s=None),
        record("hopper", "ours", 2, 18.0, setting="busy", compile_s=4.0),
        record("hopper", "CleanRL", 1, 60.0, cold=True),
    ]  # another measurement (cold compile cache)
    text = peer.table(
        records,
        ["hopper"],
        {"hopper": 1000},
        ["plain", "busy"],
        2,
        {"hopper": {"ours": "compiled", "ours --no-compile": "eager"}},
    )
    found = rows(text)
    assert found["plain", "CleanRL"][6] == "not measured" and found["plain", "ours"][6] == "not measured"
    assert found["busy", "ours"][4:7] == ["20.0", "18.0", "19.0"] and found["busy", "ours"][9] == "2.50x"
    assert found["split", "busy"][3:] == ["25.0", "19.0", "0.76", "-6.0", "4.0"]
    assert ("split", "plain") not in found


def test_rounds_alternate_the_sides_and_resume_from_the_log(tmp_path, monkeypatch):
    measured = []

    def fake_measure(pair, steps, setting, label, extra, defaults, peer_dir, cold, baseline=None):
        measured.append((label, setting))
        return {
            "pair": pair,
            "steps": steps,
            "setting": setting,
            "run": label,
            "cold": cold,
            "seconds": 1.0,
            "sps": None,
        }

    monkeypatch.setattr(peer, "measure", fake_measure)
    log = tmp_path / "log.jsonl"
    variants = {"cartpole": [("ours", ()), ("ours --compile", ("--compile",))]}
    arguments = (["cartpole"], {"cartpole": 512}, ["plain", "busy"], variants, {"cartpole": {}}, tmp_path)
    peer.run_rounds(log, 2, *arguments)
    assert measured == [
        (label, setting) for setting in ("plain", "busy") for label in ("ours --compile", "ours", "CleanRL")
    ] + [(label, setting) for setting in ("plain", "busy") for label in ("CleanRL", "ours", "ours --compile")]
    assert [json.loads(line)["round"] for line in log.read_text().splitlines()] == [1] * 6 + [2] * 6
    measured.clear()
    peer.run_rounds(log, 3, *arguments)  # rounds 1 and 2 are in the log: only round 3 runs
    assert measured == [
        (label, setting) for setting in ("plain", "busy") for label in ("ours --compile", "ours", "CleanRL")
    ]
    measured.clear()
    peer.run_rounds(log, 1, *arguments, cold=True)  # runs with a cold compile cache are other runs
    assert len(measured) == 6


def test_steps_for_every_pair_or_per_pair():
    assert peer.parse_steps(None) == {"cartpole": 500_000, "hopper": 1_000_000, "breakout": 10_000_000}
    assert peer.parse_steps("4096") == dict.fromkeys(peer.PAIRS, 4096)
    assert peer.parse_steps("hopper=20480,cartpole=50000") == {
        "cartpole": 50_000,
        "hopper": 20_480,
        "breakout": 10_000_000,
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pairs", "cartpole"], "CleanRL 1.2.0's virtualenv is missing"),
        (["--pairs", "pendulum"], "--pairs: unknown pendulum"),
        (["--steps", "hopper=lots"], "--steps: expected N or PAIR=N"),
        (["--steps", "walker=100"], "--steps: unknown pair 'walker'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        peer.main(["speed", *argv, "--venv", str(tmp_path / "nothing"), "--log", str(tmp_path / "log.jsonl")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("benchmark.studies.cleanrl: error: ") and message in err
    if "missing" in message:
        assert "python -m benchmark.studies.cleanrl build" in err


def test_what_our_script_sets_for_itself_does_not_reach_cleanrl(monkeypatch):
    """Reading our defaults imports our script, which sets OMP_WAIT_POLICY for itself; CleanRL's runs
    still get the environment the benchmark started with."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delitem(sys.modules, "ppo_atari_envpool", raising=False)  # so that the import runs it
    assert peer.our_defaults(peer.PAIRS["breakout"])["torch_threads"] == 2
    assert "OMP_WAIT_POLICY" not in peer.child_env(ours=False)
    assert "OMP_WAIT_POLICY" not in peer.child_env(ours=True)  # ours sets it itself, as when run by hand


def test_header_names_the_load_during_the_runs_and_the_versions(tmp_path):
    (tmp_path / "versions.json").write_text('{"cleanrl": "1.2.0", "gym": "0.23.1"}')
    records = [
        record("cartpole", "ours", 1, 10.0) | {"load": 0.5},
        record("cartpole", "CleanRL", 1, 30.0) | {"load": 1.25},
        record("hopper", "ours", 1, 10.0) | {"load": 9.0},
    ]  # another pair: not in this table
    text = peer.describe(
        "python -m benchmark.studies.cleanrl speed --pairs cartpole",
        tmp_path,
        ["cartpole"],
        ["plain", "busy"],
        {"cartpole": {"torch_threads": 1, "compile": False}},
        records,
        cold=True,
    )
    assert "1-minute load average before each run 0.50-1.25." in text
    assert f"CleanRL: cleanrl 1.2.0, gym 0.23.1 (virtualenv {tmp_path})." in text
    assert (
        "`python -m benchmark.studies.cleanrl speed --pairs cartpole`" in text and "empty for each run (cold)" in text
    )
    assert "busy: default threads, +1 process busy on one core" in text
    assert "cartpole: ppo.py (`--torch-threads` default 1, `--compile` default False)" in text


def test_compile_time_is_the_scripts_own_or_the_first_iterations_extra_time():
    compiled = [{"first_extra_s": 30.0}, {"first_extra_s": 20.0}, {"first_extra_s": 40.0}]
    eager = [{"first_extra_s": 0.5}, {"first_extra_s": 1.5}]
    assert peer.compile_text(compiled, eager) == "about 29.0 (first iteration's extra time)"  # 30 - 1
    assert peer.compile_text([{**run, "compile_s": 12.0} for run in compiled], eager) == "12.0"
    assert peer.compile_text(compiled, [{}]) == "not logged"


def test_own_times_from_the_event_file(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "runs" / "CartPole-v1__ppo__1__0")
    for i, (rollout, update) in enumerate([(5.0, 20.0), (1.0, 2.0), (1.0, 4.0), (2.0, 2.0)]):
        writer.add_scalar("perf/rollout_time", rollout, 512 * (i + 1))
        writer.add_scalar("perf/update_time", update, 512 * (i + 1))
    writer.close()
    assert peer.own_times(tmp_path / "runs") == {"first_extra_s": 25.0 - 4.0}
