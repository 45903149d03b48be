"""Shared pytest set-up.

- torch (where installed) runs on one thread, so multi-process tests do not oversubscribe.
- Hypothesis profiles: ``ci`` (loaded when the environment variable ``CI`` is set, e.g. ``CI=true``)
  is derandomized with no example database, so every CI run draws the same examples and a red run
  is reproducible; ``dev`` (otherwise) stays randomized. Both have no deadline (shared, loaded
  machines make timings noisy) and print the blob that reproduces a failure. A test's own
  ``@settings`` (e.g. its ``max_examples``) take precedence over the profile.
"""

import os

from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")

settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=100, deadline=None, print_blob=True
)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI", "").strip().lower() not in ("", "0", "false") else "dev")
