"""A fake CUDA device on the CPU: runs a script in-process as if a GPU were there, so that the CUDA code
paths are checked without one.

    with FakeCuda(script) as fake:
        script.main(script.Args(..., cuda=True))
    fake.violations      # what would raise on a real GPU: {(file:line, message): count}
    fake.events          # host-device copies and syncs: {(kind, file:line, phase): count}

`torch.cuda.is_available()` says True, so the script picks `torch.device("cuda")`. Tensors stay on the
CPU, but every storage carries a tag, "on the device" or not, and two modes watch every operation:

- a TorchFunctionMode answers `.device` / `.is_cuda` from the tag, performs the moves (`.to`, `.cuda`,
  `.cpu`, factories with `device=`) and records each as a copy, models pinned memory (`pin_memory=True`,
  `.pin_memory()`, `.is_pinned()`), and records what real CUDA does differently: `.numpy()` of a
  device tensor (an error), `.item()`, `.tolist()`, `bool()`, `float()`, `int()` of one (a sync), an
  LSTM on the device with non-contiguous states (cuDNN refuses them);
- a TorchDispatchMode sees every aten operation, backward pass and optimizer included: it tags the
  results of device operations, records an operation that mixes device tensors with CPU tensors of
  one or more dimensions (real CUDA raises), cross-device `copy_`, and the operations whose result
  size depends on the data (`nonzero`, boolean-mask indexing, ...), which sync on CUDA.

Each record names the script's line (the innermost frame outside torch and this file) and its phase:
"rollout" while a frame of the script stands between its COLLECT TRAJECTORIES and CALCULATE ADVANTAGES
banners, else "". The CUDA generator state, `torch.cuda.Event` and `synchronize` are modelled, so
checkpoints and timers work. Numbers are the CPU's; streams, NCCL and memory limits are not modelled.
"""

import collections
import importlib
import os
import re
import sys
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten
DEVICE = torch.device("cuda", 0)
THIS_FILE = os.path.abspath(__file__)
TORCH_DIR = os.path.dirname(torch.__file__)

# Python-level reads of a device tensor's value: each waits for the device
READS = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.__bool__: "bool()",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__int__: "int()",
    torch.Tensor.__index__: "index()",
}
# operations whose output size depends on the data: the host waits for the device to know it
DATA_DEPENDENT = {
    aten.nonzero,
    aten.masked_select,
    aten.equal,
    aten._unique2,
    aten.unique_consecutive,
    aten.repeat_interleave,
    aten.unique_dim,
}
# operations that may take CPU and device tensors together on real CUDA
MAY_MIX = {
    aten.copy_,
    aten._to_copy,
    aten.lift_fresh,
    aten.lift_fresh_copy,
    aten.detach,
    aten.alias,
    aten._local_scalar_dense,
}
INDEX = {aten.index, aten._unsafe_index}
INDEX_PUT = {aten.index_put_, aten.index_put, aten._index_put_impl_, aten._unsafe_index_put}


class _Tags:
    """Storages marked by their data pointer (forgotten when the storage dies); empty tensors, which
    have no storage memory, by identity."""

    def __init__(self):
        self.pointers, self.empty = {}, WeakTensorKeyDictionary()

    def __contains__(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        ptr = _pointer(t)
        return t in self.empty if not ptr else ptr in self.pointers

    def add(self, t: torch.Tensor):
        ptr = _pointer(t)
        if ptr is None:
            return
        if ptr == 0:
            self.empty[t] = True
        elif ptr not in self.pointers:
            self.pointers[ptr] = True
            weakref.finalize(t.untyped_storage(), self.pointers.pop, ptr, None)

    def discard(self, t: torch.Tensor):
        ptr = _pointer(t)
        if ptr:
            self.pointers.pop(ptr, None)
        elif t in self.empty:
            del self.empty[t]


def _pointer(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def rollout_lines(path: str) -> list[tuple[int, int]]:
    """The line ranges of a script's rollouts: from each COLLECT TRAJECTORIES banner to the next
    CALCULATE ADVANTAGES banner."""
    ranges, start = [], None
    for number, line in enumerate(open(path).read().splitlines(), 1):
        if re.match(r"\s*# COLLECT TRAJECTORIES", line):
            start = number
        elif re.match(r"\s*# CALCULATE ADVANTAGES", line) and start is not None:
            ranges.append((start, number))
            start = None
    return ranges


class FakeCuda:
    def __init__(self, *scripts):
        self.on_device, self.pinned = _Tags(), _Tags()
        self.violations, self.events = collections.Counter(), collections.Counter()
        self.rollouts = {os.path.abspath(s.__file__): rollout_lines(s.__file__) for s in scripts}
        self.cuda_rng_state = torch.Generator().get_state()
        self.modes = [_FunctionMode(self), _DispatchMode(self)]
        self.saved = []

    # what happened, where ---------------------------------------------------------------------------
    def _where(self) -> tuple[str, str]:
        frame, site, phase = sys._getframe(2), None, ""
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if site is None and name != THIS_FILE and not name.startswith(TORCH_DIR) and "site-packages" not in name:
                site = f"{os.path.basename(name)}:{frame.f_lineno}"
            if any(a <= frame.f_lineno < b for a, b in self.rollouts.get(name, ())):
                phase = "rollout"
            frame = frame.f_back
        return site or "?", phase

    def violation(self, message: str):
        self.violations[(self._where()[0], message)] += 1

    def event(self, kind: str):
        self.events[(kind, *self._where())] += 1

    def count(self, kind_prefix: str, phase: str = "rollout") -> int:
        return sum(n for (kind, _, p), n in self.events.items() if kind.startswith(kind_prefix) and p == phase)

    # the device as torch.cuda presents it -------------------------------------------------------------
    def __enter__(self):
        fake = self

        class Event:
            def __init__(self, *args, **kwargs):
                pass

            def record(self, stream=None):
                pass

            def synchronize(self):
                fake.event("sync Event.synchronize")

            def elapsed_time(self, end) -> float:
                return 0.0

            def query(self) -> bool:
                return True

        def set_rng_state(state, device="cuda"):
            fake.cuda_rng_state = state.clone()

        self._patch(
            torch.cuda,
            is_available=lambda: True,
            device_count=lambda: 1,
            current_device=lambda: 0,
            set_device=lambda device: None,
            _lazy_init=lambda: None,
            synchronize=lambda device=None: fake.event("sync torch.cuda.synchronize"),
            Event=Event,
            get_rng_state=lambda device="cuda": fake.cuda_rng_state.clone(),
            set_rng_state=set_rng_state,
        )
        # torch's optimizers and gradient clipping group tensors by device: by the tagged one here, as
        # they would on a GPU (else they would move the device's results "to the CPU")
        for name in ("torch.nn.utils.clip_grad", "torch.optim.optimizer"):
            importlib.import_module(name)
        original = importlib.import_module("torch.utils._foreach_utils")._group_tensors_by_device_and_dtype

        def grouped(tensorlistlist, with_indices=False):
            groups = original(tensorlistlist, with_indices)
            return {
                (
                    DEVICE if next((t for t in value[0] if t is not None), None) in fake.on_device else device,
                    dtype,
                ): value
                for (device, dtype), value in groups.items()
            }

        for module in list(sys.modules.values()):
            if getattr(module, "_group_tensors_by_device_and_dtype", None) is original:
                self._patch(module, _group_tensors_by_device_and_dtype=grouped)
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exception):
        for mode in reversed(self.modes):
            mode.__exit__(*exception)
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)
        self.saved.clear()

    def _patch(self, owner, **values):
        for name, value in values.items():
            self.saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)


def _wants_device(device) -> bool:
    if device is None:
        return False
    return isinstance(device, int) or torch.device(device).type == "cuda"


class _FunctionMode(TorchFunctionMode):
    def __init__(self, fake: FakeCuda):
        super().__init__()
        self.fake = fake

    def __torch_function__(self, func, types, args=(), kwargs=None):
        fake, kwargs = self.fake, dict(kwargs or {})
        name = getattr(func, "__name__", None)
        if name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.device:
            return DEVICE if args[0] in fake.on_device else func(*args)
        if name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.is_cuda:
            return args[0] in fake.on_device
        if func is torch.Tensor.is_pinned:
            return args[0] in fake.pinned
        if func is torch.Tensor.pin_memory:
            result = args[0].clone()
            fake.pinned.add(result)
            return result
        if func is torch.Tensor.numpy and args[0] in fake.on_device:
            fake.violation("numpy() of a CUDA tensor")
        if func in READS and args[0] in fake.on_device:
            fake.event(f"sync {READS[func]}")
        if name == "lstm" and len(args) > 1 and isinstance(args[1], (tuple, list)):
            states = [h for h in args[1] if isinstance(h, torch.Tensor)]
            if any(h in fake.on_device for h in states) and not all(h.is_contiguous() for h in states):
                fake.violation("LSTM on CUDA with non-contiguous states (cuDNN: hx is not contiguous)")
        if func is torch.Tensor.cpu:
            return self._move(args[0], False, None, False)
        if func is torch.Tensor.cuda:
            return self._move(args[0], True, None, kwargs.get("non_blocking", False))
        if func is torch.Tensor.to:
            if len(args) > 1 and isinstance(args[1], torch.Tensor):
                return self._move(args[0], args[1] in fake.on_device, args[1].dtype, kwargs.get("non_blocking", False))
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None:
                return self._move(args[0], device.type == "cuda", dtype, non_blocking)
            return func(*args, **kwargs)
        pin = kwargs.pop("pin_memory", False)
        wants = _wants_device(kwargs.get("device"))
        if wants:
            kwargs["device"] = "cpu"
        if name and name.startswith("new_") and isinstance(args[0], torch.Tensor) and "device" not in kwargs:
            wants = args[0] in fake.on_device
        result = func(*args, **kwargs)
        if wants:
            if func in (torch.tensor, torch.as_tensor, torch.Tensor.new_tensor):
                result = result.clone()  # as_tensor may share the host memory; a device copy does not
                fake.event("H2D blocking (a tensor made from host data on the device)")
            for t in tree_flatten(result)[0]:
                if isinstance(t, torch.Tensor):
                    fake.on_device.add(t)
        if pin and isinstance(result, torch.Tensor):
            fake.pinned.add(result)
        return result

    def _move(self, src: torch.Tensor, to_device: bool, dtype, non_blocking: bool) -> torch.Tensor:
        fake = self.fake
        if (src in fake.on_device) == to_device:
            return src.to(dtype=dtype or src.dtype)
        result = src.to(dtype=dtype or src.dtype, copy=True)
        if to_device:
            fake.on_device.add(result)
            pinned = non_blocking and src in fake.pinned
            fake.event("H2D " + ("non_blocking from pinned memory" if pinned else "blocking"))
        else:
            fake.on_device.discard(result)
            fake.event("D2H (a sync)")
        return result


class _DispatchMode(TorchDispatchMode):
    def __init__(self, fake: FakeCuda):
        super().__init__()
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        fake, kwargs, packet = self.fake, kwargs or {}, func.overloadpacket
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on_device = [t in fake.on_device for t in tensors]
        if any(on_device) and not all(on_device) and packet not in MAY_MIX:
            self._check_mix(func, packet, args, tensors, on_device)
        if packet is aten.copy_ and (args[0] in fake.on_device) != (args[1] in fake.on_device):
            if args[0] in fake.on_device:
                if args[1].dim() > 0:
                    fake.event("H2D blocking (copy_ into a device tensor)")
            else:
                fake.event("D2H (a sync, copy_ into a host tensor)")
        if any(on_device) and packet in DATA_DEPENDENT:
            fake.event(f"sync {packet.__name__}")
        if (
            any(on_device)
            and packet in INDEX
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        ):
            fake.event("sync boolean-mask indexing")
        result = func(*args, **kwargs)
        if any(on_device) and packet not in (aten.copy_, aten._local_scalar_dense):
            inputs = {_pointer(t) for t in tensors}
            for t in tree_flatten(result)[0]:
                # a view or an in-place result keeps its input's memory and so its tag
                if isinstance(t, torch.Tensor) and (_pointer(t) not in inputs or not _pointer(t)):
                    fake.on_device.add(t)
        return result

    def _check_mix(self, func, packet, args, tensors, on_device):
        fake = self.fake
        if packet in INDEX:  # a device tensor may be indexed with CPU indices, not the other way round
            if args[0] not in fake.on_device:
                fake.violation(f"{func}: a CPU tensor indexed with CUDA indices")
        elif packet in INDEX_PUT:  # into a device tensor: CPU indices and a 0-dim CPU value are fine
            if args[0] not in fake.on_device:
                fake.violation(f"{func}: CUDA indices or values written into a CPU tensor")
            elif args[2] not in fake.on_device and args[2].dim() > 0:
                fake.violation(f"{func}: CPU values written into a CUDA tensor")
        elif any(not d and t.dim() > 0 for t, d in zip(tensors, on_device)):
            fake.violation(f"{func}: CUDA and CPU tensors in one operation")
