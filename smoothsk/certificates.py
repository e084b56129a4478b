"""The ``ABSTAIN`` label, the per-input record that certification returns, and its guarantee statements."""

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ABSTAIN",
    "Certificates",
    "FIXED_SIGMA_GUARANTEE",
    "OWN_SIGMA_GUARANTEE",
    "REGION_GUARANTEE",
    "SAMPLE_WISE_GUARANTEE",
    "SEMI_ELASTIC_GUARANTEE",
    "SAMPLE_WISE_GUARANTEES",
    "fixed_sigma_guarantee",
    "is_fixed_sigma_guarantee",
]

#: Label returned where the smoothed classifier abstains.
ABSTAIN = -1

# ------------------------------------------------------- guarantee statements
# ``Certificates.guarantee``: which classifier the certificates are about.
# Each class that certifies sets its statement from here; each claim's proof
# is in that class's docstring.

#: ``g`` at one sigma for every input, the very classifier ``predict``
#: queries (Cohen et al.): ``NoRegions`` with ``FixedSigma``. A template;
#: :func:`fixed_sigma_guarantee` fills in the sigma.
FIXED_SIGMA_GUARANTEE = "g at the fixed sigma {sigma:g} (the classifier predict queries), stateless"
#: ``g(., sigma(x))`` at each input's own searched sigma, not the sample-wise
#: classifier ``G``: ``NoRegions`` with a sigma search.
OWN_SIGMA_GUARANTEE = "g(., sigma(x)) at the input's own sigma (not G), stateless"
#: The stateful region classifier of a region allocator (``RegionAllocator``).
REGION_GUARANTEE = "stateful region classifier"
#: ``G(x) = g(x, sigma(x))`` with a sigma certified constant on the ball
#: (``BaseCertifiedSigma``, e.g. ``CertifiedSigmaSelector``).
SAMPLE_WISE_GUARANTEE = "G (sample-wise classifier), stateless"
#: ``G`` with an r-semi-elastic sigma (``SemiElasticSigma``): a radius proven in Súkeník et al.'s setting.
SEMI_ELASTIC_GUARANTEE = "G (sample-wise classifier, r-semi-elastic sigma), stateless"
#: The statements about the sample-wise classifier ``G``.
SAMPLE_WISE_GUARANTEES = (SAMPLE_WISE_GUARANTEE, SEMI_ELASTIC_GUARANTEE)


def fixed_sigma_guarantee(sigma):
    """The statement of certificates of ``g`` at the one ``sigma`` of every input (:data:`FIXED_SIGMA_GUARANTEE`).

    Parameters
    ----------
    sigma : float

    Returns
    -------
    str

    Examples
    --------
    >>> fixed_sigma_guarantee(0.5)
    'g at the fixed sigma 0.5 (the classifier predict queries), stateless'
    """
    return FIXED_SIGMA_GUARANTEE.format(sigma=sigma)


def is_fixed_sigma_guarantee(statement):
    """Whether ``statement`` is :func:`fixed_sigma_guarantee` of some sigma, exactly.

    Parameters
    ----------
    statement : str
        A ``Certificates.guarantee``.

    Returns
    -------
    bool

    Examples
    --------
    >>> is_fixed_sigma_guarantee(fixed_sigma_guarantee(0.25)), is_fixed_sigma_guarantee(OWN_SIGMA_GUARANTEE)
    (True, False)
    """
    head, tail = FIXED_SIGMA_GUARANTEE.split("{sigma:g}")
    if not (statement.startswith(head) and statement.endswith(tail)):
        return False
    try:
        sigma = float(statement[len(head):len(statement) - len(tail)])
    except ValueError:
        return False
    return statement == fixed_sigma_guarantee(sigma)


@dataclass
class Certificates:
    """Per-input results of one certification, all arrays of shape (n_inputs,).

    Attributes
    ----------
    prediction : ndarray of int
        Index into ``classes_`` of the certified class, ``ABSTAIN`` (-1) where
        the certificate abstains. (``SampleWiseSmoothedClassifier.certify``
        returns labels; this record keeps indices.)
    radius : ndarray of float
        Certified L2 radius; 0 where abstained.
    sigma : ndarray of float
        Noise level the certificate was computed at (with a certified sigma
        function that certifies the levels it may switch to, the level whose
        classifier certified at full ``n``: where the selector is unsure at
        the input, not necessarily ``sigma(x)``).
    p_lower : ndarray of float
        Lower confidence bound on the top-class probability under that noise.
    n_samples : ndarray of int
        Noisy samples spent on the certificate (selection plus estimation).
    search_steps : ndarray of int
        Noise levels the search evaluated for the input (each on the
        search's own noisy samples: a grid point, an FGSS or gradient step),
        0 for functions that do not search.
    region : ndarray of int
        Index into ``regions_`` of the robust region the certificate belongs
        to, -1 where the allocator keeps no regions.
    radius_space : str
        One value for all inputs: where ``radius`` is measured, ``"model
        input"`` (the classifier's own input space, where the noise is added)
        or ``"pipeline input"`` (the raw inputs of a Pipeline, see
        :func:`smoothsk.certify`). ``sigma`` is always in the model input space.
    lipschitz_constant : float
        One value for all inputs: the L2 Lipschitz constant L of the
        preprocessing between the two spaces; ``radius`` is the model-input
        radius divided by L (1 in the model input space).
    radius_cap : ndarray of float
        With a certified sigma function (``BaseCertifiedSigma``): the radius
        ``R1`` on which ``sigma(.)`` is certified constant, in the units of
        ``radius`` (``radius_space``); ``inf`` otherwise. The radius is at
        most this, except where the levels ``sigma(.)`` may switch to are
        certified too (``CertifiedSigmaSelector(certify_reachable_levels=True)``):
        there it is 0 where the selector may take another level at the input
        itself, and the radius may exceed it.
    sigma_samples : ndarray of int
        Noisy samples the certified sigma function spent (not in
        ``n_samples``); 0 otherwise.
    guarantee : str
        Which classifier the certificates are about: one of this module's
        ``*_GUARANTEE`` statements (e.g. :data:`SAMPLE_WISE_GUARANTEE`), set
        by the allocator or the certified sigma function (see their
        docstrings for the exact claim).
    """

    prediction: np.ndarray
    radius: np.ndarray
    sigma: np.ndarray
    p_lower: np.ndarray
    n_samples: np.ndarray
    search_steps: np.ndarray = None
    region: np.ndarray = None
    radius_space: str = "model input"
    lipschitz_constant: float = 1.0
    radius_cap: np.ndarray = None
    sigma_samples: np.ndarray = None
    guarantee: str = ""

    def __post_init__(self):
        n_inputs = len(self.prediction)
        if self.search_steps is None:
            self.search_steps = np.zeros(n_inputs, dtype=np.int64)
        if self.region is None:
            self.region = np.full(n_inputs, -1, dtype=np.int64)
        if self.radius_cap is None:
            self.radius_cap = np.full(n_inputs, np.inf)
        if self.sigma_samples is None:
            self.sigma_samples = np.zeros(n_inputs, dtype=np.int64)

    @classmethod
    def concatenate(cls, parts):
        """The certificates of consecutive chunks as one record.

        Parameters
        ----------
        parts : sequence of Certificates
            Non-empty, in input order; their one-value fields (``guarantee``,
            ``radius_space``, ``lipschitz_constant``) are equal.

        Returns
        -------
        Certificates
        """
        merged = {}
        for name in cls.__dataclass_fields__:
            values = [getattr(part, name) for part in parts]
            merged[name] = np.concatenate(values) if isinstance(values[0], np.ndarray) else values[0]
        return cls(**merged)
