"""Settings for the whole test suite, applied before any test module imports torch."""
import os

# OpenMP threads that wait by sleeping, not spinning. On an idle machine it costs nothing
# (tests/model/test_learning.py: 23.0 s spinning, 23.8 s sleeping); when other processes share the
# 2 cores, spinning threads steal the cores their own peers need (the same test: 122 s vs 26 s).
# Subprocesses the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
