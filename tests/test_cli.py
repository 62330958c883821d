"""Bad input as a user hits it: exit code 2 and one line on stderr naming the problem, no traceback,
nothing written."""

import pytest
import torch

from helpers import REAL_ENV, run_script
from scripts import MODULES

WRONG_ACTION_SPACE = {"ppo": "Pendulum-v1", "ppo_continuous_action": "CartPole-v1"}


def bad_inputs(name, tmp_path):
    """(case, argv, words the error line must contain)"""
    text_file, foreign = tmp_path / "notes.txt", tmp_path / "foreign.pt"
    text_file.write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, foreign)
    return {
        "unknown_env": (["--env-id", "NoSuchEnv-v9"], ["NoSuchEnv-v9"]),
        "wrong_action_space": (["--env-id", WRONG_ACTION_SPACE[name]], [WRONG_ACTION_SPACE[name], "action space"]),
        "minibatches": (
            ["--env-id", REAL_ENV[name], "--num-envs", 2, "--num-steps", 5, "--num-minibatches", 4],
            ["--num-minibatches", "10"],
        ),
        "nonpositive": (["--num-steps", 0], ["--num-steps", "positive"]),
        "missing_resume": (["--resume", tmp_path / "gone.pt"], ["--resume", "gone.pt"]),
        "not_a_checkpoint": (["--evaluate", text_file], ["notes.txt"]),
        "foreign_checkpoint": (["--evaluate", foreign], ["foreign.pt", "not a checkpoint"]),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown_env",
        "wrong_action_space",
        "minibatches",
        "nonpositive",
        "missing_resume",
        "not_a_checkpoint",
        "foreign_checkpoint",
    ],
)
@pytest.mark.parametrize("name", MODULES)
def test_bad_input_gets_one_line_and_exit_code_2(name, case, tmp_path):
    argv, words = bad_inputs(name, tmp_path)[case]
    result = run_script(name, *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{name}.py: error: ")
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "runs").exists()


# Every script, in-process: the same bad inputs end in check_args (or the checkpoint reader) before any work

EVERY_SCRIPT_CASES = {  # case -> (Args fields, words the error line must contain)
    "unknown_env": (dict(env_id="NoSuchEnv-v9"), ["NoSuchEnv"]),
    "minibatches": (dict(num_steps=8, seq_len=8, num_minibatches=3), ["--num-minibatches", "3"]),
    "nonpositive": (dict(num_steps=0), ["--num-steps", "positive"]),
    "missing_resume": (dict(resume="gone.pt"), ["--resume", "gone.pt"]),
    "not_a_checkpoint": (dict(evaluate="notes.txt"), ["notes.txt"]),
    "foreign_checkpoint": (dict(evaluate="foreign.pt"), ["foreign.pt", "not a checkpoint"]),
    # each number against its meaning, the range named
    "learning_rate_negative": (dict(learning_rate=-1.0), ["--learning-rate must be positive, got -1.0"]),
    "learning_rate_nan": (dict(learning_rate=float("nan")), ["--learning-rate must be a finite number, got nan"]),
    "infinite": (dict(max_grad_norm=float("inf")), ["--max-grad-norm must be a finite number, got inf"]),
    "seed_negative": (dict(seed=-1), ["--seed must be from 0 to 1000000000", "got -1"]),
    "seed_too_large": (dict(seed=2**32), ["--seed must be from 0 to 1000000000"]),
    "gamma": (dict(gamma=1.5), ["--gamma must be in [0, 1]", "got 1.5"]),
    "gae_lambda": (dict(gae_lambda=-3.0), ["--gae-lambda must be in [0, 1]", "got -3.0"]),
    "clip_coef": (dict(clip_coef=-0.2), ["--clip-coef must be positive", "got -0.2"]),
    "ent_coef": (dict(ent_coef=-0.01), ["--ent-coef must be zero or positive"]),
    "vf_coef": (dict(vf_coef=-0.5), ["--vf-coef must be zero or positive"]),
    "max_grad_norm": (dict(max_grad_norm=-1.0), ["--max-grad-norm must be positive", "got -1.0"]),
    "target_kl": (dict(target_kl=-1.0), ["--target-kl must be positive (or not given)", "got -1.0"]),
    # the number of minibatches is the batch size: one sample each, whose normalised advantage is NaN
    "one_sample_minibatches": (
        dict(num_steps=1, seq_len=1, num_minibatches="batch_size"),
        ["leaves minibatches of one sample", "at least 2"],
    ),
    "runs_dir_under_a_file": (
        dict(runs_dir="notes.txt/runs"),
        ["--runs-dir notes.txt/runs cannot be created", "notes.txt is a file"],
    ),
    "negative_eval_every": (dict(eval_every=-1), ["--eval-every", "-1"]),
}


@pytest.mark.parametrize("case", sorted(EVERY_SCRIPT_CASES))
def test_every_script_refuses_bad_input_in_one_line(every_script, case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    fields, words = EVERY_SCRIPT_CASES[case]
    if "seq_len" not in every_script.Args.__dataclass_fields__:  # only the shared-memory script cuts chunks
        fields = {k: v for k, v in fields.items() if k != "seq_len"}
    if fields.get("num_minibatches") == "batch_size":
        fields["num_minibatches"] = every_script.Args(**{**fields, "num_minibatches": 1}).batch_size
    with pytest.raises(SystemExit) as exit_info:
        every_script.main(every_script.Args(**{"runs_dir": str(tmp_path / "runs"), "cuda": False, **fields}))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], lines
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "runs").exists()
