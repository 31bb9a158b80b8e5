"""The client's tests that need no lab on Python 3.12, from the wheel and the lock
(tests/clientmatrix.py)."""

from __future__ import annotations

import pytest
from clientmatrix import run_client_tests

pytestmark = pytest.mark.matrix


def test_the_client_on_python_312(tmp_path):
    run_client_tests("3.12", tmp_path)
