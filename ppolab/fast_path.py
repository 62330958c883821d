"""The CPU fast path of the small-MLP scripts (ppo.py, ppo_continuous_action.py): their policy step and update
step computed in NumPy, and the guard that lets them run only where they compute exactly the script's code.

Why it exists: on a handful of observations one call of the PyTorch `act`, and on a small minibatch one
PyTorch update step, is nearly all per-operation overhead (dispatch, tensor allocation, autograd's and the
optimizer's bookkeeping), while the arithmetic is a few microseconds; NumPy's overhead is a fraction of
PyTorch's, and a run takes hundreds of thousands of policy steps and many thousands of update steps (why and
how much: benchmark/results/speed_cpu.md; `python -m benchmark.studies.speed fast-path ppo` measures both).

What it computes is the script's own code, written out: `Agent.act` (NumpyPolicy), and `update_step` with
`Agent.get_action_and_value`, `ppo_loss` and `torch.optim.Adam` (NumpyUpdate), for the two agents the scripts
define: separate actor and critic MLPs of Linear and Tanh layers, with a categorical head (ppo.py: `actor`
gives the logits) or a Gaussian one (ppo_continuous_action.py: `actor_mean` and a state-independent
`actor_logstd`). `numpy_fast_path` recognises them by their structure and by fingerprints of their code
(NUMPY_COMPUTES), checks them numerically on random inputs as a second line of defence, and otherwise leaves
the PyTorch code in place, saying so in one line: an edited network, loss or optimizer is trained as written.
tests/test_fast_path.py checks every piece against the PyTorch code it replaces.
"""

import ast
import copy
import hashlib
import inspect
import math
import textwrap
from functools import partial

import numpy as np
import torch
import torch.nn as nn

# The code NumpyPolicy and NumpyUpdate were written from, by fingerprint (code_fingerprint), for each kind of
# agent: a function whose code is not this (an edit, even one that computes the same) runs as PyTorch code.
# Whoever changes one of these functions and the NumPy code with it puts the new fingerprint here
# (tests/test_fast_path.py prints it).
NUMPY_COMPUTES = {
    "categorical": {
        "Agent.act": "930e9aefd9112da5",
        "Agent.get_action_and_value": "fd82e4b88f91ba7a",
        "Agent.get_value": "0fd1e9e6c677a71c",
        "ppo_loss": "ebcce9417e583863",
        "update_step": "a2a2e2a8516252f7",
    },
    "gaussian": {
        "Agent.act": "88f629c549fe9e20",
        "Agent.get_action_and_value": "28c2230a9cf6fb6e",
        "Agent.get_value": "0fd1e9e6c677a71c",
        "ppo_loss": "ebcce9417e583863",
        "update_step": "a2a2e2a8516252f7",
    },
}
# Adam's options: those NumpyUpdate follows whatever their value, and the others at the value it computes
ADAM_FOLLOWED = ("params", "lr", "betas", "eps", "foreach", "fused", "capturable")
ADAM_COMPUTED = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "differentiable": False,
    "decoupled_weight_decay": False,
}
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
LOG_SQRT_2PI_F32 = np.float32(LOG_SQRT_2PI)
# what an update step returns, in this order
STATS = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "ratio_deviation")


def agent_kind(agent: nn.Module) -> str | None:
    """ "categorical" (an `actor` giving logits and a `critic`), "gaussian" (an `actor_mean`, a `critic` and
    a parameter `actor_logstd`), or None."""
    parts, own = sorted(dict(agent.named_children())), [name for name, _ in agent.named_parameters(recurse=False)]
    if parts == ["actor", "critic"] and not own:
        return "categorical"
    if parts == ["actor_mean", "critic"] and own == ["actor_logstd"]:
        return "gaussian"
    return None


def linear_layers(net: nn.Sequential) -> list[nn.Linear]:
    return [module for module in net if isinstance(module, nn.Linear)]


def actor_of(agent: nn.Module) -> nn.Sequential:
    return agent.actor if agent_kind(agent) == "categorical" else agent.actor_mean


class RowIndex:
    """0, 1, ..., n - 1 for a batch of n rows, the index that picks one entry per row (an action's log-prob), made
    again only when the batch size changes."""

    def __init__(self):
        self.index = np.arange(0)

    def __call__(self, n: int) -> np.ndarray:
        if len(self.index) != n:
            self.index = np.arange(n)
        return self.index


# THE POLICY STEP ---------------------------------------------------------------------------------


class NumpyPolicy:
    """`Agent.act` for a run on the CPU, computed in NumPy: the same function of the same weights and the same
    random numbers. It reads the agent's parameters through NumPy views of their memory, so every optimizer step
    is seen without a copy. The noise is drawn from PyTorch's generator, as `act` draws it (the Gumbel noise of
    the categorical head's argmax, the Gaussian's standard normal), so a seed gives the same actions either way.
    """

    def __init__(self, agent: nn.Module):
        self.kind = agent_kind(agent)
        layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in linear_layers(actor_of(agent))]
        self.hidden, (self.out_weight, self.out_bias) = layers[:-1], layers[-1]
        if self.kind == "gaussian":
            self.actor_logstd = agent.actor_logstd.detach().numpy()
        self.rows = RowIndex()  # the row of each action's log-prob
        self.buffers = {}  # the noise tensor of each batch shape, with its NumPy view (noise)

    def noise(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
        """A tensor of this shape kept from call to call, and its NumPy view. Refilled in place (`exponential_`,
        `normal_`) it holds the numbers a new tensor would, from the same generator, without making one at every
        step (tests/test_fast_path.py checks the draws against `Agent.act`'s)."""
        if shape not in self.buffers:
            tensor = torch.empty(shape)
            self.buffers[shape] = tensor, tensor.numpy()
        return self.buffers[shape]

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy in, NumPy out (the rollout's arrays, no tensors on the way): action, log-prob. Each layer's
        x W + b and tanh are computed in place on the fresh product: the same numbers, fewer arrays."""
        x = obs
        for weight, bias in self.hidden:
            x = x @ weight
            x += bias
            np.tanh(x, out=x)
        out = x @ self.out_weight
        out += self.out_bias
        if self.kind == "categorical":  # Gumbel-max sampling of the log-softmax, as Agent.act
            logprobs = out  # the logits, made their log-softmax in place: minus their max, minus the log-sum-exp
            logprobs -= np.maximum.reduce(logprobs, axis=-1, keepdims=True)
            logprobs -= np.log(np.add.reduce(np.exp(logprobs), axis=-1, keepdims=True))
            tensor, noise = self.noise(logprobs.shape)
            tensor.exponential_()
            action = (logprobs - np.log(noise)).argmax(-1)
            return action, logprobs[self.rows(len(action)), action]
        tensor, eps = self.noise(out.shape)  # mean + std * eps, as Agent.act
        tensor.normal_()  # what torch.randn(out.shape) draws
        action = np.exp(self.actor_logstd) * eps
        action += out
        logprob = np.add.reduce(-0.5 * np.square(eps) - self.actor_logstd - LOG_SQRT_2PI_F32, axis=-1)
        return action, logprob


# THE UPDATE STEP ---------------------------------------------------------------------------------


class NumpyUpdate:
    """`update_step` for a run on the CPU, computed in NumPy with the gradients written out: the same step
    (forward, advantage normalisation, the loss of `ppo_loss`, backward, global gradient clipping, Adam) on the
    same parameters and the same Adam moments.

    Adam works on flat vectors: the parameters and Adam's two moments are moved into one flat tensor each (the
    same values; each parameter and each moment is then a view into it), so one NumPy operation updates all
    parameters where a loop took one per parameter; backward writes into one flat gradient. The model,
    `optimizer.state` (created here in Adam's own format if the optimizer has not stepped yet), checkpoints and
    `update_step` find the parameters and moments where they were and see every step. NumpyPolicy reads the
    parameters' memory, so it is made after this class. Where autograd splits a gradient between equal inputs of
    a max (torch.maximum's backward gives each half), so does this.
    """

    def __init__(self, agent: nn.Module, optimizer: torch.optim.Optimizer, args, kl_beta: torch.Tensor):
        self.args, self.group, self.kind = args, optimizer.param_groups[0], agent_kind(agent)
        self.kl_beta = kl_beta.numpy()  # PPO-Penalty's beta, read at every step (adapt_kl_beta changes it)
        actor, critic = linear_layers(actor_of(agent)), linear_layers(agent.critic)
        # in the order of the gradients in __call__: per network, per layer, weight then bias; a log-std last
        params = [param for layer in actor + critic for param in (layer.weight, layer.bias)]
        if self.kind == "gaussian":
            params.append(agent.actor_logstd)
        bounds = np.cumsum([0] + [p.numel() for p in params])
        flat = {name: torch.zeros(bounds[-1]) for name in ("param", "exp_avg", "exp_avg_sq")}
        steps = torch.zeros(len(params))  # Adam's step count of each parameter (a 0-d view each)
        for i, (param, start, end) in enumerate(zip(params, bounds[:-1], bounds[1:])):
            state = optimizer.state[param]
            if not state:  # what Adam's first step would create
                state.update(
                    step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param)
                )
            flat["param"][start:end] = param.detach().reshape(-1)
            param.data = flat["param"][start:end].view_as(param)
            for name in ("exp_avg", "exp_avg_sq"):
                flat[name][start:end] = state[name].reshape(-1)
                state[name] = flat[name][start:end].view_as(param)
            steps[i] = state["step"]
            state["step"] = steps[i]
        self.param, self.exp_avg, self.exp_avg_sq = (flat[name].numpy() for name in ("param", "exp_avg", "exp_avg_sq"))
        self.steps = steps.numpy()
        # the gradient, laid out as the parameters: backward writes each layer's gradient into its view; Adam's
        # intermediate vectors
        self.grad, self.scratch, self.denominator = (np.zeros_like(self.param) for _ in range(3))
        self.rows = RowIndex()  # each sample's row, where its action picks the column
        grads = [
            self.grad[start:end].reshape(param.shape) for param, start, end in zip(params, bounds[:-1], bounds[1:])
        ]
        # the layers as NumPy (weight, bias) views, read by forward and backward
        self.actor, self.critic = (
            [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in net] for net in (actor, critic)
        )
        layer_grads = list(zip(grads[0::2], grads[1::2]))  # (weight, bias) per layer, as the layers
        self.actor_grads, self.critic_grads = (
            layer_grads[: len(actor)],
            layer_grads[len(actor) : len(actor) + len(critic)],
        )
        if self.kind == "gaussian":
            self.logstd_grad, self.logstd = grads[-1], agent.actor_logstd.detach().numpy()

    @staticmethod
    def forward(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """The MLP's input and every layer's output (after tanh, except the last): what backward needs. Each
        layer's x W^T + b and tanh are computed in place on the fresh product: the same numbers, fewer arrays."""
        outputs = [x]
        for weight, bias in layers:
            if len(outputs) > 1:
                np.tanh(x, out=x)
            x = x @ weight.T
            x += bias
            outputs.append(x)
        return outputs

    @staticmethod
    def backward(
        outputs: list[np.ndarray],
        grad: np.ndarray,
        layers: list[tuple[np.ndarray, np.ndarray]],
        grads: list[tuple[np.ndarray, np.ndarray]],
    ):
        """Backpropagation through the MLP from the gradient of its output, written into `grads` (per layer,
        views of the flat gradient): per layer, weight grad.T @ input and bias grad summed over the samples;
        through a layer grad @ weight, through tanh times 1 - tanh^2."""
        for i in reversed(range(len(layers))):
            np.matmul(grad.T, outputs[i], out=grads[i][0])
            np.add.reduce(grad, axis=0, out=grads[i][1])
            if i > 0:
                grad = (grad @ layers[i][0]) * (1 - outputs[i] * outputs[i])

    @staticmethod
    def max_grads(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How the gradient of max(a, b) splits between a and b: all to the larger, half each on a tie."""
        to_a = np.float32(0.5) * (np.sign(a - b) + 1)  # a - b is 0 exactly where a == b (finite floats)
        return to_a, 1 - to_a

    @staticmethod
    def clamp(x: np.ndarray, low: float, high: float) -> np.ndarray:
        """x.clip(low, high) as torch.clamp computes it, without the method's Python-level overhead."""
        return np.minimum(np.maximum(x, low), high)

    def policy_forward(self, out: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
        """The head on the actor's output: each action's log-probability, the mean entropy, and what
        policy_backward needs. Categorical: log-softmax of the logits (in place on `out`), the action's entry,
        -sum p log p. Gaussian: the log-density of the actions (z: the actions in standard deviations from the mean)
        and the entropy, which is the same for every state."""
        n = len(out)
        if self.kind == "categorical":
            logp = out
            logp -= np.maximum.reduce(logp, axis=-1, keepdims=True)
            logp -= np.log(np.add.reduce(np.exp(logp), axis=-1, keepdims=True))
            probs = np.exp(logp)
            entropy = -np.add.reduce(probs * logp, axis=-1)
            return logp[self.rows(n), actions], np.add.reduce(entropy) / n, (actions, logp, probs, entropy)
        std = np.exp(self.logstd)
        z = (actions - out) / std
        newlogprob = np.add.reduce(-0.5 * z * z - self.logstd - LOG_SQRT_2PI_F32, axis=-1)
        entropy = np.add.reduce(np.float32(0.5 + LOG_SQRT_2PI) + self.logstd, axis=None)
        return newlogprob, entropy, (z, std)

    def policy_backward(self, grad_logprob: np.ndarray, context: tuple, n: int) -> np.ndarray:
        """The gradient of the loss with respect to the actor's output (and, Gaussian, the log-std's, written
        into its view), from the gradient with respect to the log-probabilities and the entropy bonus.
        Categorical: d log p_a / d logits = onehot(a) - p; d entropy / d logits = -p (log p + entropy).
        Gaussian: d log p / d mean = z / std; d log p / d logstd = z^2 - 1; d entropy / d logstd = 1."""
        ent_coef = self.args.ent_coef
        if self.kind == "categorical":
            actions, logp, probs, entropy = context
            grad_logits = -grad_logprob[:, None] * probs
            grad_logits[self.rows(n), actions] += grad_logprob
            grad_logits += (ent_coef / n) * probs * (logp + entropy[:, None])
            return grad_logits
        z, std = context
        grad_logstd = np.add.reduce(grad_logprob[:, None] * (z * z - 1), axis=0, keepdims=True)
        np.subtract(grad_logstd, np.float32(ent_coef), out=self.logstd_grad)
        return grad_logprob[:, None] * z / std

    def __call__(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        values: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        args = self.args
        x, actions, old_logprob, advantages, returns, old_values = [
            t.numpy() for t in (obs, actions, logprobs, advantages, returns, values)
        ]
        n, clip = len(x), args.clip_coef

        # forward: the policy head's log-probabilities and entropy; the critic's value
        actor_out, critic_out = self.forward(x, self.actor), self.forward(x, self.critic)
        newlogprob, entropy, context = self.policy_forward(actor_out[-1], actions)
        newvalue = critic_out[-1][:, 0]
        if args.norm_adv:
            centred = advantages - np.add.reduce(advantages) / n
            advantages = centred / (np.sqrt(np.dot(centred, centred) / (n - 1)) + 1e-8)

        # the loss of ppo_loss, and its gradient with respect to the log-prob and the value
        logratio = newlogprob - old_logprob
        ratio = np.exp(logratio)
        ratio_change = ratio - 1
        approx_kl = np.add.reduce(ratio_change - logratio) / n
        minus_advantages = -advantages
        if args.policy_objective == "clip":
            pg_loss1 = minus_advantages * ratio
            pg_loss2 = minus_advantages * self.clamp(ratio, 1 - clip, 1 + clip)
            to_1, to_2 = self.max_grads(pg_loss1, pg_loss2)
            in_clip = (ratio >= 1 - clip) & (ratio <= 1 + clip)  # where the clamp passes the gradient
            grad_logprob = (to_1 + to_2 * in_clip) * minus_advantages * ratio / n  # d(ratio)/d(log-prob) = ratio
            pg_loss = np.add.reduce(np.maximum(pg_loss1, pg_loss2)) / n
        else:  # PPO-Penalty: -A * ratio + beta * ((ratio - 1) - logratio), whose derivative is -A * ratio + beta * (ratio - 1)
            beta = self.kl_beta
            surrogate = minus_advantages * ratio
            grad_logprob = (surrogate + beta * ratio_change) / n
            pg_loss = np.add.reduce(surrogate) / n + beta * approx_kl
        error = newvalue - returns
        if args.clip_vloss:
            v_loss_unclipped = error**2
            v_change = newvalue - old_values
            v_clipped_error = old_values + self.clamp(v_change, -clip, clip) - returns
            v_loss_clipped = v_clipped_error**2
            to_1, to_2 = self.max_grads(v_loss_unclipped, v_loss_clipped)
            in_clip = (v_change >= -clip) & (v_change <= clip)
            grad_value = (to_1 * error + to_2 * in_clip * v_clipped_error) * args.vf_coef / n
            v_loss = 0.5 * np.add.reduce(np.maximum(v_loss_unclipped, v_loss_clipped)) / n
        else:
            grad_value = error * args.vf_coef / n
            v_loss = 0.5 * np.add.reduce(np.square(error)) / n

        # backward through the head and both networks
        self.backward(actor_out, self.policy_backward(grad_logprob, context, n), self.actor, self.actor_grads)
        self.backward(critic_out, grad_value[:, None], self.critic, self.critic_grads)

        # global gradient clipping, then Adam as torch.optim.Adam computes it, on the flat vectors (in place, with
        # two scratch vectors: the same numbers, no new arrays)
        grad, scratch, denominator = self.grad, self.scratch, self.denominator
        norm = math.sqrt(float(np.dot(grad, grad)))
        grad *= min(1.0, args.max_grad_norm / (norm + 1e-6))
        (beta1, beta2), eps, lr = self.group["betas"], self.group["eps"], float(self.group["lr"])
        self.steps += 1
        step = float(self.steps[0])
        step_size, root_correction2 = lr / (1 - beta1**step), math.sqrt(1 - beta2**step)
        np.subtract(grad, self.exp_avg, out=scratch)  # exp_avg += (1 - beta1) * (grad - exp_avg)
        scratch *= 1 - beta1
        self.exp_avg += scratch
        self.exp_avg_sq *= beta2  # exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
        np.multiply(grad, 1 - beta2, out=scratch)
        scratch *= grad
        self.exp_avg_sq += scratch
        np.sqrt(self.exp_avg_sq, out=denominator)  # param -= step_size * exp_avg / (sqrt(exp_avg_sq) / rc2 + eps)
        denominator /= root_correction2
        denominator += eps
        np.multiply(self.exp_avg, step_size, out=scratch)
        scratch /= denominator
        self.param -= scratch

        deviation = np.abs(ratio_change)
        stats = np.array(
            [
                pg_loss,
                v_loss,
                entropy,
                -np.add.reduce(logratio) / n,
                approx_kl,
                np.count_nonzero(deviation > clip) / n,
                np.maximum.reduce(deviation),
            ],
            dtype=np.float32,
        )
        return dict(zip(STATS, torch.from_numpy(stats).unbind()))


# THE GUARD ---------------------------------------------------------------------------------------


def code_fingerprint(function) -> str:
    """A short hash of a function's code as Python reads it: docstring, comments and layout left out."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:16]


def code_problem(functions: dict, fingerprints: dict) -> str | None:
    """The first of `functions` (name -> function) whose code is not the code the NumPy path computes."""
    for name, function in functions.items():
        try:
            fingerprint = code_fingerprint(function)
        except (OSError, TypeError, SyntaxError, IndexError):
            return f"the code of {name} cannot be read"
        if fingerprint != fingerprints[name]:
            return f"{name} is not the code it computes"
    return None


def mlp_problem(name: str, net: nn.Module) -> str | None:
    """What the NumPy steps compute is an nn.Sequential of Linear layers (with biases) with Tanh between them;
    the way `net` differs from that, or None."""
    if type(net) is not nn.Sequential:
        return f"{name} is a {type(net).__name__}, not an nn.Sequential of Linear and Tanh layers"
    for i, module in enumerate(net):
        expected = nn.Linear if i % 2 == 0 else nn.Tanh
        if type(module) is not expected:
            return f"{name}[{i}] is {type(module).__name__}, where it computes {expected.__name__}"
    if len(net) % 2 == 0 or any(layer.bias is None for layer in net[::2]):
        return f"{name} does not end in a Linear layer, or has one without a bias"
    return None


def agent_problem(agent: nn.Module, script) -> str | None:
    """The way `agent` differs from an Agent the NumPy steps compute (the script's own class: an actor, or an
    actor mean with a state-independent log standard deviation, and a critic, of Linear and Tanh layers, no
    hooks), or None."""
    if type(agent) is not getattr(script, "Agent", None):
        return f"the agent is a {type(agent).__name__}, not the script's Agent"
    kind = agent_kind(agent)
    if kind is None:
        parts = sorted(dict(agent.named_children())) + sorted(dict(agent.named_parameters(recurse=False)))
        return f"Agent has the parts {parts}, not an actor (or an actor mean and actor_logstd) and a critic"
    if kind == "gaussian" and agent.actor_logstd.shape != (1, agent.actor_mean[-1].out_features):
        return f"Agent.actor_logstd has the shape {tuple(agent.actor_logstd.shape)}, not (1, action dimensions)"
    if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in agent.modules()):
        return "Agent has hooks"
    actor = "Agent.actor" if kind == "categorical" else "Agent.actor_mean"
    return mlp_problem(actor, actor_of(agent)) or mlp_problem("Agent.critic", agent.critic)


def optimizer_problem(agent: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """The way `optimizer` differs from the Adam that NumpyUpdate computes, or None."""
    if type(optimizer) is not torch.optim.Adam:
        return f"the optimizer is {type(optimizer).__name__}, not torch.optim.Adam"
    if len(optimizer.param_groups) != 1 or (
        [id(p) for p in optimizer.param_groups[0]["params"]] != [id(p) for p in agent.parameters()]
    ):
        return "the optimizer does not hold the agent's parameters as one group"
    for key, value in optimizer.param_groups[0].items():
        if key not in ADAM_FOLLOWED and (key not in ADAM_COMPUTED or value != ADAM_COMPUTED[key]):
            return f"Adam's {key}={value!r}, which it does not compute"
    return None


def numpy_policy_agrees(agent: nn.Module) -> bool:
    """A second line of defence: NumpyPolicy and `agent.act` give the same actions and log-probs on random
    observations from the same generator state (the training's generator left as it was)."""
    obs = torch.from_numpy(np.random.default_rng(0).standard_normal((8, actor_of(agent)[0].in_features), np.float32))
    with torch.random.fork_rng(devices=[]):
        state = torch.get_rng_state()
        expected = agent.act(obs)
        torch.set_rng_state(state)
        got = [torch.from_numpy(x) for x in NumpyPolicy(agent)(obs.numpy())]
    if agent_kind(agent) == "categorical" and not torch.equal(got[0], expected[0]):
        return False
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, expected))


def numpy_update_agrees(agent: nn.Module, optimizer: torch.optim.Optimizer, args, kl_beta, update_step) -> bool:
    """A second line of defence: two steps of NumpyUpdate and of `update_step`, from copies of the agent and of
    the optimizer, on a random minibatch whose log-probs and values are off enough to clip, must give the same
    parameters and statistics. The training's RNG streams, its agent and its optimizer's state (Adam's moments
    after a --resume) are untouched."""
    rng = np.random.default_rng(0)
    actor = actor_of(agent)
    n, obs_dim, out_dim = args.minibatch_size, actor[0].in_features, actor[-1].out_features
    obs = torch.from_numpy(rng.standard_normal((n, obs_dim), dtype=np.float32))
    if agent_kind(agent) == "categorical":
        actions = torch.from_numpy(rng.integers(0, out_dim, n))
    else:
        actions = torch.from_numpy(rng.standard_normal((n, out_dim), dtype=np.float32))
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    noise = [torch.from_numpy(rng.standard_normal(n, dtype=np.float32)) for _ in range(4)]
    batch = (obs, actions, logprobs + 0.3 * noise[0], noise[1], values + noise[2], values + 0.3 * noise[3])
    results = []
    for fast in (False, True):
        copy_ = copy.deepcopy(agent)
        copy_optimizer = type(optimizer)(copy_.parameters(), **optimizer.defaults)
        # a deep copy: load_state_dict keeps the tensors it is given, and the steps below change them in place
        copy_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        bound = (copy_, copy_optimizer, args, kl_beta.clone())
        step = NumpyUpdate(*bound) if fast else partial(update_step, *bound)
        stats = [step(*batch) for _ in range(2)]
        results.append([*copy_.parameters(), *(torch.stack(list(s.values())) for s in stats)])
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(*results))


def numpy_fast_path(agent: nn.Module, optimizer: torch.optim.Optimizer, args, act, update):
    """On the CPU (unless --no-numpy-update): NumpyPolicy in place of `act`, and NumpyUpdate in place of `update`
    (`partial(update_step, agent, optimizer, args, kl_beta)`; not under --compile), each only where it computes this run's
    code: the agent, and for the update the optimizer, must be the ones it implements, recognised by their
    structure and by the fingerprints of their code (NUMPY_COMPUTES: the Agent's methods, `update_step` and the
    `ppo_loss` it calls), and a numerical check must agree. Otherwise the step stays PyTorch's and the run says
    so in one line, after the line that says which steps do run as NumPy mirrors (and how to run the PyTorch code
    instead). Returns the policy step and the update step to use."""
    if next(agent.parameters()).device.type != "cpu" or not args.numpy_update:
        return act, update
    try:
        script = inspect.getmodule(type(agent))
        fingerprints = NUMPY_COMPUTES.get(agent_kind(agent), {})
        policy_problem = (
            agent_problem(agent, script)
            or code_problem({"Agent.act": type(agent).act}, fingerprints)
            or (None if numpy_policy_agrees(agent) else "a check on random observations disagreed")
        )
        update_problem = None
        if not args.compile:
            # update_step(agent, optimizer, args, kl_beta, <minibatch>) with the first four bound
            bound = update.args if isinstance(update, partial) else ()
            update_step = update.func if len(bound) == 4 and bound[:3] == (agent, optimizer, args) else None
            update_problem = (
                agent_problem(agent, script)
                or optimizer_problem(agent, optimizer)
                or (None if update_step is not None else "the update step is not update_step of this run")
                or code_problem(
                    {
                        "Agent.get_action_and_value": type(agent).get_action_and_value,
                        "Agent.get_value": type(agent).get_value,
                        "ppo_loss": update_step.__globals__.get("ppo_loss"),
                        "update_step": update_step,
                    },
                    fingerprints,
                )
                or (
                    None
                    if numpy_update_agrees(agent, optimizer, args, bound[3], update_step)
                    else "a check on one minibatch disagreed"
                )
            )
    except Exception as e:  # the checks themselves failed on an edited agent or optimizer: not the same code
        policy_problem = update_problem = f"its check failed ({type(e).__name__}: {e})"
    # the run's first lines: which steps run as NumPy mirrors and how to run the PyTorch code, then why a mirror
    # steps aside
    mirrored = [] if policy_problem else [("Agent.act", "ppolab.NumpyPolicy")]
    mirrored += [] if args.compile or update_problem else [("update_step", "ppolab.NumpyUpdate")]
    if mirrored:
        functions, mirrors = (" and ".join(names) for names in zip(*mirrored))
        verb = "runs as a NumPy mirror" if len(mirrored) == 1 else "run as NumPy mirrors"
        print(
            f"on the CPU {functions} {verb} ({mirrors}: the same computation, faster); --no-numpy-update runs "
            "this file's PyTorch code",
            flush=True,
        )
    if not args.compile:
        if update_problem is None:
            update = NumpyUpdate(*update.args)
        else:
            print(
                f"NumpyUpdate steps aside, the update step runs as update_step in PyTorch: {update_problem}", flush=True
            )
    if policy_problem is None:
        act = NumpyPolicy(agent)  # after NumpyUpdate, which moves the parameters into one flat tensor
    else:
        print(f"NumpyPolicy steps aside, the policy step runs as Agent.act in PyTorch: {policy_problem}", flush=True)
    return act, update
