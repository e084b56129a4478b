"""Every random stream of smoothsk by name: the seed salts and the Monte Carlo engine stages.

**Why they must be distinct.** A certificate bounds a class probability from
samples that must be independent of the samples that chose anything about it
(the class, the sigma, the sample size, which certificate to report): Cohen
et al.'s CERTIFY selects with ``n0`` samples and bounds with ``n`` fresh ones.
Here "fresh" means "another stream": the engine draws the noise of a
(stage, input) pair from a stream keyed by the root seed, the stage and the
input's identifier (:func:`smoothsk.engine.stage_key` hashes the stage's
length with its elements, so ``(1,)``, ``(1, 0)`` and ``(1, 0, 0)`` are three
streams). Two uses of one stage under one root seed would reuse the same noise
and break the independence a certificate's proof needs; so every stage below
is distinct from every other one drawn under the same root seed
(``tests/test_stages.py``).

**Seed salts** (``*_SALT``). The estimator derives each of its seeds from
``random_state`` as ``SeedSequence([random_state, salt])`` (:func:`seed`),
one salt per use, so that no two uses share a seed.

**Engine stages** (``*_STAGE``, ``*_PASS``), by the root seed they live under:

- certify's engine (root seed from :data:`CERTIFY_SALT`): the sigma search's
  ``(SEARCH_STAGE, ...)``, then the allocator's certification passes
  ``(FIRST_PASS,)`` (stateless) or ``(FIRST_PASS, call)`` and
  ``(SECOND_PASS, call)`` (regions, ``call`` counting calls on the store), to
  each of which the sampler appends :data:`SELECTION` or :data:`ESTIMATION`
  (and a round index for sequential estimation); a certified sigma
  function's own CERTIFY, a sampler at :data:`CERTIFIED_SIGMA_CERTIFY`:
  :data:`CERTIFIED_SIGMA_SELECTION` and :data:`CERTIFIED_SIGMA_ESTIMATION`;
  the certificates of the levels it may switch to, ``(REACHABLE_LEVEL_STAGE,
  level)`` (sampler stages appended). The sigma search chooses sigma, so its
  stages must differ from every bounding stage.
- predict's engine (root seed from :data:`PREDICT_SALT`): the search's
  stages again, :data:`PREDICT_STAGE` and :data:`CERTIFIED_SIGMA_PREDICTION`.
- training engines (a root seed drawn from the estimator's training-noise
  generator at each use, :func:`smoothsk.training._per_sample.training_engine`):
  Insta-RS's :data:`LEVEL_UPDATE_STAGE` and the searches of PFAT's
  assignment and DDRS (``(SEARCH_STAGE, ...)``). Training chooses weights,
  never a certificate's bound.
- the certified sigma selector's level assignment (root seed from
  :data:`SELECTOR_ASSIGNMENT_SALT`): a grid search's ``(SEARCH_STAGE,)``.
"""

import numpy as np
from sklearn.utils import check_random_state

# ------------------------------------------------------------------ seed salts

#: Weight initialisation of the module.
INIT_SALT = 0
#: The training noise generator (``noise_generator_``; the salt's seed plus the number of epochs so far).
TRAIN_NOISE_SALT = 1
#: The training shuffle generator (``shuffle_generator_``; plus the number of epochs so far).
SHUFFLE_SALT = 2
#: Root seed of the engine of ``predict`` and ``predict_proba``.
PREDICT_SALT = 3
#: Root seed of the engine of ``certify`` (recorded in a checkpoint, which resumes with it).
CERTIFY_SALT = 4
#: torch's global generator during training: the module's own randomness (dropout, ...), plus the epochs so far.
MODULE_RANDOMNESS_SALT = 5
#: Weight initialisation of the certified sigma selector's network.
SELECTOR_INIT_SALT = 16
#: Gaussian augmentation noise of the selector's training.
SELECTOR_TRAIN_NOISE_SALT = 17
#: Shuffling of the selector's training.
SELECTOR_SHUFFLE_SALT = 18
#: torch's global generator during the selector's training (its module's own randomness).
SELECTOR_MODULE_RANDOMNESS_SALT = 19
#: Root seed of the engine of the selector's labelled level assignment (its training targets).
SELECTOR_ASSIGNMENT_SALT = 18

#: Salts that share a value, each pair named. Both seed the selector's
#: training only (a shuffle order and the Monte Carlo noise of its training
#: targets, drawn by different generators), never a sample that bounds a
#: certificate: the selector certifies itself from :data:`CERTIFY_SALT`'s
#: engine. They are kept equal because a new value changes the selector's
#: weights and so the reference certificates.
SHARED_SALTS = (("SELECTOR_SHUFFLE_SALT", "SELECTOR_ASSIGNMENT_SALT"),)


def seed(random_state, salt):
    """The seed of one use (``salt``) from an estimator's ``random_state``.

    Parameters
    ----------
    random_state : int, RandomState instance or None
    salt : int
        One of the ``*_SALT`` values above.

    Returns
    -------
    int
        Non-negative: ``SeedSequence([random_state, salt])``'s first word for
        an int; else a draw from the RandomState (numpy's global one for
        None), which advances it.
    """
    if random_state is None or isinstance(random_state, np.random.RandomState):
        return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))
    return int(np.random.SeedSequence([int(random_state), salt]).generate_state(1)[0])

# -------------------------------------------------------------- engine stages

#: First element of every sigma-search stage: ``(SEARCH_STAGE,)`` for a grid
#: (one stage for all sigmas: common random numbers), ``(SEARCH_STAGE, level)``
#: for FGSS, ``(SEARCH_STAGE, step)`` for the gradient search.
SEARCH_STAGE = 0
#: First element of the first certification pass: ``(FIRST_PASS,)`` without
#: regions, ``(FIRST_PASS, call)`` by a region allocator.
FIRST_PASS = 1
#: First element of a region allocator's second pass on fresh samples: ``(SECOND_PASS, call)``.
SECOND_PASS = 2
#: The stage prefix a sampler certifies at when its caller names none (a stateless allocator's one pass).
CERTIFY_STAGE = (FIRST_PASS,)
#: Last element a sampler appends to its caller's stage for the samples that choose the class.
SELECTION = 0
#: Element a sampler appends for the samples that bound the chosen class
#: (a sequential sampler appends the round index after it).
ESTIMATION = 1
#: The counts of ``predict`` and ``predict_proba``.
PREDICT_STAGE = (7,)
#: First element of a certified sigma function's own samples. It samples its
#: own module through an engine with the classifier's root seed and input
#: keys, so this distinct first element is what makes its samples independent
#: of the classifier's.
CERTIFIED_SIGMA_STAGE = 8
#: The stage prefix a certified sigma function's CERTIFY passes to a sampler.
CERTIFIED_SIGMA_CERTIFY = (CERTIFIED_SIGMA_STAGE,)
#: A certified sigma function's selection of its sigma (the samples that choose).
CERTIFIED_SIGMA_SELECTION = (*CERTIFIED_SIGMA_CERTIFY, SELECTION)
#: A certified sigma function's bound of its choice (fresh samples).
CERTIFIED_SIGMA_ESTIMATION = (*CERTIFIED_SIGMA_CERTIFY, ESTIMATION)
#: A certified sigma function's choice in ``predict``.
CERTIFIED_SIGMA_PREDICTION = (CERTIFIED_SIGMA_STAGE, 2)
#: First element of the certificates of the levels a certified sigma function
#: may switch to within an input's radius, ``(REACHABLE_LEVEL_STAGE, level)``:
#: which levels are sampled depends on the chosen level's samples (first pass),
#: so their own samples come from streams of their own.
REACHABLE_LEVEL_STAGE = 9
#: Insta-RS's level updates: both candidate levels on this one stage (common
#: noise directions). Its value is a grid search's stage, never under the same
#: root seed: every training engine draws a root seed of its own.
LEVEL_UPDATE_STAGE = (0,)
