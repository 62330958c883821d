"""A researcher's edit is trained exactly as written: the CPU fast path (NumpyPolicy, NumpyUpdate) of the
small-MLP scripts computes the code as it stands, or steps aside and says so.

Each edit below is applied to a copy of the script's text; the copy trains a few iterations from one seed
with the fast path on (the default) and with it off (`--no-numpy-update`: every step in PyTorch). Both runs
must end with the same weights (to float32 rounding), the ratio at every update's first minibatch must be 1
(the rollout sampled from the network the update trains), and the steps that cannot compute the edit must
say, in one line each, that they run in PyTorch, while those that can (another width, depth, Adam's betas
or eps) stay on. Add a researcher's next edit to EDITS.
"""

import importlib.util
import sys

import pytest
import torch

from helpers import read_scalars
from scripts import NUMPY_UPDATE, script_path

POLICY, UPDATE = "NumpyPolicy steps aside", "NumpyUpdate steps aside"
OPTIMIZER = "torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)"
WIDER = [
    ("nn.Linear(obs_dim, 64)", "nn.Linear(obs_dim, 128)"),
    ("nn.Linear(64, 64)", "nn.Linear(128, 128)"),
    ("nn.Linear(64, 1)", "nn.Linear(128, 1)"),
]
NOT_SEQUENTIAL = '''class Chain(nn.Module):
    """The layers applied one after the other, as nn.Sequential does, written by hand."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Agent(nn.Module):'''

# edit -> (scripts, [(old text, new text), ...] applied to every occurrence, the lines the run must print)
EDITS = {
    "relu": (NUMPY_UPDATE, [("nn.Tanh()", "nn.ReLU()")], [POLICY, UPDATE]),
    "elu": (NUMPY_UPDATE, [("nn.Tanh()", "nn.ELU()")], [POLICY, UPDATE]),
    "gelu": (NUMPY_UPDATE, [("nn.Tanh()", "nn.GELU()")], [POLICY, UPDATE]),
    "layer_norm": (
        NUMPY_UPDATE,
        [("layer_init(nn.Linear(obs_dim, 64)),", "layer_init(nn.Linear(obs_dim, 64)), nn.LayerNorm(64),")],
        [POLICY, UPDATE],
    ),
    "temperature": (
        ["ppo"],
        [("self.actor(x).log_softmax(-1)", "(self.actor(x) / 2.0).log_softmax(-1)")],
        [POLICY, UPDATE],
    ),
    "wider_std": (
        ["ppo_continuous_action"],
        [
            (
                "logstd = self.actor_logstd.expand_as(action_mean)",
                "logstd = (self.actor_logstd + 0.5).expand_as(action_mean)",
            ),
            (
                "action = action_mean + self.actor_logstd.exp() * eps",
                "action = action_mean + (self.actor_logstd + 0.5).exp() * eps",
            ),
            ("-0.5 * eps.square() - self.actor_logstd -", "-0.5 * eps.square() - (self.actor_logstd + 0.5) -"),
        ],
        [POLICY, UPDATE],
    ),
    "state_dependent_std": (
        ["ppo_continuous_action"],
        [
            (
                "self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))",
                "self.actor_logstd = layer_init(nn.Linear(obs_dim, act_dim), std=0.01)",
            ),
            ("logstd = self.actor_logstd.expand_as(action_mean)", "logstd = self.actor_logstd(x)"),
            (
                "action = action_mean + self.actor_logstd.exp() * eps",
                "action = action_mean + self.actor_logstd(x).exp() * eps",
            ),
            ("-0.5 * eps.square() - self.actor_logstd -", "-0.5 * eps.square() - self.actor_logstd(x) -"),
        ],
        [POLICY, UPDATE],
    ),
    "width_128": (["ppo"], [*WIDER, ("nn.Linear(64, n_actions)", "nn.Linear(128, n_actions)")], []),
    # ppo_continuous_action.py builds its three MLPs with one function (`mlp`): its edits are written for it
    "width_128_gaussian": (
        ["ppo_continuous_action"],
        [*WIDER[:2], ("nn.Linear(64, out_dim)", "nn.Linear(128, out_dim)")],
        [],
    ),
    "third_hidden_layer": (
        ["ppo"],
        [
            (
                "layer_init(nn.Linear(64, 64)),\n            nn.Tanh(),",
                "layer_init(nn.Linear(64, 64)),\n            nn.Tanh(),\n"
                "            layer_init(nn.Linear(64, 64)),\n            nn.Tanh(),",
            )
        ],
        [],
    ),
    "third_hidden_layer_mlp": (
        ["ppo_continuous_action"],
        [
            (
                "nn.Linear(64, 64)), nn.Tanh()]",
                "nn.Linear(64, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()]",
            )
        ],
        [],
    ),
    "not_sequential": (
        NUMPY_UPDATE,
        [("class Agent(nn.Module):", NOT_SEQUENTIAL), ("nn.Sequential(", "Chain(")],
        [POLICY, UPDATE],
    ),
    "adamw": (
        NUMPY_UPDATE,
        [(OPTIMIZER, "torch.optim.AdamW(agent.parameters(), lr=learning_rate, eps=1e-5)")],
        [UPDATE],
    ),
    "sgd": (
        NUMPY_UPDATE,
        [(OPTIMIZER, "torch.optim.SGD(agent.parameters(), lr=learning_rate, momentum=0.9)")],
        [UPDATE],
    ),
    "rmsprop": (
        NUMPY_UPDATE,
        [(OPTIMIZER, "torch.optim.RMSprop(agent.parameters(), lr=learning_rate, eps=1e-5)")],
        [UPDATE],
    ),
    # amsgrad and the dual clip change nothing in a run this short (Adam's second moment only grows, no ratio
    # reaches 3): the numbers cannot tell whether NumPy trained them, the line that NumpyUpdate steps aside can
    "amsgrad": (NUMPY_UPDATE, [(OPTIMIZER, OPTIMIZER.replace("fused=True", "fused=True, amsgrad=True"))], [UPDATE]),
    "adam_betas": (NUMPY_UPDATE, [(OPTIMIZER, OPTIMIZER.replace("eps=1e-5", "betas=(0.8, 0.99), eps=1e-5"))], []),
    "adam_eps": (NUMPY_UPDATE, [(OPTIMIZER, OPTIMIZER.replace("eps=1e-5", "eps=1e-3"))], []),
    "extra_loss_term": (
        NUMPY_UPDATE,
        [
            (
                "loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef",
                "loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + 0.01 * (newvalue**2).mean()",
            )
        ],
        [UPDATE],
    ),
    "dual_clip": (
        NUMPY_UPDATE,
        [
            (
                "pg_loss = torch.max(pg_loss1, pg_loss2).mean()",
                "pg_loss = torch.where(advantages < 0, torch.min(torch.max(pg_loss1, pg_loss2), "
                "-3.0 * advantages), torch.max(pg_loss1, pg_loss2)).mean()",
            )
        ],
        [UPDATE],
    ),
}
CASES = [(name, edit) for edit, (names, _, _) in EDITS.items() for name in names]
RUN = dict(
    num_envs=2,
    num_steps=64,
    num_minibatches=4,
    update_epochs=2,
    total_timesteps=3 * 128,
    cuda=False,
    save_model=False,
    seed=3,
)
ENV = {"ppo": "CartPole-v1", "ppo_continuous_action": "Hopper-v5"}


def edited_copy(name: str, edit: str, folder, monkeypatch):
    """The script with the edit applied to its text, written to `folder/<name>.py` and imported as a module
    of its own (the original module is untouched), registered in sys.modules until the test ends."""
    source = script_path(name).read_text()
    for old, new in EDITS[edit][1]:
        assert old in source, f"{edit}: {old!r} is not in {name}.py any more: update the edit"
        source = source.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_{edit}", path)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up while the file runs, and ppolab while it trains (the script's file name
    # for its checkpoints, its Agent for the fast path's guard)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, edit", CASES, ids=[f"{name}-{edit}" for name, edit in CASES])
def test_an_edited_script_trains_its_edit_with_or_without_the_fast_path(name, edit, tmp_path, capsys, monkeypatch):
    script = edited_copy(name, edit, tmp_path, monkeypatch)
    runs = {}
    for fast in (True, False):
        run_dir = script.main(
            script.Args(
                env_id=ENV[name], runs_dir=str(tmp_path / f"runs-{fast}"), numpy_update=fast, checkpoint_every=3, **RUN
            )
        )
        runs[fast] = (
            read_scalars(run_dir),
            torch.load(f"{run_dir}/checkpoint.pt", weights_only=True)["model"],
            capsys.readouterr().out,
        )
    (fast, fast_weights, printed), (reference, weights, _) = runs[True], runs[False]
    said = [line.split(",")[0] for line in printed.splitlines() if "steps aside" in line]
    assert sorted(said) == sorted(EDITS[edit][2]), printed
    assert max(v for _, v in fast["debug/first_minibatch_ratio_deviation"]) < 1e-5
    # the same episodes (MuJoCo's returns to the float rounding of the actions)
    returns = [v for _, v in reference["charts/episodic_return"]]
    assert [v for _, v in fast["charts/episodic_return"]] == pytest.approx(returns, rel=1e-4)
    for key, value in weights.items():
        torch.testing.assert_close(fast_weights[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_every_edit_still_applies():
    """An edit whose text is no longer in the script would test nothing: every one must change its scripts."""
    for edit, (names, replacements, _) in EDITS.items():
        for name in names:
            source = script_path(name).read_text()
            assert all(old in source for old, _ in replacements), (name, edit)
