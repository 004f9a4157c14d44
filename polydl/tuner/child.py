"""Entry point of the measuring process (`python -m polydl.tuner.child REQUESTS_FD MESSAGES_FD`);
see measure.py and measuring_processes.py.

A module of its own so that the measuring code runs as `polydl.tuner.measure`, not as a
second copy under `__main__`."""

import sys

from polydl.tuner.measure import child_main

if __name__ == "__main__":
    child_main(int(sys.argv[1]), int(sys.argv[2]))
