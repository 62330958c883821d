"""PyTorch's compiler (torch._dynamo) imported only by a program that compiles.

torch.optim guards an optimizer's methods against the compiler, and the guards import it: the first call of
`add_param_group` (made by the optimizer's constructor), `zero_grad`, `state_dict` or `load_state_dict` imports
torch._dynamo to wrap the method in `torch._dynamo.disable`, and every `step` imports it to call
`torch._dynamo.graph_break()`. Outside a function being compiled both do nothing, but the import costs about as
much CPU as importing torch itself, in every process that makes an optimizer: every training run and every test
that starts a script (benchmark/results/speed.md).

`defer()`, called when the program starts (`run_program`), puts a stand-in for the module in `sys.modules`. It
answers those two calls as the compiler does when nothing is being compiled: `graph_break()` does nothing and
`disable(fn)` calls `fn`. Anything else asked of it (`torch.compile` in a `--compile` run, a researcher's
`torch._dynamo.config`) imports the compiler there and then, and the stand-in hands over: the module is the
compiler's from then on, and the guards made before it call the compiler's own `disable`. `import
torch._dynamo.<submodule>` imports the compiler, then the submodule (`Handover`).
So what a program computes is the same with the stand-in or without it; only when the compiler is imported changes.

Imports nothing but the standard library.
"""

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

NAME = "torch._dynamo"


def compiler() -> types.ModuleType | None:
    """The compiler's module where it has been imported, else None."""
    module = sys.modules.get(NAME)
    return None if module is None or isinstance(module, StandIn) else module


class StandIn(types.ModuleType):
    """torch._dynamo until something needs the compiler (the module docstring)."""

    def __init__(self, path: list[str]):
        super().__init__(NAME, "ppolab.compiler's stand-in for torch._dynamo: the compiler is not imported yet")
        self.__path__ = path

    @staticmethod
    def graph_break(*args, **kwargs):
        """Nothing, as the compiler's graph_break does outside a compiled function."""
        module = compiler()
        if module is not None:
            module.graph_break(*args, **kwargs)

    @staticmethod
    def disable(fn=None, recursive=True, **options):
        """`fn` guarded against the compiler: called as it is while the compiler is not imported, through the
        compiler's own `disable(fn)` once it is. Without `fn`, a decorator that does this."""
        if fn is None:
            return lambda fn: StandIn.disable(fn, recursive, **options)
        guarded = None

        def call(*args, **kwargs):
            nonlocal guarded
            module = compiler()
            if module is None:
                return fn(*args, **kwargs)
            if guarded is None:
                guarded = module.disable(fn, recursive, **options)
            return guarded(*args, **kwargs)

        return functools.wraps(fn)(call) if options.get("wrapping", True) else call

    def __getattr__(self, name: str):
        """Any other attribute: the compiler's."""
        return getattr(load(), name)


class Handover(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import torch._dynamo.<submodule>` while the stand-in is in place: the compiler imported first, then the
    submodule as the compiler's own (imported once, as without the stand-in)."""

    def __init__(self):
        self.specs = {}

    def find_spec(self, name: str, path, target=None):
        if name.startswith(NAME + ".") and isinstance(sys.modules.get(NAME), StandIn):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        load()
        module = importlib.import_module(spec.name)
        self.specs[spec.name] = module.__spec__  # (the import system gives the module this finder's spec)
        return module

    def exec_module(self, module):
        module.__spec__ = self.specs.pop(module.__name__)


HANDOVER = Handover()


def load() -> types.ModuleType:
    """The compiler, imported now in place of the stand-in."""
    module = compiler()
    if module is None:
        stand_in = sys.modules.pop(NAME)
        if HANDOVER in sys.meta_path:
            sys.meta_path.remove(HANDOVER)
        torch = sys.modules.get("torch")
        if torch is not None and torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo
        module = importlib.import_module(NAME)
    return module


def defer():
    """The stand-in in place of torch._dynamo, where torch is imported and the compiler is not yet."""
    if "torch" in sys.modules and NAME not in sys.modules:
        spec = importlib.util.find_spec(NAME)  # where the package is, without importing it
        if spec is not None and spec.submodule_search_locations:
            sys.modules[NAME] = StandIn(list(spec.submodule_search_locations))
            sys.meta_path.insert(0, HANDOVER)
