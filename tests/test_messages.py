"""Tests of smoothsk._messages: a refusal quotes a file's values and the errors raised on them short and on one line."""

from smoothsk._messages import MAX_QUOTED_CHARACTERS, one_line, quoted


def test_one_line_cuts_a_long_error_and_joins_its_lines():
    text = one_line(ValueError("Header is not a dictionary:\n" + "[1, " * 3000))
    assert "\n" not in text and text.startswith("Header is not a dictionary: [1, [1,")
    assert len(text) <= MAX_QUOTED_CHARACTERS + 4 and text.endswith(" ...")


def test_one_line_keeps_a_short_error_whole():
    assert one_line(TypeError("unexpected  keyword\targument 'x'")) == "unexpected keyword argument 'x'"


def test_quoted_keeps_a_dotted_class_name_and_cuts_what_no_name_is():
    assert quoted("my_package.models.MyResidualNetwork") == "'my_package.models.MyResidualNetwork'"
    assert len(quoted("x" * 5000)) < 110
    assert len(quoted(list(range(3000)))) < 60
    assert len(quoted({"dtype": "<f4", "values": ["y" * 5000] * 10})) <= MAX_QUOTED_CHARACTERS + 4


def test_quoted_puts_an_array_on_one_line_and_shortens_it():
    import numpy as np

    assert quoted(np.array([[0.25], [0.5]])) == "array([[0.25], [0.5 ]])"
    text = quoted([np.arange(10**6).reshape(1000, 1000)])
    assert "\n" not in text and "..." in text and len(text) <= MAX_QUOTED_CHARACTERS + 4
