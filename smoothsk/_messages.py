"""How a refusal quotes a file's values and the errors raised on them: on one line, shortened.

A hostile file may hold values of kilobytes (a 5,000-character name, 3,000
labels), and the errors raised on them (numpy's, scikit-learn's) quote them
whole. Refusals quote a file's values with :func:`quoted` and such errors
with :func:`one_line`.
"""

import reprlib

import numpy as np

#: Most characters of an error's text that a refusal quotes.
MAX_QUOTED_CHARACTERS = 300


class _Repr(reprlib.Repr):
    """reprlib's shortened repr, with numpy arrays on one line and shortened as lists are."""

    def repr_ndarray(self, array, level):
        text = np.array2string(array, threshold=self.maxlist, edgeitems=self.maxlist // 2, separator=", ")
        return f"array({' '.join(text.split())})"


_REPR = _Repr()
# Strings as long as a dotted class name or a path may be; containers of a few items (reprlib's defaults).
_REPR.maxstring = _REPR.maxother = 100


def quoted(value):
    """``repr(value)`` with strings cut to 100 characters, containers to their first few items, and all of it to
    :data:`MAX_QUOTED_CHARACTERS` (then ``" ..."``).

    Parameters
    ----------
    value : object
        A value read from a file (JSON: None, bool, number, str, list, dict).

    Returns
    -------
    str
    """
    return _cut(_REPR.repr(value))


def one_line(error):
    """The text of ``error`` on one line, cut to :data:`MAX_QUOTED_CHARACTERS` characters (then ``" ..."``).

    Parameters
    ----------
    error : BaseException or str

    Returns
    -------
    str
    """
    return _cut(" ".join(str(error).split()))


def _cut(text):
    return text if len(text) <= MAX_QUOTED_CHARACTERS else text[:MAX_QUOTED_CHARACTERS] + " ..."
