"""log_softmax: the shared softmax tests (tests/_softmax_tests.py) run for log_softmax."""
import pytest

from _softmax_tests import *  # noqa: F401,F403  (the test functions)


@pytest.fixture
def op():
    return "log_softmax"
