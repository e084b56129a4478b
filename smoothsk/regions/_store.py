"""The robust regions an estimator has allocated (its ``regions_``), and whose they are."""

import contextlib
import dataclasses
import hashlib
from dataclasses import dataclass

import joblib
import numpy as np
import torch

from .._messages import quoted
from ..certificates import ABSTAIN

#: What each attribute of a store read from a file may hold, with the description its refusal quotes: the
#: owner's fields (see :meth:`RegionStore.check_owner`) are None until the store is first used.
_ATTRIBUTES = {
    "n_calls": ("an int >= 0", lambda value: type(value) is int and value >= 0),
    "weights": ("None or a hex digest (module_fingerprint)", lambda value: value is None or (
        type(value) is str and 0 < len(value) <= 128 and all(char in "0123456789abcdef" for char in value))),
    "allocator": ("None or a class name", lambda value: value is None or (
        type(value) is str and len(value) <= 100 and value.isidentifier())),
    "alpha": ("None or a float in (0, 1)", lambda value: value is None or (type(value) is float and 0 < value < 1)),
    "autocast": ("None, 'bfloat16' or 'float16'", lambda value: value in (None, "bfloat16", "float16")),
}


@dataclass
class RegionStore:
    """Regions allocated so far, one row per region.

    Region ``k`` is the open ball of radius ``radii[k]`` around
    ``centres[k]`` together with its centre::

        {x : ||x - centres[k]|| < radii[k]}  union  {centres[k]}

    so a region of radius 0 is its centre alone: an input certified with
    radius 0 still owns the point it was certified at, and a later region
    may not swallow it. Allocators that keep regions disjoint enforce
    ``||centres[k] - centres[l]|| >= radii[k] + radii[l]``, which is exactly
    disjointness of such regions.

    Attributes
    ----------
    centres : ndarray of float32, shape (n_regions, n_features)
        Flattened inputs the regions are centred on.
    radii : ndarray of float64, shape (n_regions,)
        Radius of each region (0 for a point region).
    sigmas : ndarray of float64, shape (n_regions,)
        Noise level the smoothed classifier uses inside each region.
    predictions : ndarray of int64, shape (n_regions,)
        Class index each region certifies, ``ABSTAIN`` (-1) for the point
        region of an input whose certificate abstained.
    p_lowers : ndarray of float64, shape (n_regions,)
        Lower confidence bound of the certificate the region came from.
    n_calls : int
        Number of ``allocate`` calls that have used this store
        (:meth:`count_call`). Allocators put it in their sampling stages so
        that every call draws noise independent of the noise that shaped
        the regions already stored: the estimator keys an input's noise by
        a hash of its values, so without it an input certified again in a
        later call would get the very noise of its first certificate.
    weights : str or None
        :func:`~smoothsk._digest.module_fingerprint` of the module whose
        smoothed classifier the regions certify (its weights and every other
        state it computes with); None until the store is first used.
    allocator : str or None
        Name of the allocator class that made the regions (allocators keep
        different invariants: memory regions of one class may overlap, the
        balls of the other allocators never do); None until first used.
    alpha : float or None
        The estimator's ``alpha`` when the regions were made; None until
        first used.
    autocast : {"bfloat16", "float16"} or None
        The estimator's ``certify_autocast`` when the regions were made: the
        precision the module ran in, so part of the classifier the regions
        certify. None for the module run as it is (and until first used).

    Notes
    -----
    A region is a certificate about one model: it dies with the weights it
    was made with. The estimator clears its store after any training and
    whenever it rebuilds the module (``set_params(module__...)``), and
    calls :meth:`check_owner` before every use, which refuses a non-empty
    store whose weights, allocator class, ``alpha`` or precision
    (``certify_autocast``) are not the current ones.

    The ``alpha`` rule is one rule for every allocator. A
    :class:`~smoothsk.regions.MemoryAllocator` answers an input identical to a remembered
    centre with that region's certificate, so a store made at a larger
    ``alpha`` would report statements that fail more often than the current
    ``alpha`` allows. :class:`~smoothsk.regions.OnlineBallAllocator` and
    :class:`~smoothsk.regions.TransductiveLPAllocator` re-certify every input at the current
    ``alpha`` and would not need the rule, but a store whose regions carry
    certificates of mixed confidence is refused for them too.
    ``set_params(alpha=...)`` with a new value clears the store (as
    rebuilding the module does); assigning ``alpha`` directly leaves the
    store to be refused.

    The precision is part of the owner for the same reason as the weights:
    a module run under ``torch.autocast`` is another classifier than the
    module run as it is, and a region certified for one can hold inputs the
    other classifies otherwise. ``set_params(certify_autocast=...)`` with a
    new value clears the store, exactly as for ``alpha``; assigning
    ``certify_autocast`` directly leaves the store to be refused.

    Examples
    --------
    >>> store = RegionStore.empty(3)
    >>> store.append([[0, 0, 0]], [1.0], [0.5], [2], [0.9]).tolist(), len(store)
    ([0], 1)
    """

    centres: np.ndarray
    radii: np.ndarray
    sigmas: np.ndarray
    predictions: np.ndarray
    p_lowers: np.ndarray
    n_calls: int = 0
    weights: str = None
    allocator: str = None
    alpha: float = None
    autocast: str = None

    @classmethod
    def empty(cls, n_features):
        """A store with no regions for inputs of ``n_features`` values."""
        return cls(np.zeros((0, n_features), dtype=np.float32), np.zeros(0), np.zeros(0),
                   np.zeros(0, dtype=np.int64), np.zeros(0))

    def __len__(self):
        return len(self.radii)

    def to_arrays(self):
        """The store as named arrays and JSON-native attributes (what a saved model holds).

        Returns
        -------
        arrays : dict of str to ndarray
            ``centres``, ``radii``, ``sigmas``, ``predictions``, ``p_lowers``.
        attributes : dict
            ``n_calls`` (int) and the owner: ``weights`` (fingerprint),
            ``allocator`` (class name), ``alpha`` (float), None until the
            store is first used, and ``autocast`` (str or None).
        """
        arrays = {"centres": self.centres, "radii": self.radii, "sigmas": self.sigmas,
                  "predictions": self.predictions, "p_lowers": self.p_lowers}
        return arrays, {"n_calls": int(self.n_calls), "weights": self.weights, "allocator": self.allocator,
                        "alpha": self.alpha, "autocast": self.autocast}

    @classmethod
    def from_arrays(cls, arrays, attributes, n_features, n_classes):
        """The store that :meth:`to_arrays` described, read from a file: checked, then used (not copied).

        The one check of a store from a file (a model file or a checkpoint),
        whoever wrote it: the arrays' names, dtypes, row shapes and row counts
        those of a store of ``n_features``-dimensional regions, the attributes'
        names and types, and the values those of certificates (finite centres,
        radii >= 0, finite sigmas > 0, predictions ``ABSTAIN`` or a class index
        below ``n_classes``, probability bounds in [0, 1], ``n_calls >= 0``).

        Parameters
        ----------
        arrays : dict of str to ndarray
        attributes : dict
        n_features, n_classes : int

        Returns
        -------
        RegionStore

        Raises
        ------
        ValueError
            Saying what is wrong (the caller names the file).
        """
        template_arrays, template_attributes = cls.empty(n_features).to_arrays()
        if set(arrays) != set(template_arrays):
            raise ValueError(f"the region arrays are {sorted(arrays)}; expected {sorted(template_arrays)}.")
        for name, template in template_arrays.items():
            if arrays[name].dtype != template.dtype or arrays[name].ndim != template.ndim or \
                    arrays[name].shape[1:] != template.shape[1:]:
                raise ValueError(f"region array {name!r} has dtype {arrays[name].dtype} and shape "
                                 f"{arrays[name].shape}; expected dtype {template.dtype} and shape "
                                 f"{('n_regions',) + template.shape[1:]}.")
        if len({len(array) for array in arrays.values()}) > 1:
            raise ValueError(f"the region arrays have different numbers of rows "
                             f"{ {name: len(array) for name, array in arrays.items()} }.")
        problem = cls.attributes_problem(attributes)
        if problem is not None:
            raise ValueError(f"the region store's {problem}.")
        invalid = [name for name, valid in [
            ("centres", np.isfinite(arrays["centres"]).all()),
            ("radii", (arrays["radii"] >= 0).all()),
            ("sigmas", (np.isfinite(arrays["sigmas"]) & (arrays["sigmas"] > 0)).all()),
            ("predictions", ((arrays["predictions"] >= ABSTAIN) & (arrays["predictions"] < n_classes)).all()),
            ("p_lowers", ((arrays["p_lowers"] >= 0) & (arrays["p_lowers"] <= 1)).all())] if not valid]
        if invalid:
            raise ValueError(f"the region store's {', '.join(invalid)} hold values no certificate has (finite "
                             "centres, radii >= 0, finite sigmas > 0, predictions ABSTAIN or a class index below "
                             f"{n_classes}, p_lowers in [0, 1]).")
        return cls(**arrays, **attributes)

    @staticmethod
    def attributes_problem(attributes):
        """What in attributes read from a file no store's :meth:`to_arrays` gives, or None.

        Parameters
        ----------
        attributes : object
            Read from a file (JSON).

        Returns
        -------
        str or None
            ``"<name> is <value>; expected <what>"`` (the value shortened), or
            ``"attributes are <names>; expected <names>"``.
        """
        if not (isinstance(attributes, dict) and set(attributes) == set(_ATTRIBUTES)):
            names = sorted(map(str, attributes)) if isinstance(attributes, dict) else type(attributes).__name__
            return f"attributes are {quoted(names)}; expected {sorted(_ATTRIBUTES)}"
        for name, (expected, holds) in _ATTRIBUTES.items():
            if not holds(attributes[name]):
                return f"{name} is {quoted(attributes[name])}; expected {expected}"
        return None

    def append(self, centres, radii, sigmas, predictions, p_lowers, rows=None):
        """Add regions; returns the indices they were stored at.

        Parameters
        ----------
        centres : array-like of float, shape (n_new, n_features)
            Centres of the new regions, or with ``rows`` an array they are
            rows of.
        radii, sigmas, p_lowers : array-like of float, shape (n_new,)
        predictions : array-like of int, shape (n_new,)
        rows : ndarray of int, shape (n_new,), optional
            Rows of ``centres`` to add (gathered straight into the store,
            without an intermediate copy).

        Returns
        -------
        index : ndarray of int, shape (n_new,)
        """
        start = len(self)
        centres = np.asarray(centres)
        n_new = len(radii) if rows is None else len(rows)
        grown = np.empty((start + n_new, self.centres.shape[1]), dtype=np.float32)
        grown[:start] = self.centres
        if rows is None:
            grown[start:] = centres
        else:
            np.take(centres, rows, axis=0, out=grown[start:])
        self.centres = grown
        self.radii = np.concatenate([self.radii, np.asarray(radii, dtype=np.float64)])
        self.sigmas = np.concatenate([self.sigmas, np.asarray(sigmas, dtype=np.float64)])
        self.predictions = np.concatenate([self.predictions, np.asarray(predictions, dtype=np.int64)])
        self.p_lowers = np.concatenate([self.p_lowers, np.asarray(p_lowers, dtype=np.float64)])
        return np.arange(start, len(self))

    @contextlib.contextmanager
    def transaction(self):
        """Undo every change to the store made in the ``with`` block if the block raises.

        A certify call that fails (out of memory, an interrupt) must leave no
        region whose certificate was never returned, nor a spent call number,
        so that its rerun is the call. The snapshot is shallow: the store's
        arrays are never written in place, only replaced (:meth:`append`).
        """
        saved = dataclasses.replace(self)
        try:
            yield self
        except BaseException:
            for field in dataclasses.fields(self):
                setattr(self, field.name, getattr(saved, field.name))
            raise

    def count_call(self):
        """Count one ``allocate`` call on the store.

        Returns
        -------
        call : int
            Its number, from 1: the part of the call's sampling stages that
            no earlier call on this store shares.
        """
        self.n_calls += 1
        return self.n_calls

    def check_owner(self, weights, allocator, alpha, autocast):
        """Refuse regions made by other weights, another allocator class, at another alpha or in another precision.

        A store that has never been used (``weights`` is None) or that
        holds no region adopts the given owner.

        Parameters
        ----------
        weights : str
            :func:`~smoothsk._digest.module_fingerprint` of the current module.
        allocator : str
            Name of the current allocator class.
        alpha : float
            The estimator's current ``alpha``.
        autocast : {"bfloat16", "float16"} or None
            The estimator's current ``certify_autocast``.

        Raises
        ------
        ValueError
            If the store holds regions of other weights, of another
            allocator class, made at another ``alpha`` or in another
            precision; ``reset_regions()`` starts a new store.
        """
        if self.weights is None or len(self) == 0:
            self.weights, self.allocator, self.alpha, self.autocast = weights, allocator, float(alpha), autocast
            return
        if weights != self.weights:
            raise ValueError(
                f"regions_ holds {len(self)} regions certified with other module weights than the current "
                "ones (the module was trained, loaded or edited since, or its forward changes its own attributes, "
                "which makes it another classifier after each call): their certificates say nothing about "
                "this model. Call reset_regions() to start a new store for these weights.")
        if allocator != self.allocator:
            raise ValueError(
                f"regions_ holds {len(self)} regions made by {self.allocator}, but the allocator is now "
                f"{allocator}: the two keep different invariants (memory regions of one class may overlap, "
                f"balls never do). Call reset_regions() to start a new store for {allocator}, or set the "
                f"allocator back to {self.allocator}.")
        if float(alpha) != self.alpha:
            raise ValueError(
                f"regions_ holds {len(self)} regions certified at alpha={self.alpha}, but alpha is now {alpha}: "
                "their certificates (which a MemoryAllocator reports again for remembered inputs) hold with "
                f"another probability. Call reset_regions() to start a new store at alpha={alpha}, or set "
                f"alpha back to {self.alpha}.")
        if autocast != self.autocast:
            raise ValueError(
                f"regions_ holds {len(self)} regions certified with certify_autocast={self.autocast!r}, but "
                f"certify_autocast is now {autocast!r}: the module run in another precision is another classifier, "
                "which their certificates say nothing about. Call reset_regions() to start a new store for "
                f"certify_autocast={autocast!r}, or set certify_autocast back to {self.autocast!r}.")

    def digest(self):
        """SHA-256 of everything the store holds: regions, call counter and owner (weights, allocator, alpha, autocast).

        Returns
        -------
        str
            Hex digest; equal for equal contents (a checkpoint can tell
            whether the store changed since it was written).
        """
        owner = (self.weights, self.allocator, self.alpha, self.autocast)
        digest = hashlib.sha256(repr((self.centres.shape, self.n_calls) + owner).encode())
        for values in (self.centres, self.radii, self.sigmas, self.predictions, self.p_lowers):
            digest.update(np.ascontiguousarray(values).data)
        return digest.hexdigest()


def weights_fingerprint(module):
    """SHA-256 of a module's state: every tensor's name, dtype, shape and bytes, and any extra state.

    The reference certificates record trained weights by it; region stores,
    checkpoints and certified sigma functions identify a model by the fuller
    :func:`~smoothsk._digest.module_fingerprint`.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    str
        Hex digest; changes whenever a parameter, buffer or extra state changes.
    """
    digest = hashlib.sha256()
    for name, value in module.state_dict().items():
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(repr((name, str(tensor.dtype), tuple(tensor.shape))).encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
        else:  # a module's extra state
            digest.update(repr((name, joblib.hash(value))).encode())
    return digest.hexdigest()
