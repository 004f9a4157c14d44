"""`python -m polydl`: the command line, where the `polydl` script is not on PATH."""

import sys

from polydl.cli import main

sys.exit(main())
