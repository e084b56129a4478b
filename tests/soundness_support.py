"""What the soundness tests share: how many failed certificates a sound method may show.

A family of certificates, each wrong with probability at most ``alpha``,
shows a number of failures dominated by a binomial law; a test that counts
failures compares them with :func:`binomial_bound`, which a sound method
exceeds with probability at most :data:`ERROR_PROBABILITY`.
"""

from scipy import stats

#: Probability that a sound method fails a check built on :func:`binomial_bound`.
ERROR_PROBABILITY = 1e-6


def binomial_bound(n_certificates, alpha):
    """Largest failure count consistent with failure probability <= alpha per certificate.

    Parameters
    ----------
    n_certificates : int
        Certificates checked.
    alpha : float
        Failure probability of each certificate.

    Returns
    -------
    float
        The ``1 - ERROR_PROBABILITY`` quantile of ``Binomial(n_certificates, alpha)``.
    """
    return stats.binom.isf(ERROR_PROBABILITY, n_certificates, alpha)
