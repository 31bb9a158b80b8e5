"""What the Ctrl-C sweeps count as a moment before the program (tests/interrupts.py): a signal that
lands while CPython initialises itself, before it runs a line of `fleet`, is the interpreter's, not
the program's. Read on stderr recorded from real runs of the lab sweep
(tests/test_interrupt_startup_lab.py) under a CPU hog."""

from __future__ import annotations

import signal

from interrupts import Moment

# SIGINT 0.05 s after `fleet -H lab01 ping` started, on a loaded machine: inside the interpreter's
# own creation of sys.stdin/stdout/stderr (its `io` import), exit status 1.
CORE_INIT = (
    "Fatal Python error: init_sys_streams: can't "
    "initialize sys standard streams\nPython runtime state: "
    'core initialized\nTraceback (most recent call last):\n  File "<frozen '
    'importlib._bootstrap>", line '
    '1176, in _find_and_load\n  File "<frozen importlib._bootstrap>", line 1147, in '
    "_find_and_load_unlocked"
    '\n  File "<frozen importlib._bootstrap>", line 690, in _load_unlocked\n  File "<frozen '
    'importlib._bootstrap>", line 980, in exec_module\n'
    '  File "<frozen io>", line 88, in <module>\n  File '
    '"<frozen abc>", line 106, in __new__\nKeyboardInterrupt\n'
)


def test_a_signal_inside_the_interpreters_own_initialisation_is_before_the_program():
    assert Moment(0.05, 1, CORE_INIT, False).before_the_program


def test_a_signal_in_the_programs_code_is_the_programs():
    program = (
        'Traceback (most recent call last):\n  File "/x/bin/fleet", line 8, in <module>\n    '
        'sys.exit(main())\n  File "/x/fleetops/entry.py", line 22, in main\n    '
        "import_program().main()\nKeyboardInterrupt\n"
    )
    assert not Moment(0.3, 1, program, False).before_the_program
    # A fatal error once the runtime is up, with a frame of the program, is the program's too.
    late = CORE_INIT.replace("core initialized", "initialized").replace(
        '  File "<frozen io>"',
        '  File "/x/fleetops/cli.py", line 3, in <module>\n  File "<frozen io>"',
    )
    assert not Moment(0.3, 1, late, False).before_the_program
    # killed before Python set its handler
    assert Moment(0.01, -signal.SIGINT, "", False).before_the_program
