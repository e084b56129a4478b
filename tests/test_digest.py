"""Tests of smoothsk._digest: digests by value, equal for equal states, different where a module computes otherwise."""

import copy
from collections import OrderedDict, defaultdict

import torch

from smoothsk._digest import module_fingerprint, value_digest


def twin_linears():
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    second.load_state_dict(first.state_dict())
    return first, second


def test_equal_modules_and_tensors_have_equal_digests():
    first, second = twin_linears()
    second.train(not first.training)  # certification runs every module in eval mode
    assert module_fingerprint(first) == module_fingerprint(second)
    assert value_digest(torch.arange(4.0)) == value_digest(torch.arange(4.0))


def test_state_outside_the_state_dict_counts():
    first, second = twin_linears()
    second.register_buffer("offset", torch.ones(()), persistent=False)
    assert module_fingerprint(first) != module_fingerprint(second)
    first, second = twin_linears()
    second.scale = 2.0
    assert module_fingerprint(first) != module_fingerprint(second)


def test_the_order_of_children_counts():
    linear, relu = torch.nn.Linear(2, 2), torch.nn.ReLU()
    assert (module_fingerprint(torch.nn.Sequential(OrderedDict(a=linear, b=relu)))
            != module_fingerprint(torch.nn.Sequential(OrderedDict(b=relu, a=linear))))


def test_plain_dicts_are_mappings_and_subclasses_keep_their_state():
    assert value_digest({"a": 1, "b": 2}) == value_digest({"b": 2, "a": 1})
    assert value_digest(defaultdict(list)) != value_digest(defaultdict(dict))


def test_sparse_tensors_are_digested_by_their_values():
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert value_digest(dense.to_sparse()) == value_digest(dense.clone().to_sparse())
    assert value_digest(dense.to_sparse()) != value_digest((2 * dense).to_sparse())


def spectral_twins(spectral_norm):
    """Two linear layers under ``spectral_norm``, built alike and holding the same state."""
    first, second = spectral_norm(torch.nn.Linear(3, 2)), spectral_norm(torch.nn.Linear(3, 2))
    second.load_state_dict(first.state_dict())
    return first, second


def test_hooks_count_by_their_order_not_their_handle_ids():
    """Hook handle ids come from a global counter: two modules built alike hold equal hooks under other ids."""
    first, second = spectral_twins(torch.nn.utils.spectral_norm)
    assert module_fingerprint(first) == module_fingerprint(second)
    second.register_forward_hook(lambda module, inputs, output: output)
    assert module_fingerprint(first) != module_fingerprint(second)


def test_parametrized_modules_are_digested():
    """A parametrized module refuses pickling (its __getstate__ raises); its state is digested all the same."""
    first, second = spectral_twins(torch.nn.utils.parametrizations.spectral_norm)
    assert module_fingerprint(first) == module_fingerprint(second)
    with torch.no_grad():
        second.parametrizations.weight.original.mul_(2)
    assert module_fingerprint(first) != module_fingerprint(second)


def test_weak_references_are_digested_by_their_referent():
    # A GRU keeps weak references to its weights: a copy holds new references to equal weights.
    gru = torch.nn.GRU(2, 3)
    assert module_fingerprint(copy.deepcopy(gru)) == module_fingerprint(gru)
    edited = copy.deepcopy(gru)
    with torch.no_grad():
        edited.weight_hh_l0[0, 0] += 1.0
    assert module_fingerprint(edited) != module_fingerprint(gru)


class ClosureHooked(torch.nn.Module):
    """A linear layer with a closure hook adding ``offset`` and a method hook, both made in ``__init__``."""

    def __init__(self, offset=0.1):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.linear.register_forward_hook(lambda module, args, output: output + offset)
        self.register_forward_pre_hook(self.halve)

    def halve(self, module, args):
        return (args[0] / 2,)

    def forward(self, x):
        return self.linear(x)


def test_functions_are_digested_by_name_and_captured_values():
    # Two modules built alike hold distinct but equal hook functions (a new
    # lambda and bound method per instance): equal fingerprints. A lambda
    # capturing another value computes otherwise: another fingerprint.
    first = ClosureHooked()
    second = ClosureHooked()
    second.load_state_dict(first.state_dict())
    assert module_fingerprint(second) == module_fingerprint(first)
    other = ClosureHooked(offset=0.2)
    other.load_state_dict(first.state_dict())
    assert module_fingerprint(other) != module_fingerprint(first)


#: Two functions of one qualified name (``<lambda>``) that compute otherwise.
ACTIVATIONS = {"identity": lambda t: t, "negate": lambda t: -t}


def test_functions_of_one_name_with_other_code_differ():
    # A model whose activation is swapped for another lambda is another
    # classifier: its regions and checkpoints must not be taken for the old one's.
    first, second = torch.nn.Linear(2, 2), copy.deepcopy(torch.nn.Linear(2, 2))
    second.load_state_dict(first.state_dict())
    first.act, second.act = ACTIVATIONS["identity"], ACTIVATIONS["negate"]
    assert module_fingerprint(first) != module_fingerprint(second)
    second.act = ACTIVATIONS["identity"]
    assert module_fingerprint(first) == module_fingerprint(second)



def test_lazy_modules_are_digested_before_their_first_forward():
    # An uninitialised parameter has no values to read (torch raises on any access to them).
    lazy = torch.nn.LazyLinear(2)
    copied = copy.deepcopy(lazy)
    assert module_fingerprint(lazy) == module_fingerprint(copied)
    copied(torch.zeros(1, 4))
    assert module_fingerprint(lazy) != module_fingerprint(copied)


def test_mappings_keyed_by_tensors_are_digested():
    # An optimizer's state is keyed by its parameters: a fitted LRScheduler callback holds one.
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    weight.grad = torch.ones(2)
    optimizer.step()
    assert value_digest(optimizer.state) == value_digest(copy.deepcopy(optimizer.state))
    other = copy.deepcopy(optimizer.state)
    next(iter(other.values()))["momentum_buffer"] += 1
    assert value_digest(optimizer.state) != value_digest(other)


def test_an_empty_tensor_of_any_stride_is_digested():
    # A forged file can give an empty tensor the stride 0, which contiguous() keeps.
    forged = torch.empty_strided((0,), (0,), dtype=torch.int64)
    assert value_digest(forged) == value_digest(torch.empty(0, dtype=torch.int64))
    assert value_digest(forged) != value_digest(torch.empty(0, dtype=torch.float32))
