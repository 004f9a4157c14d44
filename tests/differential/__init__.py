"""Differential testing of the general C path: random affine loop nests (`generator.py`),
their domains (`program.py`), gcc -O0 as the oracle (`oracle.py`), one program through both
compilers (`runner.py`) and shrinking a failure (`minimize.py`). Shared by the tests here and
by `tools/differential.py`, which runs thousands."""
