"""On a machine with CUDA: a few iterations of every script on the GPU, with the contract's tiny runs
(tests/helpers.py): the ratio is 1 at the first minibatch of every update (full float32: cuDNN's TF32
is off under --torch-deterministic), the checkpoint holds the CUDA generator's state, and a resume
restores it. Marked `gpu`; skipped where CUDA is not available (CI runs on the CPU)."""

import pytest
import torch

from helpers import load, make_args, read_scalars
from ppolab.checkpoints import set_rng_state

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_few_iterations_on_cuda_keep_ratio_one_and_save_the_cuda_rng(contract, tmp_path):
    script, _ = contract
    run_dir = script.main(make_args(script, tmp_path, cuda=True))
    deviations = [value for _, value in read_scalars(run_dir)["debug/first_minibatch_ratio_deviation"]]
    assert deviations and max(deviations) < 1e-5
    checkpoint = load(f"{run_dir}/checkpoint.pt")
    assert "cuda" in checkpoint["rng"]
    assert torch.backends.cudnn.conv.fp32_precision == "ieee" and torch.backends.cudnn.rnn.fp32_precision == "ieee"
    # resuming restores the CUDA generator: its next numbers are the ones the checkpoint saved
    set_rng_state(checkpoint["rng"], torch.device("cuda"))  # the package's, as a resumed run restores it
    expected = torch.rand(4, device="cuda")
    torch.cuda.set_rng_state(checkpoint["rng"]["cuda"])
    torch.testing.assert_close(torch.rand(4, device="cuda"), expected)


def test_compiled_steps_in_cuda_graphs_keep_ratio_one(contract, tmp_path):
    """--cudagraphs (torch.compile's CUDA graphs of the policy step and the update step): a few
    iterations run, the ratio is 1 at the first minibatch of every update, the losses are finite."""
    script, _ = contract
    run_dir = script.main(make_args(script, tmp_path, cuda=True, cudagraphs=True, save_model=False))
    scalars = read_scalars(run_dir)
    deviations = [value for _, value in scalars["debug/first_minibatch_ratio_deviation"]]
    assert deviations and max(deviations) < 1e-5
    assert all(abs(value) < float("inf") for _, value in scalars["losses/value_loss"])
