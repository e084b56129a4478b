"""``SampleWiseSmoothedClassifier``: randomized smoothing with per-input noise, as an estimator.

The class subclasses skorch's :class:`~skorch.NeuralNet` rather than owning
one: skorch's parameters and prefix routing (``module__*``, ``optimizer__*``,
``callbacks__*``, ``iterator_train__*``), its history, callbacks, device
handling and pickling (a model fitted on GPU loads on a CPU-only machine) then
work unchanged, and ``fit``/``partial_fit``/``warm_start`` keep skorch's
meaning. It overrides only what smoothing changes: label encoding, input
checks, the training step (noise with per-sample sigma), fast tensor-slicing
batches, and inference (``predict``, ``predict_proba``, ``certify``).
"""

import functools
import inspect
import sys
import warnings

import numpy as np
import torch
from sklearn.base import ClassifierMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted
from skorch import NeuralNet
from tqdm.auto import tqdm

from . import _certification, _checkpoint, _inputs, _parallel, _params, _stages, _validation
from ._model_file import check_key
from ._persistence import load_estimator, save_estimator
from ._training_steps import NoisyTrainingSteps
from .certificates import ABSTAIN
from .experts import materialize
from .regions import RegionStore
from .sigma import BaseCertifiedSigma, SigmaFitContext
from .statistics import top_two_test
from .training import Pretrained

__all__ = ["SampleWiseSmoothedClassifier"]


class SampleWiseSmoothedClassifier(ClassifierMixin, NoisyTrainingSteps, NeuralNet):
    """A smoothed classifier whose Gaussian noise level may differ per input.

    ``g(x) = argmax_c P(f(x + e) = c)``, ``e ~ N(0, sigma(x)^2 I)``, where
    ``f`` is ``module``. ``certify`` returns, per input, a class and an L2
    radius that hold with probability at least ``1 - alpha`` (Cohen et al.
    2019, with the guarantee of the chosen ``allocator``).

    Parameters
    ----------
    module : torch.nn.Module class or instance
        Base classifier returning logits (n, n_classes). If it is a class
        whose ``__init__`` takes ``n_classes`` and ``module__n_classes`` is not
        set, the number of classes seen in ``fit`` is passed. Noise is added
        in its input space, so normalisation belongs inside it.
    training : BaseTrainingSchedule or None, default=None
        Training schedule; None means ``FixedSigmaTraining(0.25)``.
    sigma_search : BaseSigmaSearch or None, default=None
        Test-time noise level per input; None means the schedule's
        ``default_sigma_search()`` (``FixedSigma`` at the training sigma).
        After ``fit`` the schedule may restrict the levels it searches
        (``BaseTrainingSchedule.sigma_search_for``: ``InstaRSTrain`` caps
        a ``MultiStartFGSS`` at the largest sigma training assigned).
        A :class:`~smoothsk.sigma.BaseCertifiedSigma` (a sigma function with
        its own certificate, e.g. ``CertifiedSigmaSelector``) makes
        ``certify`` and ``predict`` about the sample-wise classifier
        ``G(x) = g(x, sigma(x))``, statelessly; it is fitted at the end of
        ``fit`` (``sigma_search_``) and needs an allocator that composes
        with it (``NoRegions``).
    sampler : BaseSampler or None, default=None
        Monte Carlo sample sizes; None means ``FixedSampler()``
        (n = 100,000, n0 = 100, as Cohen et al.).
    allocator : BaseAllocator or None, default=None
        Robust-region allocation; None means ``NoRegions()``.
    alpha : float, default=0.001
        Failure probability of each certificate and of each ``predict``.
    certify_batch_size : int, default=256
        Noisy copies per forward pass when sampling; bounds the memory used.
        Certificates do not depend on it. On a CPU, batches whose activations
        stay in cache run fastest; on a GPU, small models want larger batches.
    certify_autocast : {"bfloat16", "float16"} or None, default=None
        Run the module under ``torch.autocast`` in this precision when
        sampling (``predict``, ``certify``), for speed on accelerators. The
        certificates are then about the module as run in that precision,
        which is another classifier than the float32 module: floating-point
        effects can break certificates of one precision in another
        (Voráček & Hein, 2023). None (the default) runs the module as it is.
        Robust regions belong to the precision they were certified in
        (``set_params`` with a new value clears ``regions_``).
    certify_memory_format : {"auto", "channels_last", "contiguous"}, default="auto"
        Layout of image batches (4-D inputs) and of the module's weights when
        sampling. ``"auto"`` runs ``channels_last`` on accelerators and, on the
        CPU, for modules with a 2-D convolution, where it is fastest (up to
        1.7x with torch's max pooling); the rule depends on the module and the
        device only, never on a timing, so certificates are reproducible. The
        other values force a layout. The module is converted in place (strides
        only, its values are unchanged). Logits can differ in their last bits
        between layouts, so a rare noisy copy at a decision boundary can vote
        otherwise: each layout certifies the module as run in it, as each
        device does.
    n_jobs : int or None, default=None
        joblib workers (threads unless a joblib back-end such as dask or ray
        is active, see ``joblib.parallel_config``). ``certify`` with a
        stateless allocator (``NoRegions``) and a per-input sigma search splits the inputs into chunks,
        search and sampling together; otherwise, and for ``predict``, the
        workers share the batches of each sampling call (see
        :class:`~smoothsk.engine.MonteCarloEngine`). Worker threads share
        torch's CPU threads (``torch.get_num_threads()``) rather than each
        running all of them. Results do not depend on it.
    random_state : int, RandomState instance or None, default=None
        Seeds weight initialisation, shuffling, training noise and the
        Monte Carlo noise. An int makes ``fit``, ``predict`` and ``certify``
        reproducible.
    criterion : torch loss class, default=torch.nn.CrossEntropyLoss
        Applied to logits.
    train_split : callable or None, default=None
        skorch's internal validation split; None trains on all data (the
        certificates are the evaluation, and ``train_sigmas_`` covers every sample).
    verbose : int, default=0
        skorch's epoch log (1) or silence (0).
    **kwargs
        Any other :class:`skorch.NeuralNet` parameter (``optimizer``, ``lr``,
        ``max_epochs``, ``batch_size``, ``device``, ``callbacks``, ...) and
        prefixed parameters (``module__width``, ``optimizer__momentum``, ...).

    Attributes
    ----------
    classes_ : ndarray, shape (n_classes,)
        Class labels.
    module_ : torch.nn.Module
        The trained base classifier.
    train_sigmas_ : ndarray of float, shape (n_train,)
        Noise level of each training sample (rows of the last ``fit`` or
        ``partial_fit`` call) at the end of training.
    train_keys_ : ndarray of uint64, shape (n_train,)
        Whose sigma each entry of ``train_sigmas_`` is: a hash of the
        sample's input values and label and of the schedule's class and
        sigma parameters (as a saved file holds them); 0 for a row whose
        sigma the schedule has not set yet. A later ``partial_fit`` (or ``warm_start`` fit) keeps the
        sigma of each sample it meets again under the same schedule, in
        whatever row; other samples start at the schedule's initial sigma.
    training_ : BaseTrainingSchedule
        The clone of ``training`` (or of its default) that ran the last
        ``fit``/``partial_fit`` call, with that run's state (``objective_``,
        ...). The parameters ``training``, ``sigma_search``, ``sampler`` and
        ``allocator`` are never changed by ``fit``, ``certify`` or ``predict``.
    regions_ : RegionStore
        Robust regions allocated so far (empty without regions).
    sigma_search_ : BaseCertifiedSigma
        Only with a certified sigma function: the fitted clone of
        ``sigma_search`` that ``certify`` and ``predict`` use. Every
        ``fit``/``partial_fit`` and every new module drops it first: it
        belongs to the weights it was fitted for.
    input_shape_ : tuple of int
        Shape of one input.
    n_features_in_ : int
        Number of values in one input.
    history : skorch.History
        skorch's training history (where ``partial_fit`` resumes the
        schedule); a new module (``set_params(module__...)``) starts a new
        one and drops ``train_sigmas_`` and ``train_keys_``.

    Notes
    -----
    :meth:`save` / :meth:`load` keep a fitted estimator in one safetensors
    file that loading reads without running code. ``joblib.dump`` /
    ``joblib.load`` (and pickle) round-trip everything too, but unpickling
    runs code named in the file: only ``joblib.load`` files you trust.
    ``certify``'s checkpoints are not pickles and are read without running
    code.

    Examples
    --------
    >>> from smoothsk import SampleWiseSmoothedClassifier
    >>> from smoothsk.datasets import load_digits_images
    >>> from smoothsk.models import DigitsCNN
    >>> from smoothsk.sampling import FixedSampler
    >>> X, y = load_digits_images()
    >>> clf = SampleWiseSmoothedClassifier(DigitsCNN, max_epochs=2, lr=0.1,
    ...                                    sampler=FixedSampler(n=500), random_state=0)
    >>> pred, radius = clf.fit(X[:300], y[:300]).certify(X[300:305])
    >>> pred.shape, bool((radius >= 0).all())
    ((5,), True)
    """

    def __init__(
        self,
        module,
        *,
        training=None,
        sigma_search=None,
        sampler=None,
        allocator=None,
        alpha=0.001,
        certify_batch_size=256,
        certify_autocast=None,
        certify_memory_format="auto",
        n_jobs=None,
        random_state=None,
        criterion=torch.nn.CrossEntropyLoss,
        train_split=None,
        verbose=0,
        **kwargs,
    ):
        super().__init__(module, criterion, train_split=train_split, verbose=verbose, **kwargs)
        self.training = training
        self.sigma_search = sigma_search
        self.sampler = sampler
        self.allocator = allocator
        self.alpha = alpha
        self.certify_batch_size = certify_batch_size
        self.certify_autocast = certify_autocast
        self.certify_memory_format = certify_memory_format
        self.n_jobs = n_jobs
        self.random_state = random_state

    # ------------------------------------------------------------------ params

    def set_params(self, **params):
        """Set parameters, including nested component parameters (``sampler__n``).

        A nested parameter of a component left at None first puts the
        default component in place, so ``set_params(sampler__n=1000)`` works
        on a default-constructed estimator. A new ``alpha`` or
        ``certify_autocast`` clears ``regions_``, with a warning if it held
        regions (their certificates were made at the old alpha, or for the
        module run in the old precision).

        Returns
        -------
        self
        """
        _params.check_callbacks(params.get("callbacks"))
        own, nested = _params.split_nested(params)
        super().set_params(**own)
        # Regions certify the classifier at the alpha they were made at and for the module run in the
        # precision it was run in: a new value of either starts a new store.
        for name, field, why in (("alpha", "alpha", "were certified at the old alpha"),
                                 ("certify_autocast", "autocast", "certify the module run in the old precision")):
            store = getattr(self, "regions_", None)
            if name in own and store is not None and store.weights is not None and getattr(store, field) != own[name]:
                if len(store):
                    warnings.warn(f"{name} changed from {getattr(store, field)!r} to {own[name]!r}: the {len(store)} "
                                  f"regions in regions_ {why} and are cleared.", UserWarning, stacklevel=2)
                self._reset_store()
        _params.set_component_params(self, nested)
        return self

    def _get_param_names(self):
        # skorch's set of prefixed parameters to check is rebuilt from them in
        # __init__: bookkeeping, not a parameter a user (or clone) should set.
        return [name for name in super()._get_param_names() if name != "_params_to_validate"]

    # ---------------------------------------------------------------- training

    def fit(self, X, y, **fit_params):
        """Train the base classifier with the training schedule.

        Parameters
        ----------
        X : array-like of float, shape (n_samples, *input_shape)
            Inputs in the model's input space.
        y : array-like, shape (n_samples,)
            Labels (integers or strings).
        **fit_params
            Passed on to skorch's ``fit_loop``; not ``epochs``, which the
            training schedule sets (a ``TypeError``, before any training).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before any training, and leaving a fitted estimator as it was:
            if ``device`` is not available, or if the new module rejects one
            input of X or does not return logits of shape (1, n_classes).
        TypeError
            Before any training: if ``fit_params`` holds ``sample_weight`` or ``epochs``.

        A refit of a fitted estimator that raises later (in a callback, in
        training, in fitting a certified sigma function) leaves it as it
        was too, unless ``module`` is an instance (trained in place). A
        ``warm_start`` fit, like :meth:`partial_fit`, continues the model in
        place and is not undone.
        """
        return self._fit(X, y, reset=not self.warm_start or not self.initialized_, **fit_params)

    def partial_fit(self, X, y, classes=None, **fit_params):
        """Continue training without re-initialising (skorch semantics).

        Parameters
        ----------
        X, y
            As in :meth:`fit`.
        classes : array-like, shape (n_classes,), optional
            Every label of the task, in any order (scikit-learn's
            convention): the first call (the one that initialises the
            module) learns them as ``classes_`` even where its ``y`` lacks
            some; without it, the first call learns the labels of its
            ``y``. A later call may repeat the same classes, nothing else.
        **fit_params
            Passed on to skorch's ``fit_loop``; not ``epochs``, which the
            training schedule sets (a ``TypeError``, before any training).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before any training: if ``classes`` has fewer than 2 labels or
            the label ``ABSTAIN``, if ``y`` has a label outside them, or if
            a later call's ``classes`` differ from ``classes_``.
        """
        return self._fit(X, y, reset=not self.initialized_, classes=classes, **fit_params)

    @classmethod
    def from_module(cls, module, *, input_shape, sigma=0.25, classes=None, **params):
        """A fitted estimator that smooths and certifies a trained module as it is, without data.

        scikit-learn's ``cv="prefit"`` (or ``FrozenEstimator``) for smoothing:
        ``SampleWiseSmoothedClassifier(module, training=Pretrained(sigma),
        **params)``, its bookkeeping done by :meth:`partial_fit` on one zero
        input with ``classes`` (no epoch runs: ``Pretrained`` trains nothing).
        The module's weights and buffers stay bit-identical, here and in every
        later ``certify`` or ``predict``. The module first runs on a zero
        input of ``input_shape`` (in eval mode, without gradients) to read its
        logit width, before any other work (``partial_fit`` then checks its
        output once more); any problem is one ``ValueError`` naming the argument.

        Certificates are about ``g`` at ``sigma`` with the default search
        (``FixedSigma(sigma)``, Cohen et al.'s smoothed classifier of the
        module), or as the ``sigma_search`` and ``allocator`` passed in
        ``params`` say (``details.guarantee``). A certified sigma function
        (``CertifiedSigmaSelector``, ``SemiElasticSigma``) is fitted on data,
        so it is refused here: pass it to
        ``SampleWiseSmoothedClassifier(module, training=Pretrained(sigma),
        sigma_search=...)`` and call ``fit(X, y)``, which trains no weight either.

        The estimator is an ordinary fitted one: ``save``/``load`` (a module
        instance is saved by its class, so ``load(path, module=...)`` needs
        the architecture again unless the module gives its
        ``constructor_params()``), ``n_jobs``, ``checkpoint=`` and Pipelines
        work as after ``fit``, and a later ``fit(X, y)`` learns the classes
        and input shape from data instead.

        Parameters
        ----------
        module : torch.nn.Module instance
            The trained base classifier, returning logits (n, n_classes) for
            inputs (n, *input_shape), normalisation inside it. It becomes
            ``module_`` itself (moved to ``device`` if it is elsewhere), not a copy.
        input_shape : tuple of int
            Shape of one input, in the module's input space (noise is added there).
        sigma : float, default=0.25
            The noise level the module was trained for (``Pretrained(sigma)``).
        classes : array-like, shape (n_classes,), optional
            The label of logit i at position i, in ascending order (scikit-learn
            keeps ``classes_`` sorted); default ``range(n_outputs)``, the
            module's logit width.
        **params
            Any other parameter of the estimator (``sampler``, ``alpha``,
            ``sigma_search``, ``n_jobs``, ``device``, ``random_state``, ...);
            not ``training`` (it is ``Pretrained(sigma)``) nor ``module__*``
            (which would build a new, untrained module).

        Returns
        -------
        SampleWiseSmoothedClassifier
            Fitted: ``classes_``, ``input_shape_``, ``module_`` (the given
            module), an empty ``history`` and no ``train_sigmas_``.

        Raises
        ------
        TypeError
            If ``params`` holds ``training`` or a ``module__*`` parameter.
        ValueError
            Before any sampling, naming the argument: see
            :func:`smoothsk._validation.check_prefit`.

        Examples
        --------
        >>> import torch
        >>> module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))  # trained elsewhere
        >>> clf = SampleWiseSmoothedClassifier.from_module(module, input_shape=(1, 8, 8), sigma=0.25)
        >>> clf.classes_.tolist(), clf.input_shape_
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], (1, 8, 8))
        """
        refused = sorted(name for name in params if name == "training" or name.startswith("module__"))
        if refused:
            raise TypeError(f"from_module takes no {', '.join(refused)}: the schedule is Pretrained(sigma), and "
                            "module__* parameters would build a new, untrained module.")
        estimator = cls(module, training=Pretrained(sigma=sigma), **params)
        probe, classes = _validation.check_prefit(estimator, input_shape, classes)
        return estimator.partial_fit(probe, classes[:1], classes=classes)

    def _fit(self, X, y, reset, classes=None, **fit_params):
        components, X, y_index, classes = _validation.check_fit(self, X, y, reset, classes, fit_params)
        fitted, history = dict(vars(self)), list(getattr(self, "history_", None) or [])
        if reset:
            try:
                self.classes_, self.input_shape_ = classes, X.shape[1:]
                self.n_features_in_ = int(np.prod(self.input_shape_))
                self.initialize()
                _validation.check_module_output(self.module_, X, len(self.classes_), self.device)
            except Exception:  # a refused refit leaves the fitted estimator as it was
                self._restore(fitted, history)
                raise
            self._reset_store()
        # A fitted sigma function certifies the weights it was fitted for: training changes them.
        vars(self).pop("sigma_search_", None)
        # The user's schedule is a parameter: a clone of it carries this run's state
        # (objective, stage), so fit never writes into what was passed.
        self.training_ = clone(components.training)
        try:
            self._run_training(components, torch.from_numpy(X), torch.as_tensor(y_index, dtype=torch.int64),
                               fit_params)
        except BaseException:  # Ctrl-C in a callback too (one within the epochs ends training, as in skorch)
            # A refit that fails (in a callback, in training, in fitting the sigma function) leaves the
            # fitted estimator as it was, where the refit built a module of its own (a module instance
            # reused by skorch was changed in place; warm_start and partial_fit continue in place).
            if reset and self.module_ is not fitted.get("module_", self.module_):
                self._restore(fitted, history)
            raise
        self._reset_store()  # regions certify the old weights only
        return self

    def _run_training(self, components, X, y, fit_params):
        """Run the training schedule's clone and fit the certified sigma function, if any, between callbacks."""
        # Training randomness, seeded per run so that a refit repeats and a
        # partial_fit continues with fresh noise; dropped when pickled.
        self.noise_generator_ = torch.Generator(device=self.device).manual_seed(
            self._seed(_stages.TRAIN_NOISE_SALT) + len(self.history))
        self.shuffle_generator_ = torch.Generator().manual_seed(self._seed(_stages.SHUFFLE_SALT) + len(self.history))
        self.notify("on_train_begin", X=X, y=y)
        device = torch.device(self.device)
        # The module's own randomness (dropout, ...) uses torch's global
        # generator: seed it for the run and restore it afterwards.
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(self._seed(_stages.MODULE_RANDOMNESS_SALT) + len(self.history))
            try:
                self.training_.run(self, X, y, **fit_params)
            except KeyboardInterrupt:
                pass
            if isinstance(components.sigma_search, BaseCertifiedSigma):
                # A clone: the user's parameter object is never changed.
                self.sigma_search_ = clone(components.sigma_search).fit_sigma(
                    SigmaFitContext.from_estimator(self), X, y)
        self.notify("on_train_end", X=X, y=y)

    def _restore(self, fitted, history):
        """Put back the attributes ``fitted`` (``dict(vars(self))``) and the history's epochs ``history``."""
        vars(self).clear()
        vars(self).update(fitted)
        if self.history_ is not None:  # skorch clears its history in place
            self.history_[:] = history

    def _seed(self, salt):
        """A non-negative int seed from ``random_state`` for one use (``salt``, see :mod:`smoothsk._stages`)."""
        return _stages.seed(self.random_state, salt)

    def initialize_module(self):
        """Build the module (seeded by ``random_state``), passing ``n_classes`` if it takes it.

        On a fitted estimator (``set_params(module__...)``) the new module is
        a new, untrained model: the old one's regions, fitted sigma function,
        history and training sigmas go with it, so a later ``partial_fit``
        runs the training schedule from its start.

        Returns
        -------
        self
        """
        self.module_ = self._new_module()
        if hasattr(self, "regions_"):
            # A new module is a new model, even where its seeded state_dict (and so the
            # store's weights fingerprint) equals the old one's: its regions certify the old model.
            self._reset_store()
            # Nor has it trained: the old module's epochs would resume the schedule past its start.
            self.initialize_history()
            for name in ("train_sigmas_", "train_keys_"):
                vars(self).pop(name, None)
        vars(self).pop("sigma_search_", None)  # fitted for the old module, like the regions
        return self

    def _new_module(self):
        """The module :meth:`initialize_module` sets: built seeded, ``n_classes`` passed, lazy layers materialised."""
        kwargs = self.get_params_for("module")
        if (isinstance(self.module, type) and "n_classes" not in kwargs and hasattr(self, "classes_")
                and "n_classes" in inspect.signature(self.module).parameters):
            kwargs["n_classes"] = len(self.classes_)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed(_stages.INIT_SALT))
            module = self.initialized_instance(self.module, kwargs)
            if hasattr(self, "input_shape_") and any(
                    isinstance(p, torch.nn.parameter.UninitializedParameter) for p in module.parameters()):
                with torch.no_grad():  # materialise lazy layers before the optimizer sees them (every expert's)
                    materialize(module, torch.zeros((1,) + self.input_shape_))
        return module

    # --------------------------------------------------------------- inference

    def _smoothing(self):
        """What certification and prediction read, resolved and validated before any sampling.

        Returns
        -------
        smoothsk._certification.Smoothing
        """
        self.check_is_fitted()
        components = _validation.smoothing_components(self)
        _validation.check_device_available(self.device)
        sigma_function = None
        if isinstance(components.sigma_search, BaseCertifiedSigma):
            fitted = getattr(self, "sigma_search_", None)
            if fitted is None:
                raise NotFittedError(
                    f"sigma_search={type(components.sigma_search).__name__}(...) is a certified sigma function, "
                    "fitted in fit; it was set after this estimator was fitted: call fit again.")
            sigma_function = components.sigma_search.with_fitted_state(fitted)
        return _certification.Smoothing(self.module_, len(self.classes_), self.n_features_in_, components,
                                        sigma_function, self.alpha, self.certify_batch_size, self.device, self.n_jobs,
                                        self.certify_autocast, self.certify_memory_format)

    def _per_chunk(self, inputs, work):
        """``work(smoothing, X_chunk)`` on each chunk of ``inputs`` (one for an array), in order.

        The prediction of each input depends on that input alone, unless the
        sigma search learns one sigma for the whole set, which needs every
        input at once: :meth:`_inputs_for_prediction` then reads them in one piece.
        """
        smoothing = self._smoothing()
        return [work(smoothing, inputs.read(begin, end)) for begin, end in inputs.chunks(0, inputs.n_inputs)]

    def _inputs_for_prediction(self, X):
        """The checked inputs of ``predict``, ``predict_proba`` or ``score`` (:func:`smoothsk._inputs.inputs_of`)."""
        self.check_is_fitted()
        sigma_search = _params.Components.of(self).sigma_search
        whole = not getattr(sigma_search, "per_input", True)  # a search without the attribute: refused by its check
        if whole:
            _inputs.refuse_dataset(X, f"sigma_search={sigma_search!r} learns one sigma for all the inputs of a call "
                                      "together", checkpoint_helps=False)
        return _inputs.inputs_of(self, X, whole)

    def _predict_chunk(self, smoothing, X):
        """:meth:`predict`'s class indices (``ABSTAIN`` kept) for checked inputs ``X`` (float32 ndarray)."""
        counts, _, abstain, alpha = _certification.prediction_counts(
            smoothing, X, self._seed(_stages.PREDICT_SALT), self.regions_)
        top, not_significant = top_two_test(counts, alpha)
        prediction = np.where(not_significant | abstain, ABSTAIN, top)
        return smoothing.components.allocator.predict_override(self.regions_, X.reshape(len(X), -1), prediction)

    def predict(self, X):
        """Cohen et al.'s PREDICT: the top class, or ``ABSTAIN`` if not significant.

        Returns the top class of the Monte Carlo counts when a two-sided
        binomial test of the top two counts rejects a tie at level ``alpha``;
        so a returned class differs from ``g(x)`` with probability at most alpha.
        ``g`` is smoothed at the sigma the allocator assigns (the searched
        sigma, or the sigma of the region ``x`` lies in), and the allocator
        may answer from its regions instead (``MemoryAllocator`` answers as
        its memory classifier); each allocator's docstring says exactly which
        classifier ``predict`` is. ``predict`` never allocates regions.

        Parameters
        ----------
        X : array-like of float, shape (n_inputs, *input_shape), or a streamed source
            A memory-mapped array or a map-style Dataset of inputs or
            ``(input, label)`` pairs is read a chunk at a time (labels
            ignored); see :mod:`smoothsk._inputs`.

        Returns
        -------
        labels : ndarray, shape (n_inputs,)
            Class labels, ``ABSTAIN`` (-1) where the test abstains.
        """
        prediction = np.concatenate(self._per_chunk(self._inputs_for_prediction(X), self._predict_chunk))
        return _validation.decode_labels(prediction, self.classes_)

    def predict_proba(self, X):
        """Monte Carlo class frequencies under each input's noise.

        Parameters
        ----------
        X : array-like of float, shape (n_inputs, *input_shape), or a streamed source
            As in :meth:`predict`.

        Returns
        -------
        proba : ndarray of float, shape (n_inputs, n_classes)
            Fraction of noisy copies classified as each class of ``classes_``.
        """
        def frequencies(smoothing, X):
            counts, n, _, _ = _certification.prediction_counts(
                smoothing, X, self._seed(_stages.PREDICT_SALT), self.regions_)
            return counts / n

        return np.concatenate(self._per_chunk(self._inputs_for_prediction(X), frequencies))

    def score(self, X, y=None, sample_weight=None):
        """Accuracy of :meth:`predict`; abstentions count as wrong.

        Parameters
        ----------
        X : array-like of float, shape (n_inputs, *input_shape), or a streamed source
            As in :meth:`predict`.
        y : array-like, shape (n_inputs,), optional
            True labels; required unless ``X`` is a Dataset of ``(input, label)``
            pairs, whose labels are then used.
        sample_weight : array-like of float, shape (n_inputs,), optional

        Returns
        -------
        float
        """
        inputs = self._inputs_for_prediction(X)  # first: its errors are the clear ones for a bad X
        if y is None:
            y = _inputs.dataset_labels(X)
            if y is None:
                raise ValueError("score needs the true labels y, unless X is a Dataset of (input, label) pairs.")
        y = _validation.check_label_vector(y, len(inputs), "y")
        if sample_weight is not None:
            sample_weight = _validation.check_label_vector(sample_weight, len(inputs), "sample_weight",
                                                             unit="weight").astype(np.float64)
        prediction = np.concatenate(self._per_chunk(inputs, self._predict_chunk))
        correct = _validation.correct_predictions(_validation.decode_labels(prediction, self.classes_), y)
        return float(np.average(correct, weights=sample_weight))

    def certify(self, X, return_details=False, checkpoint=None, checkpoint_every=1000, keep_checkpoint=False,
                checkpoint_key=None):
        """Certified prediction and L2 radius per input.

        Each certificate is about the classifier ``details.guarantee`` names:
        ``g`` at the fixed sigma (``FixedSigma``, ``NoRegions``), ``g(., sigma(x))``
        at the input's own searched sigma, a stateful allocator's region
        classifier, or, with a certified sigma function, the sample-wise
        classifier ``G(x) = g(x, sigma(x))``.

        Parameters
        ----------
        X : array-like of float, shape (n_inputs, *input_shape), or a streamed source
            A memory-mapped array or a map-style Dataset of inputs or
            ``(input, label)`` pairs is read a chunk at a time, with the
            certificates of the array of its inputs (labels ignored; see
            :mod:`smoothsk._inputs`). Where the certificates depend on all
            the inputs of the call (a stateful allocator, a sigma search with
            ``per_input=False``), a memory-mapped array is read whole, and a
            Dataset needs ``checkpoint``: each chunk of ``checkpoint_every``
            inputs is then a call of its own, read in one piece.
        return_details : bool, default=False
            Also return the per-input :class:`~smoothsk.certificates.Certificates`.
        checkpoint : str or Path, optional
            File that records finished chunks of ``checkpoint_every`` inputs
            (``.npz`` arrays and a JSON header, read without unpickling). A
            run that is interrupted (or crashes) and is called again with the
            same inputs, parameters, weights, ``checkpoint_every`` and file
            resumes after the last finished chunk with identical results, onto
            ``regions_`` as the run left them (or, on an estimator saved before
            the run, as it found them: the recorded regions then replace them).
            A file of another run, or ``regions_`` changed by other calls since,
            is refused with a ``ValueError``; the file is never overwritten by
            another run, and is removed on success unless ``keep_checkpoint``.
            Each chunk's regions join ``regions_`` only once the chunk is recorded.
        checkpoint_every : int, default=1000
            Inputs per chunk when ``checkpoint`` is given (a positive int).
        keep_checkpoint : bool, default=False
            Keep the ``checkpoint`` file when the run completes: the same call
            then returns every certificate from it without sampling. Remove it
            yourself once the results are saved (``smoothsk certify`` keeps it
            until its CSV is written).
        checkpoint_key : bytes, optional
            A secret key (16 bytes or more): the ``checkpoint`` file is written
            with an HMAC-SHA256 under it, and resumed only if a holder of the key
            wrote it and nothing changed since. Without a key the file's
            certificates are checked for consistency only, so whoever can write
            it can plant certificates that pass: keep it where only you write.

        Returns
        -------
        prediction : ndarray, shape (n_inputs,)
            Certified labels, ``ABSTAIN`` (-1) where abstained.
        radius : ndarray of float, shape (n_inputs,)
            Certified L2 radius, 0 where abstained.
        details : Certificates
            Only with ``return_details``; ``details.prediction`` holds class indices.
        """
        smoothing = self._smoothing()
        every = _checkpoint.check_chunk_size(checkpoint_every)
        checkpoint_key = check_key(checkpoint_key, "checkpoint_key")
        if checkpoint_key is not None and checkpoint is None:
            raise ValueError("checkpoint_key authenticates a checkpoint file: pass checkpoint=path too.")
        if checkpoint is not None:
            checkpoint = _checkpoint.check_path(checkpoint)
        if not isinstance(keep_checkpoint, bool):
            raise ValueError(f"keep_checkpoint must be a bool, got {keep_checkpoint!r}.")
        whole = checkpoint is None and not _parallel.can_split(smoothing.components)
        if whole:
            components = smoothing.components
            _inputs.refuse_dataset(X, (
                f"allocator={components.allocator!r} allocates regions over all the inputs of a call together"
                if not components.allocator.stateless else
                f"sigma_search={components.sigma_search!r} learns one sigma for all the inputs of a call together"),
                checkpoint_helps=True)
        inputs = _inputs.inputs_of(self, X, whole)
        root_seed = self._seed(_stages.CERTIFY_SALT)
        with tqdm(desc="certify", unit=" noisy samples", unit_scale=True, mininterval=1.0,
                  disable=not self.verbose, file=sys.stderr) as progress:
            if checkpoint is None:
                with self.regions_.transaction():
                    certificates = _certification.certify_rows(smoothing, inputs, 0, len(inputs), root_seed,
                                                               self.regions_, progress)
            else:
                certificates = _checkpoint.certify_in_chunks(
                    functools.partial(_certification.certify_rows, smoothing, inputs, progress=progress),
                    len(inputs), checkpoint, every,
                    _checkpoint.run_fingerprint(self, inputs), root_seed, get_store=lambda: self.regions_,
                    set_store=lambda store: setattr(self, "regions_", store), alpha=self.alpha,
                    n_classes=len(self.classes_), guarantee=smoothing.guarantee, key=checkpoint_key,
                    keep=keep_checkpoint)
        prediction = _validation.decode_labels(certificates.prediction, self.classes_)
        if return_details:
            return prediction, certificates.radius, certificates
        return prediction, certificates.radius

    def reset_regions(self):
        """Forget all allocated robust regions.

        Needed before certifying again after the module's weights were
        changed by hand (training clears the regions itself) or after
        switching to another allocator class.

        Returns
        -------
        self
        """
        self.check_is_fitted()
        self._reset_store()
        return self

    def _reset_store(self):
        """Start an empty region store (``regions_``): the one place a store is made or cleared."""
        self.regions_ = RegionStore.empty(self.n_features_in_)

    def save(self, path, *, key=None):
        """Write the fitted estimator to one safetensors file that loads without running code.

        Tensors (weights, ``train_sigmas_``, regions, a fitted certified
        sigma function) and JSON (the parameters a file may set, ``classes_``,
        ``input_shape_``, the history) with a SHA-256 digest, or under ``key``
        an HMAC-SHA256. Not saved: the optimizer's state and the parameters
        that can name code (``callbacks``, ``compile``, ``criterion``, the
        iterators, ``torch_load_kwargs``; a warning names those not at their
        defaults). The format and its guarantees: ``smoothsk._persistence``.

        Parameters
        ----------
        path : str or path-like
            File to write (replaced atomically, keeping its permissions).
        key : bytes, optional
            Secret of at least 16 bytes (``secrets.token_bytes(32)``): the file
            then loads only with this key.

        Raises
        ------
        ValueError
            Before writing anything, naming what: a path that cannot be
            written, a parameter the format cannot hold, or module (or sigma
            function) state outside its tensors, which the estimator that
            loading would build is compared with this one to find.
        """
        save_estimator(self, path, key=key)

    @classmethod
    def load(cls, path, *, key=None, module=None, allowed_classes=()):
        """Rebuild an estimator written by :meth:`save`, without running code from the file.

        Whoever wrote the file, loading runs none of its code and allocates no
        more than its size justifies: it sets only an allow-list of
        parameters, takes classes only from an allow-list (smoothsk's public
        classes, ``torch.optim``'s optimizers, and yours passed here), and
        builds the module on the ``meta`` device against the file's tensors
        before building it for real (``smoothsk._persistence``). The loaded
        estimator certifies and predicts as the saved one. An unkeyed digest
        catches corruption, not a forger; with ``key``, only files written
        with that key and unchanged since load.

        Parameters
        ----------
        path : str or path-like
        key : bytes, optional
            The key the file was saved with: required for a keyed file,
            refused with an unkeyed one.
        module : torch.nn.Module class or instance, optional
            Replaces the saved ``module``: needed for your own module class,
            or when the module was an instance (which receives the weights),
            unless the instance gave its ``constructor_params()`` (a
            :class:`~smoothsk.experts.NoiseLevelExperts` does), which the
            file rebuilds it from.
        allowed_classes : sequence of type, default=()
            Your own classes (components, modules) that the file may name.

        Returns
        -------
        SampleWiseSmoothedClassifier
            Fitted.

        Raises
        ------
        ValueError
            One line naming the file and what is wrong with it.
        """
        return load_estimator(cls, path, module=module, allowed_classes=allowed_classes, key=key)

    def check_is_fitted(self, attributes=None, *args, **kwargs):
        """Raise ``NotFittedError`` unless ``fit`` has run."""
        check_is_fitted(self, attributes or ["module_", "classes_", "input_shape_"])

    def __getstate__(self):
        state = super().__getstate__()
        for transient in ("noise_generator_", "shuffle_generator_"):
            state.pop(transient, None)
        return state

    def __sklearn_is_fitted__(self):
        return hasattr(self, "classes_") and hasattr(self, "module_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True
        tags.non_deterministic = self.random_state is None
        return tags
