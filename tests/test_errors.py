"""Every bad input and every interruption ends in one line, on every script: checkpoints of another
script, of an older format, truncated, empty or damaged (their CRC-32s); --resume with other flags; --track without
a login; Ctrl-C (a real SIGINT, with children and a video recorder running). The bad numbers and folders are
in test_cli.py's in-process cases."""

import importlib
import os
import pickle
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import ppo
from helpers import default_ctrl_c, load, resume_args, script_command
from ppolab.checkpoints import checkpoint_data, load_checkpoint, write_checkpoint_file
from ppolab.checkpoints import resume_args as resume_args_of
from ppolab.checks import check_tracking
from ppolab.command_line import parse
from scripts import MULTI_PROCESS, SCRIPTS


def refusal(script, capsys, **fields) -> str:
    """The one line on stderr of `script.main(Args(**fields))`, which must end in exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(cuda=False, **fields))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], lines
    return lines[0]


# CHECKPOINTS -------------------------------------------------------------------------------------


def real_checkpoint(name: str, path: Path) -> Path:
    """A checkpoint as `name` (ppo.py or ppo_continuous_action.py) writes one: its objects through the package."""
    script = importlib.import_module(name)
    agent = script.Agent(4, 2)
    saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters())}
    if name == "ppo_continuous_action":
        saved.update(obs_rms=script.ObsNormalizer((4,), 10.0).rms, reward_rms=script.RewardScaler(1, 0.99, 10.0).rms)
    write_checkpoint_file(checkpoint_data(saved, script.Args(), 1, 512), str(path))
    return path


@pytest.mark.parametrize("flag", ["evaluate", "resume"])
def test_a_checkpoint_of_another_script_is_refused_naming_its_script(every_script, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    writer = "ppo_continuous_action" if every_script.__name__ == "ppo" else "ppo"
    path = real_checkpoint(writer, tmp_path / "model.pt")
    line = refusal(every_script, capsys, runs_dir=str(tmp_path / "runs"), **{flag: str(path)})
    assert f"was written by {writer}.py, not {every_script.__name__}.py" in line
    assert not (tmp_path / "runs").exists()


def damaged_files(name: str, folder: Path) -> dict[str, tuple[Path, list[str]]]:
    """case -> (file, words the error line must contain)"""
    whole = folder / "whole.pt"
    torch.save({"model": {}, "args": {}, "script": f"{name}.py", "format": 2, "padding": torch.zeros(1000)}, whole)
    truncated, empty, old = folder / "truncated.pt", folder / "empty.pt", folder / "old.pt"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    empty.write_bytes(b"")
    torch.save({"model": {}, "args": {}, "iteration": 1}, old)  # the keys of a checkpoint before format 2
    tensor, pickled = folder / "tensor.pt", folder / "pickled.pt"
    tensor.write_bytes(damage(whole, "data/0"))  # a tensor's bytes: torch.load reads them as they are
    pickled.write_bytes(damage(whole, "data.pkl"))
    return {
        "truncated": (truncated, ["truncated.pt", "truncated", "not a complete checkpoint"]),
        "empty": (empty, ["empty.pt", "not a complete checkpoint"]),
        "old_format": (old, ["old.pt", "from before format 2"]),
        "damaged_tensor": (tensor, ["tensor.pt is damaged: the CRC-32 of its entry whole/data/0 does not match"]),
        "damaged_pickle": (pickled, ["pickled.pt is damaged: the CRC-32 of its entry whole/data.pkl does not match"]),
    }


def damage(path: Path, entry: str) -> bytes:
    """The bytes of the torch archive at `path` with 100 bytes of its entry `<root>/<entry>` (or all of them, if
    fewer) set to 0xff, as a disk or a copy may damage them: the archive's structure and sizes stay as they were."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        (info,) = [info for info in archive.infolist() if info.filename.endswith(f"/{entry}")]
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length  # after its local header
    size = min(100, info.file_size)
    data[start : start + size] = b"\xff" * size
    return bytes(data)


def test_torch_load_itself_reads_a_damaged_tensor_as_it_is(tmp_path):
    """Why the reader checks the archive's CRC-32s: torch.load does not, and gives the damaged numbers."""
    path, words = damaged_files("ppo", tmp_path)["damaged_tensor"]
    assert (
        torch.load(path, weights_only=True)["padding"][:25].isnan().all()
    )  # 0xffffffff as float32: NaN, and a CRC-32 that does not match


@pytest.mark.parametrize("case", ["truncated", "empty", "old_format", "damaged_tensor", "damaged_pickle"])
def test_a_damaged_or_old_checkpoint_is_refused_saying_what_it_is(every_script, case, tmp_path, monkeypatch, capsys):
    """--evaluate of every script: one line, exit 2; a file whose bytes changed on the disk says it is damaged, and
    which entry (a damaged data.pkl is not taken for one holding code)."""
    monkeypatch.chdir(tmp_path)
    path, words = damaged_files(every_script.__name__, tmp_path)[case]
    line = refusal(every_script, capsys, evaluate=str(path))
    for word in words:
        assert word in line
    assert "Errno" not in line and "holds code" not in line


def test_resume_refuses_a_damaged_checkpoint_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """--resume reads through the same reader (as torchrun's rank 0 does for every rank): a run folder whose
    checkpoint.pt was damaged is refused in one line and stays as it was."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path(ppo.main(ppo.Args(runs_dir=str(tmp_path / "runs"), total_timesteps=128, num_steps=32,
                                     num_envs=2, checkpoint_every=1, cuda=False)))  # fmt: skip
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(damage(checkpoint, "data/0"))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    capsys.readouterr()
    line = refusal(ppo, capsys, resume=str(checkpoint))
    assert f"{checkpoint} is damaged: the CRC-32 of its entry archive/data/0 does not match" in line
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def unfit(case: str, checkpoint: dict) -> list[str]:
    """`checkpoint` (ppo.py's) changed in place as `case` says, with valid checksums; returns the words of the line."""
    optimizer, model = checkpoint["optimizer"]["state"], checkpoint["model"]
    if case == "adam_moment":  # two layers' moments swapped, as editing the script's layers would
        optimizer[0]["exp_avg"], optimizer[2]["exp_avg"] = optimizer[2]["exp_avg"], optimizer[0]["exp_avg"]
        return ["exp_avg of parameter 0 has shape (64, 64), the parameter (64, 4)"]
    if case == "adam_count":
        checkpoint["optimizer"]["param_groups"][0]["params"].append(99)
        return ["parameters in a group"]
    if case == "shape":
        model["critic.0.weight"] = torch.zeros(64, 5)
        return ["critic.0.weight has shape (64, 5), this script's (64, 4)"]
    if case == "name":
        model["critic.9.weight"] = model.pop("critic.0.weight")
        return ["critic.0.weight is missing"]
    if case == "unknown_arg":
        checkpoint["args"]["frame_skip"] = 4
        return ["--frame-skip, which this script does not have"]
    if case in ("rng", "optimizer", "iteration"):
        del checkpoint[case]
        return [f"it has no {case}"]
    assert case == "numpy_rng"
    checkpoint["rng"]["numpy"] = ("MT19937", torch.zeros(10, dtype=torch.int64), 0, 0, 0.0)
    return ["numpy's is not an MT19937 state"]


UNFIT = ["adam_moment", "adam_count", "shape", "name", "unknown_arg", "rng", "optimizer", "iteration"]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    """A short run of ppo.py's with its checkpoint.pt."""
    runs = tmp_path_factory.mktemp("runs")
    return Path(ppo.main(ppo.Args(runs_dir=str(runs), total_timesteps=128, num_steps=32, num_envs=2,
                                  checkpoint_every=1, cuda=False)))  # fmt: skip


def test_a_checkpoint_without_a_newer_argument_resumes_with_its_default_and_says_so(ppo_run, tmp_path):
    """A checkpoint written before a flag existed (here without --kl-beta) resumes with the script's default for it,
    and one line names the flags it lacked: the runs of an earlier version of the script go on."""
    run_dir = tmp_path / "run"
    shutil.copytree(ppo_run, run_dir)
    path = run_dir / "checkpoint.pt"
    checkpoint = load(path)
    del checkpoint["args"]["kl_beta"]
    write_checkpoint_file(checkpoint, str(path))
    result = subprocess.run(
        script_command("ppo", "--resume", path, "--total-timesteps", 192),
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"note: {path} holds no --kl-beta (a checkpoint of an earlier version of the script)" in result.stdout
    assert load(path)["global_step"] == 192


@pytest.mark.parametrize(
    "case, flag",
    [(case, flag) for case in [*UNFIT, "numpy_rng", "legacy"] for flag in ("resume", "evaluate")
     if flag == "resume" or not case.startswith("adam")],  # (an evaluation does not read the optimizer)
)  # fmt: skip
def test_a_checkpoint_that_does_not_fit_the_script_is_refused_before_anything_is_loaded(ppo_run, case, flag, tmp_path):
    """A checkpoint whose checksums hold but whose contents do not fit the script (Adam's moments of other shapes or
    counts, tensors of other shapes or names, arguments of another version of Args, a missing entry, random states
    of another form), or a legacy torch.save file without checksums: one line naming it, exit 2, nothing written.
    Run as a command: a fused Adam given moments of other shapes corrupts memory (a crash, or weights near 1e18)."""
    run_dir = tmp_path / "run"
    shutil.copytree(ppo_run, run_dir)
    path = run_dir / "checkpoint.pt"
    checkpoint = load(path)
    if case == "legacy":
        path.unlink()
        torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
        words = ["legacy torch.save file", "python -m ppolab.rewrite_checkpoint"]
    else:
        words = unfit(case, checkpoint)
        write_checkpoint_file(checkpoint, str(path))
        if flag == "evaluate" and case in ("shape", "name"):  # the model's own load_state_dict names it
            words = ["does not fit this script's model", "critic.0.weight"]
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    result = subprocess.run(
        script_command("ppo", f"--{flag}", path, *(["--total-timesteps", "256"] if flag == "resume" else []),
                       "--runs-dir", tmp_path / "runs"),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and ": error: " in lines[0], result.stderr
    for word in words:
        assert word in lines[0]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", ["unknown_arg", "rng", "numpy_rng", "legacy"])
def test_every_script_refuses_a_checkpoint_of_another_layout_in_one_line(
    every_script, case, tmp_path, monkeypatch, capsys
):
    """--evaluate and --resume of every script read through the same checks: a checkpoint of the script's own Args
    with one thing out of place is one line, exit 2, and no run folder."""
    monkeypatch.chdir(tmp_path)
    checkpoint = {"model": {}, "optimizer": {"state": {}, "param_groups": []}, "iteration": 1, "global_step": 8,
                  "args": asdict(every_script.Args()), "script": f"{every_script.__name__}.py", "format": 3,
                  "rng": {"torch": torch.get_rng_state(), "numpy": ("MT19937", torch.zeros(624, dtype=torch.int64),
                          624, 0, 0.0), "python": __import__("random").getstate()}}  # fmt: skip
    path = tmp_path / "run" / "checkpoint.pt"
    path.parent.mkdir()
    if case == "legacy":
        torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
        words = ["legacy torch.save file"]
    else:
        words = unfit(case, checkpoint)
        write_checkpoint_file(checkpoint, str(path))
    for flag in ("evaluate", "resume"):
        line = refusal(every_script, capsys, runs_dir=str(tmp_path / "runs"), **{flag: str(path)})
        assert all(word in line for word in words) and str(path) in line, line
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]


def test_a_trusted_legacy_file_is_rewritten_as_a_checked_copy_that_resumes(ppo_run, tmp_path):
    """The word that accepts a legacy file: `python -m ppolab.rewrite_checkpoint OLD NEW` writes a checked copy with
    the same contents, which the script then reads."""
    legacy, copy = tmp_path / "legacy.pt", tmp_path / "run" / "checkpoint.pt"
    torch.save(load(ppo_run / "checkpoint.pt"), legacy, _use_new_zipfile_serialization=False)
    command = [sys.executable, "-m", "ppolab.rewrite_checkpoint", legacy, copy]
    copy.parent.mkdir()
    result = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0 and zipfile.is_zipfile(copy), result.stderr
    assert torch.equal(load(copy)["model"]["critic.0.weight"], load(legacy)["model"]["critic.0.weight"])
    resume = subprocess.run(script_command("ppo", "--resume", copy, "--total-timesteps", "256"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    assert resume.returncode == 0, resume.stderr
    assert load(copy)["global_step"] == 256


def test_a_checkpoint_is_flushed_before_its_rename_and_stale_temporary_files_go(tmp_path, monkeypatch):
    """write_checkpoint_file (the package's, every script's): fsync of the file, then the rename, then fsync of
    the folder; a `.pt.tmp` that a killed run left is gone after the next checkpoint."""
    (tmp_path / "checkpoint.pt.tmp").write_bytes(b"left by a kill")
    (tmp_path / "model.pt.tmp").write_bytes(b"left by a kill")
    events, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b)))
    path = tmp_path / "checkpoint.pt"
    write_checkpoint_file({"model": {}, "step": 7}, str(path))
    assert events == [("fsync", f"{path}.tmp"), ("replace", str(path)), ("fsync", str(tmp_path))]
    assert load(path)["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


class CodeInside:
    """What a hostile model file carries: an object whose unpickling runs a command (here: creating a
    marker file)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def code_carrying_file(name: str, path: Path, marker: Path, kind: str) -> Path:
    """A file that looks like a checkpoint of `name` and carries code: a torch.save archive or a bare pickle."""
    checkpoint = {"model": CodeInside(marker), "args": {}, "script": f"{name}.py", "format": 3}
    if kind == "torch":
        torch.save(checkpoint, path)
    else:
        path.write_bytes(pickle.dumps(checkpoint))
    return path


def test_the_code_carrying_file_does_run_code_when_unpickled(tmp_path):
    """The test's hostile file is real: a plain torch.load (weights_only=False) runs its command."""
    path = code_carrying_file("ppo", tmp_path / "model.pt", tmp_path / "marker", "torch")
    torch.load(path, weights_only=False)
    assert (tmp_path / "marker").exists()


@pytest.mark.parametrize("kind", ["torch", "pickle"])
@pytest.mark.parametrize("door", ["evaluate", "resume", "best_model"])
def test_a_file_carrying_code_is_refused_and_nothing_in_it_runs(
    every_script, door, kind, tmp_path, monkeypatch, capsys
):
    """--evaluate FILE, --resume FILE and --evaluate of a run's best_model.pt: exit 2, one line naming the
    file and what is wrong with it, and the code it carries never runs."""
    monkeypatch.chdir(tmp_path)
    name, marker = every_script.__name__, tmp_path / "marker"
    file = {"evaluate": "model.pt", "resume": "checkpoint.pt", "best_model": "best_model.pt"}[door]
    (tmp_path / "run").mkdir()
    path = code_carrying_file(name, tmp_path / "run" / file, marker, kind)
    line = refusal(every_script, capsys, **{"resume" if door == "resume" else "evaluate": str(path)})
    assert f"{path} holds code or objects that a checkpoint does not hold" in line and "nothing in it was run" in line
    assert not marker.exists()


FORMAT_2 = {"ppo": "format2_ppo_CartPole-v1.pt", "ppo_continuous_action": "format2_ppo_continuous_action_Hopper-v5.pt"}


@pytest.mark.parametrize("name", FORMAT_2)
def test_a_checkpoint_of_format_2_is_read_as_data_and_resumes(name, tmp_path, monkeypatch):
    """tests/data holds checkpoints written by the scripts at format 2 (before checkpoints were data only:
    NumPy arrays in the RNG state and statistics). They are read without allowing anything but NumPy's
    arrays, with the same values as an unrestricted read gives, and a run resumes from them."""
    monkeypatch.chdir(tmp_path)
    script = importlib.import_module(name)
    (tmp_path / "run").mkdir()
    path = Path(shutil.copy(Path(__file__).parent / "data" / FORMAT_2[name], tmp_path / "run" / "checkpoint.pt"))
    unrestricted = torch.load(path, weights_only=False)
    assert unrestricted["format"] == 2 and isinstance(unrestricted["rng"]["numpy"][1], np.ndarray)
    checkpoint = load_checkpoint(str(path), f"{name}.py")
    assert np.array_equal(checkpoint["rng"]["numpy"][1].numpy(), unrestricted["rng"]["numpy"][1])
    assert checkpoint["rng"]["python"] == unrestricted["rng"]["python"]
    for key in ("obs_rms", "reward_rms"):
        if key in unrestricted:
            assert np.array_equal(checkpoint[key]["mean"].numpy(), unrestricted[key]["mean"])
    assert all(torch.equal(value, unrestricted["model"][key]) for key, value in checkpoint["model"].items())
    step = unrestricted["global_step"]
    script.main(resume_args(script, path, total_timesteps=2 * step, cuda=False))
    resumed = load(path)
    assert (resumed["format"], resumed["global_step"], resumed["iteration"]) == (
        3,
        2 * step,
        2 * unrestricted["iteration"],
    )


# THE COMMAND LINE --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--seed", "abc"], "--seed: invalid literal for int() with base 10: 'abc'"),
        (["--learnign-rate", "3e-4"], "unknown flag --learnign-rate (did you mean --learning-rate?)"),
        (["--no-cud"], "unknown flag --no-cud (did you mean --no-cuda?)"),
        (["--seed"], "--seed needs a value"),
        (["--cuda", "maybe"], "unexpected value 'maybe' (a true/false flag takes none: --name or --no-name)"),
    ],
)
def test_a_command_line_that_cannot_be_read_is_one_line_naming_the_flag(every_script, argv, words, monkeypatch, capsys):
    """A mistyped flag (the known one closest to it suggested), a value that is not a number, a flag without its
    value, a value after a true/false flag: one line naming it and where the flags are listed, exit 2, not tyro's
    box of many lines."""
    name = every_script.__name__
    monkeypatch.setattr("sys.argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        parse(every_script.Args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"{name}.py: error: {words}; {name}.py --help lists the flags"]


# THE PROCESS'S ENVIRONMENT AND LIMITS ------------------------------------------------------------


@pytest.mark.parametrize(
    "case, words",
    [
        ({"torch_threads": 100_000}, "--torch-threads 100000 is more than 4 x the"),
        ({"torch_threads": 32768}, "--torch-threads 32768 is more than 4 x the"),
        ({"total_timesteps": 10**18}, "--total-timesteps 1000000000000000000 is too large"),
        ({"total_timesteps": 2**63}, "--total-timesteps 9223372036854775808 is too large"),
        ({"eval_every": 2**64}, "--eval-every 18446744073709551616 is too large"),
        ({"runs_dir": "runs\udcff"}, "holds bytes that are not UTF-8"),
        ({"exp_name": "a\udcffb"}, "--exp-name 'a\\udcffb' holds bytes that are not UTF-8"),
        ({"MUJOCO_GL": "bogus"}, "MUJOCO_GL=bogus is not a renderer MuJoCo has here"),
        ({"PYOPENGL_PLATFORM": "bogus"}, "PYOPENGL_PLATFORM=bogus is not a platform PyOpenGL has"),
        ({"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "osmesa"}, "MUJOCO_GL=egl needs PYOPENGL_PLATFORM=egl"),
    ],
    ids=lambda case: "-".join(map(str, case)) if isinstance(case, dict) else "",
)
def test_numbers_strings_and_variables_the_run_cannot_hold_are_one_line_before_its_folder(
    every_script, case, words, tmp_path, monkeypatch, capsys
):
    """Every numeric flag bounded to what the machine and the bookkeeping hold (a thread count that crashes PyTorch, a
    step budget whose time left overflows), every string flag valid UTF-8 (a byte that is not fails in TensorBoard),
    and the renderers' variables (read by MuJoCo when an environment is made, by PyOpenGL): one line, exit 2, no run
    folder."""
    monkeypatch.chdir(tmp_path)
    fields = {key: value for key, value in case.items() if key.islower()}
    for name, value in case.items():
        if name.isupper():
            monkeypatch.setenv(name, value)
    line = refusal(every_script, capsys, **{"runs_dir": str(tmp_path / "runs"), **fields})
    assert words in line, line
    assert list(tmp_path.iterdir()) == []


def test_output_the_terminal_cannot_encode_is_written_with_replacement_characters(tmp_path):
    """PYTHONIOENCODING=ascii and a run whose lines hold a character outside it (its --exp-name): every line is
    written, the character as "?", none dropped."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="ascii")
    command = script_command("ppo", "--exp-name", "café", "--total-timesteps", "128", "--num-steps", "32",
                             "--num-envs", "2", "--runs-dir", tmp_path / "runs")  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    stdout = result.stdout.decode("ascii")
    assert "CartPole-v1__caf?__1__" in stdout and "iteration 2/2 " in stdout, stdout
    assert result.stderr == b""


# RESUME WITH OTHER FLAGS -------------------------------------------------------------------------
# The rules are the package's (ppolab.checkpoints.resume_args, ppolab.command_line.parse), checked here with ppo.py's
# Args; every script resumes through them (test_contract.py resumes every script).


def saved_run(iteration: int = 2) -> dict:
    """What resume_args reads from a checkpoint: the saved arguments and how far the run got."""
    args = ppo.Args(torch_threads=2, num_envs=2)
    args.total_timesteps = 4 * args.batch_size
    return {"args": asdict(args), "iteration": iteration, "global_step": iteration * args.batch_size}


def test_resume_honours_what_may_change_and_keeps_the_rest():
    saved = saved_run()
    total = ppo.Args().batch_size * 10
    changed = ppo.Args(**{**saved["args"], "resume": "c.pt", "total_timesteps": total, "torch_threads": 3})
    args = resume_args_of(changed, saved)
    assert asdict(args) == {**saved["args"], "resume": "c.pt", "total_timesteps": total, "torch_threads": 3}


@pytest.mark.parametrize("flag, value", [("env_id", "Acrobot-v1"), ("gamma", 0.5), ("num_steps", 7)])
def test_resume_refuses_a_flag_that_cannot_change_naming_it(flag, value, capsys):
    saved = saved_run()
    with pytest.raises(SystemExit) as exit_info:
        resume_args_of(ppo.Args(**{**saved["args"], "resume": "c.pt", flag: value}), saved)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--{flag.replace('_', '-')} {value}: cannot change on --resume" in line


def test_resume_refuses_a_total_the_run_has_reached(capsys):
    saved = saved_run(iteration=4)
    with pytest.raises(SystemExit):
        resume_args_of(ppo.Args(**{**saved["args"], "resume": "c.pt"}), saved)
    assert "the run is at step" in capsys.readouterr().err


def test_the_command_line_of_a_resume_reads_the_saved_arguments_as_defaults(tmp_path, monkeypatch, capsys):
    """`--resume c.pt` alone gives the run's own arguments; a flag given means what it says, also when its
    value is the script's default (saved --num-envs 2, given --num-envs 4: refused, where a comparison with
    the defaults would have taken the 4 for "not given" and kept 2 without a word)."""
    path = tmp_path / "checkpoint.pt"
    agent = ppo.Agent(4, 2)
    saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters())}
    args = ppo.Args(**saved_run()["args"])
    write_checkpoint_file(checkpoint_data(saved, args, iteration=2, global_step=2 * args.batch_size), str(path))
    monkeypatch.setattr("sys.argv", ["ppo.py", "--resume", str(path), "--torch-threads", "1"])
    args = parse(ppo.Args)
    assert asdict(args) == {**saved_run()["args"], "resume": str(path), "torch_threads": 1}
    monkeypatch.setattr("sys.argv", ["ppo.py", "--resume", str(path), "--num-envs", "4"])
    assert parse(ppo.Args).num_envs == 4 == ppo.Args().num_envs
    with pytest.raises(SystemExit) as exit_info:
        resume_args_of(parse(ppo.Args), saved_run())
    assert exit_info.value.code == 2
    assert "--num-envs 4: cannot change on --resume (the run has 2)" in capsys.readouterr().err


# WEIGHTS & BIASES --------------------------------------------------------------------------------


def test_track_without_a_login_is_refused_before_any_work(every_script, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    line = refusal(every_script, capsys, track=True, runs_dir=str(tmp_path / "runs"))
    assert "--track: not logged in to Weights & Biases" in line and "wandb login" in line
    assert "WANDB_MODE=offline" in line
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_tracking(every_script.Args(track=True))  # offline: nothing to refuse


# CTRL-C ------------------------------------------------------------------------------------------

# A tiny run of each script, long enough to be interrupted after its first checkpoint. ppo.py and the
# shared-memory script record videos of CartPole, whose pygame would print a line of its own; Hopper-v5,
# not the default v4, whose deprecation warning would be two lines more.
CTRL_C_RUNS = {
    "ppo": ["--num-envs", 2, "--num-steps", 16, "--capture-video"],
    "ppo_continuous_action": ["--env-id", "Hopper-v5", "--num-envs", 2, "--num-steps", 16],
    "ppo_atari": ["--num-envs", 2, "--num-steps", 16],
    "ppo_atari_lstm": ["--num-envs", 2, "--num-steps", 16],
    "ppo_atari_multigpu": ["--num-envs", 2, "--num-steps", 16],
    "ppo_atari_envpool": ["--num-envs", 2, "--num-steps", 16],
    "ppo_procgen": ["--num-envs", 2, "--num-steps", 16],
    "ppo_shared_memory_lstm": [
        "--num-workers",
        2,
        "--num-envs-per-worker",
        1,
        "--num-steps",
        16,
        "--seq-len",
        8,
        "--capture-video",
    ],
    "ppo_continuous_action_redis": ["--env-id", "Hopper-v5", "--num-samplers", 1, "--num-chunks", 2, "--num-steps", 16],
}


# The file-size limit (bytes) under which a script's next checkpoint cannot be written while everything it
# writes before (TensorBoard's events, shared memory: ppo_shared_memory_lstm.py's weights, 0.3 MB, are a
# file in /dev/shm) can; and the one under which its TensorBoard events cannot be written. The multi-process
# scripts test their events under a limit in their own files (the shared memory needs a longer run there).
CHECKPOINT_LIMIT = {name: 500_000 if name == "ppo_shared_memory_lstm" else 32_000 for name in SCRIPTS}
EVENTS_LIMIT = {name: 1_000 for name in SCRIPTS if name not in MULTI_PROCESS}


def file_size_limit(limit: int):
    """For a child: writes beyond `limit` bytes fail with EFBIG (Python ignores the SIGXFSZ that comes with
    them), as on a full disk; and Ctrl-C gets its default disposition (default_ctrl_c)."""

    def set_limit():
        default_ctrl_c()
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def start_all(tmp_path, argv: dict, limits: dict | None = None) -> dict[str, subprocess.Popen]:
    """Every script at once, each in `tmp_path/<name>` and its own process group (a terminal's Ctrl-C
    reaches the script and its workers), on the CPU with one thread, stderr captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "SDL_"))}
    env["OMP_NUM_THREADS"] = "1"
    processes = {}
    for name, arguments in argv.items():
        (tmp_path / name).mkdir(exist_ok=True)
        preexec = file_size_limit(limits[name]) if limits else default_ctrl_c
        processes[name] = subprocess.Popen(
            script_command(name, *arguments),
            cwd=tmp_path / name,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,
            start_new_session=True,
        )
    return processes


def finish_all(processes: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str]]:
    """name -> (exit code, stderr) of every process, killing what is left after a minute."""
    results = {}
    try:
        for name, process in processes.items():
            _, stderr = process.communicate(timeout=60)
            results[name] = process.returncode, stderr
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return results


@pytest.mark.exclusive  # every script at once, the multi-process ones included, each given a minute to end
def test_ctrl_c_and_a_full_disk_end_every_script_in_one_line_with_the_resume_command(tmp_path):
    """All scripts at once, each in its own process group that gets SIGINT as a terminal's Ctrl-C sends
    it (to the script and its workers): exit code 130, and on stderr only the line that names the last
    checkpoint and the command that resumes it (no traceback, nothing from the workers, no SDL notice).
    Then each run resumed under a file-size limit that its next checkpoint exceeds (a full disk): exit 1,
    the one line naming the file, the error and the same resume command, no partial file, the last
    checkpoint intact; and a new run whose TensorBoard events exceed the limit ends the same way."""
    assert sorted(CTRL_C_RUNS) == sorted(SCRIPTS)
    tiny = {name: [*argv, "--num-minibatches", 2, "--update-epochs", 1] for name, argv in CTRL_C_RUNS.items()}
    no_video = {name: [arg for arg in argv if arg != "--capture-video"] for name, argv in tiny.items()}
    processes = start_all(
        tmp_path, {name: [*argv, "--total-timesteps", 10**8, "--checkpoint-every", 1] for name, argv in tiny.items()}
    )
    try:
        waiting, deadline = set(processes), time.monotonic() + 240
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                if list((tmp_path / name).glob("runs/*/checkpoint.pt")) or processes[name].poll() is not None:
                    os.killpg(processes[name].pid, signal.SIGINT)
                    waiting.discard(name)
            time.sleep(0.1)
        assert not waiting, f"no checkpoint in 240 s: {sorted(waiting)}"
    finally:
        results = finish_all(processes)
    checkpoints = {}
    for name, (returncode, stderr) in results.items():
        (checkpoint,) = (tmp_path / name).glob("runs/*/checkpoint.pt")
        checkpoints[name] = checkpoint.relative_to(tmp_path / name)
        path = checkpoints[name]
        hint = f"last checkpoint {path}; continue with: python {script_command(name)[1]} --resume {path}"
        assert returncode == 130, (name, stderr)
        assert stderr.splitlines() == [f"{name}.py: interrupted: {hint}"], (name, stderr)

    saved = {name: load(tmp_path / name / path)["iteration"] for name, path in checkpoints.items()}
    for name, path in checkpoints.items():  # (a resumed run records on, and would warn that it overwrites them)
        shutil.rmtree(tmp_path / name / path.parent / "videos", ignore_errors=True)
    results = finish_all(
        start_all(
            tmp_path,
            {name: ["--resume", path, "--no-capture-video"] for name, path in checkpoints.items()},
            CHECKPOINT_LIMIT,
        )
    )
    for name, (returncode, stderr) in results.items():
        path = checkpoints[name]
        hint = f"last checkpoint {path}; continue with: python {script_command(name)[1]} --resume {path}"
        assert returncode == 1, (name, stderr)
        assert stderr.splitlines() == [f"{name}.py: error: cannot write {path}: File too large; {hint}"], (name, stderr)
        assert not list((tmp_path / name / path.parent).glob("*.tmp"))
        assert load(tmp_path / name / path)["iteration"] == saved[name]

    for name in EVENTS_LIMIT:
        shutil.rmtree(tmp_path / name)
    results = finish_all(
        start_all(
            tmp_path, {name: [*no_video[name], "--total-timesteps", 10**8] for name in EVENTS_LIMIT}, EVENTS_LIMIT
        )
    )
    for name, (returncode, stderr) in results.items():
        (run_dir,) = (tmp_path / name).glob("runs/*")
        run_dir = run_dir.relative_to(tmp_path / name)
        assert returncode == 1, (name, stderr)
        assert stderr.splitlines() == [
            f"{name}.py: error: cannot write the TensorBoard events in {run_dir}: File too large; no checkpoint in "
            f"{run_dir} (--checkpoint-every N writes one every N iterations)"
        ], (name, stderr)


def test_children_get_the_default_ctrl_c_even_when_the_suite_ignores_it():
    """A suite started in the background (`nohup bash .ci/run &`) ignores SIGINT and so would every child
    it starts; the tests that send SIGINT start theirs with default_ctrl_c."""

    def ignores_sigint(preexec_fn) -> bool:
        child = subprocess.Popen(["sleep", "30"], preexec_fn=preexec_fn)
        try:
            ignored = int(Path(f"/proc/{child.pid}/status").read_text().split("SigIgn:")[1].split()[0], 16)
        finally:
            child.kill()
            child.wait()
        return bool(ignored & (1 << (signal.SIGINT - 1)))

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert ignores_sigint(None)  # what a background suite's children inherit
        assert not ignores_sigint(default_ctrl_c)
    finally:
        signal.signal(signal.SIGINT, previous)
