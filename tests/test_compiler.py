"""ppolab.compiler's stand-in for torch._dynamo, in a fresh interpreter each: torch.optim's guards (an optimizer
made, stepped, saved and loaded) leave the compiler unimported; then each way of asking for it imports the compiler
once and hands over: an attribute, a `from` import, a submodule's import (one module object, not two), and the guards
made before it call the compiler's own `disable`."""

import subprocess
import sys
import textwrap

import pytest

from scripts import REPO

SETUP = """
import sys, torch
from ppolab import compiler
compiler.defer()
net = torch.nn.Linear(3, 2)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5, fused=True)
for _ in range(2):
    optimizer.zero_grad()
    net(torch.ones(4, 3)).sum().backward()
    optimizer.step()
optimizer.load_state_dict(optimizer.state_dict())
assert compiler.compiler() is None, "torch.optim imported the compiler"
"""

ASKS = {
    "attribute": "torch._dynamo.config.suppress_errors",
    "from import": "from torch._dynamo import config",
    "submodule": "import torch._dynamo.utils; assert sys.modules['torch._dynamo.utils'] is torch._dynamo.utils",
}

AFTER = """
real = sys.modules["torch._dynamo"]
assert not isinstance(real, compiler.StandIn) and torch._dynamo is real and compiler.HANDOVER not in sys.meta_path
seen = []
real.disable = lambda fn, *args, **kwargs: (lambda *a, **k: seen.append(fn.__name__) or fn(*a, **k))
optimizer.zero_grad()  # its guard was made by the stand-in: it now goes through the compiler's disable
assert seen == ["zero_grad"], seen
print("ok")
"""


@pytest.mark.parametrize("ask", list(ASKS))
def test_the_compiler_is_imported_only_when_asked_for_and_then_takes_over(ask):
    code = SETUP + textwrap.dedent(ASKS[ask]) + "\n" + AFTER
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]
