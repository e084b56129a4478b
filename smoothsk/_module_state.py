"""A module's tensors from a file: built within what the file holds, checked, then loaded.

A file names a module class and its constructor arguments (``module__hidden=...``)
next to the tensors of its ``state_dict``. Building the module from the arguments
allocates whatever they ask for, so a file of a few bytes could ask for
gigabytes (``hidden=10**9``) or for millions of submodules (``blocks=10**7``).
The file's own tensors say what is justified: the module is first built on
torch's ``meta`` device (shapes, no storage) under an :func:`allocation_budget`
derived from them, its ``state_dict`` compared with them name by name, and only
then built for real (under the same budget) and loaded. On the ``meta`` device
the budget also counts every tensor the build creates, registered or not: a
build may run the module on a probe input (to materialise lazy layers), whose
size and activations the file's ``input_shape_`` alone decides.
"""

import contextlib
import threading

import torch
from torch.nn.modules import module as torch_module
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._messages import quoted

__all__ = ["BUDGET_ALLOWANCE_BYTES", "allocation_budget", "build_from_file", "check_buildable",
           "load_module_state", "tensor_spec"]

#: Bytes of parameters and buffers a module built from a file may hold beyond the file's own tensors of it
#: (non-persistent buffers, which a file does not hold), and likewise bytes of all the tensors its build may create
#: (a probe input and the activations of a forward pass on it too).
BUDGET_ALLOWANCE_BYTES = 64 * 2**20
#: Tensors (parameters and buffers) beyond the file's, and submodules beyond twice their count, likewise.
BUDGET_ALLOWANCE_TENSORS = 256
BUDGET_ALLOWANCE_MODULES = 1024

_active = threading.local()  # the budget of this thread's build, if any


class _Budget:
    """What a build may still register: bytes, tensors and submodules; exceeding one raises a ValueError."""

    def __init__(self, saved, source, what):
        self.bytes = sum(tensor.numel() * tensor.element_size() for tensor in saved.values()) + BUDGET_ALLOWANCE_BYTES
        self.created = self.bytes
        self.tensors = len(saved) + BUDGET_ALLOWANCE_TENSORS
        self.modules = 2 * len(saved) + BUDGET_ALLOWANCE_MODULES
        self.source, self.what, self.saved = source, what, len(saved)

    def spend(self, tensor=None):
        if tensor is None:
            self.modules -= 1
        else:
            self.tensors -= 1
            # A lazy layer's parameter has no size until its first call; on the meta device it gets its shape
            # there, and check_buildable compares that shape with the file's tensor before any real build.
            if not isinstance(tensor, UninitializedTensorMixin):
                self.bytes -= tensor.numel() * tensor.element_size()
        if min(self.bytes, self.tensors, self.modules) < 0:
            raise ValueError(
                f"{self.source}: the {self.what} built from the saved parameters would hold more than the file's "
                f"{self.saved} tensors of it justify (over {BUDGET_ALLOWANCE_BYTES // 2**20} MiB, "
                f"{BUDGET_ALLOWANCE_TENSORS} tensors or {BUDGET_ALLOWANCE_MODULES} submodules beyond them): a "
                "parameter in the file asks for a larger module than its weights.")

    def create(self, n_bytes):
        self.created -= n_bytes
        if self.created < 0:
            raise ValueError(
                f"{self.source}: building the {self.what} from the saved parameters would create more tensors "
                f"than the file's {self.saved} tensors of it justify (over {BUDGET_ALLOWANCE_BYTES // 2**20} MiB "
                "beyond them, a probe input and the activations of a forward pass on it included): a parameter or "
                "the input shape in the file asks for more memory than its weights.")


class _CountCreated(TorchDispatchMode):
    """Charges each tensor an operation creates (not a view or an in-place result) to ``budget.create``.

    A freed tensor is not given back: the count bounds all that the build
    allocates, whatever it frees in between.
    """

    def __init__(self, budget):
        super().__init__()
        self.budget = budget

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if all(output.alias_info is None for output in func._schema.returns):
            self.budget.create(sum(leaf.numel() * leaf.element_size() for leaf in tree_leaves(result)
                                   if isinstance(leaf, torch.Tensor)))
        return result


def _on_tensor(module, name, tensor):
    budget = getattr(_active, "budget", None)
    if budget is not None and tensor is not None:
        budget.spend(tensor)


def _on_module(module, name, submodule):
    budget = getattr(_active, "budget", None)
    if budget is not None:
        budget.spend()


_HOOKS = []
_HOOKS_LOCK = threading.Lock()


def _install_hooks():
    """torch's global registration hooks, installed once; they count only inside :func:`allocation_budget`."""
    with _HOOKS_LOCK:
        if not _HOOKS:
            _HOOKS.extend([torch_module.register_module_parameter_registration_hook(_on_tensor),
                           torch_module.register_module_buffer_registration_hook(_on_tensor),
                           torch_module.register_module_module_registration_hook(_on_module)])


@contextlib.contextmanager
def allocation_budget(saved, source, what):
    """Refuse, while the block runs in this thread, modules larger than the tensors ``saved`` justify.

    Every parameter, buffer and submodule registered in this thread counts
    against the budget; the registration that exceeds it raises a ValueError
    naming ``source`` and ``what``, so that a build stops at the first
    submodule too many instead of after allocating them all.

    Parameters
    ----------
    saved : dict of str to torch.Tensor
        The file's tensors of the module, by state-dict key.
    source : str
        The file, named in errors.
    what : str
        The module's role (``"module_"``), named in errors.

    Yields
    ------
    budget
        What the block may still register (and, under :func:`check_buildable`,
        create).
    """
    _install_hooks()
    outer = getattr(_active, "budget", None)
    _active.budget = _Budget(saved, source, what)
    try:
        yield _active.budget
    finally:
        _active.budget = outer


def tensor_spec(tensor):
    """``{"dtype": ..., "shape": [...]}`` of a tensor, as a file's manifest records it."""
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}


def _check_state(module, saved, source, what):
    """Refuse unless ``module``'s ``state_dict`` has exactly the keys, dtypes and shapes of ``saved``."""
    expected = module.state_dict()
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing:
        raise ValueError(f"{source}: {what} tensors {quoted(missing)} are missing from the file (the "
                         f"{type(module).__name__} built from the saved parameters has them).")
    if extra:
        raise ValueError(f"{source}: the file has {what} tensors {quoted(extra)} that the {type(module).__name__} "
                         "built from the saved parameters does not have.")
    for key, tensor in expected.items():
        if tensor_spec(saved[key]) != tensor_spec(tensor):
            raise ValueError(f"{source}: {what} tensor {key!r} has {quoted(tensor_spec(saved[key]))} in the file, "
                             f"but the {type(module).__name__} built from the saved parameters has "
                             f"{quoted(tensor_spec(tensor))}.")


def check_buildable(build, saved, source, what):
    """Build the module on the ``meta`` device within the budget ``saved`` justifies and compare its state.

    Besides what the build registers, every tensor it creates counts (a probe
    input and the activations of a forward pass on it too): the real build
    that follows runs the same code and creates the same tensors.

    Parameters
    ----------
    build : callable
        ``build() -> torch.nn.Module``, the code that will build the module
        for real (called here under ``torch.device("meta")``, so its
        parameters take no storage).
    saved : dict of str to torch.Tensor
        The file's tensors of this module, by state-dict key.
    source : str
        The file, named in errors.
    what : str
        The module's role, named in errors.

    Raises
    ------
    ValueError
        If the build exceeds the budget, or its ``state_dict`` differs from
        ``saved`` in a key, a dtype or a shape.
    """
    with allocation_budget(saved, source, what) as budget, torch.device("meta"), _CountCreated(budget):
        module = build()
    _check_state(module, saved, source, what)


def build_from_file(build, saved, source, what):
    """The module ``build()`` makes, checked on ``meta`` first (:func:`check_buildable`), holding ``saved``.

    Parameters
    ----------
    build, saved, source, what
        As for :func:`check_buildable`.

    Returns
    -------
    torch.nn.Module
        Built for real (under the same budget) with the saved tensors loaded.
    """
    check_buildable(build, saved, source, what)
    with allocation_budget(saved, source, what):
        module = build()
    load_module_state(module, saved, source, what)
    return module


def load_module_state(module, saved, source, what="module_"):
    """Copy ``saved`` into ``module``'s state after checking names, shapes and dtypes.

    Parameters
    ----------
    module : torch.nn.Module
        Built from the saved parameters.
    saved : dict of str to torch.Tensor
        The file's tensors of this module, by state-dict key.
    source : str
        The file, named in errors.
    what : str, default="module_"
        The module's role, named in errors.

    Raises
    ------
    ValueError
        If a key is missing or extra, or a tensor's dtype or shape differs.
    """
    _check_state(module, saved, source, what)
    module.load_state_dict(saved, strict=True)
