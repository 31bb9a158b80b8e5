"""The client's tests that need no lab on Python 3.13, from the wheel and the lock
(tests/clientmatrix.py)."""

from __future__ import annotations

import pytest
from clientmatrix import run_client_tests

pytestmark = pytest.mark.matrix


def test_the_client_on_python_313(tmp_path):
    run_client_tests("3.13", tmp_path)
