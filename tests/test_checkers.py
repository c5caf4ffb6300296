"""Each exercise checker passes the reference answer and catches the planted mistakes a learner
makes, with a message that names the mistake or the input it failed on."""

import pytest

from minibatch.checks import check_roofline_tokens_per_s
from minibatch.checks.why_batch import ADVICE, MISTAKES, roofline_tokens_per_s


def test_roofline_reference_is_solved():
    assert check_roofline_tokens_per_s(roofline_tokens_per_s).solved


@pytest.mark.parametrize("mistake", MISTAKES)
def test_roofline_mistake_is_named(mistake):
    with pytest.raises(AssertionError, match=ADVICE[mistake].split(":")[0]):
        check_roofline_tokens_per_s(MISTAKES[mistake])


def test_roofline_other_wrong_answer_names_its_input():
    with pytest.raises(AssertionError, match=r"(?s)input:.*expected"):
        check_roofline_tokens_per_s(lambda b, wb, wp, bw, fl: 1 / max(wb / bw, 2 * b * wp / fl))  # steps/s
