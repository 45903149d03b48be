"""Shared pytest set-up: keep torch (where installed) to one thread so multi-process tests do not oversubscribe."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
