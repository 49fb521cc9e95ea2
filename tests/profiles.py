"""Hypothesis profiles: how hard the property tests look.

`ci` (the default) is what the README's test command runs; `deep`
(`HYPOTHESIS_PROFILE=deep`) looks ten times harder. A test that needs its own
budget writes `max_examples=examples(N)`: N examples under `ci`, 10 x N under
`deep`, so a fixed number in a decorator never pins the depth of a deep run.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILES = {"ci": 1, "deep": 10}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected one of {sorted(PROFILES)}")
SCALE = PROFILES[PROFILE]

# Tests without a budget of their own take the profile's: Hypothesis's default of 100, scaled.
for _name, _scale in PROFILES.items():
    settings.register_profile(_name, max_examples=100 * _scale, deadline=None)
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """A test's own example budget under the loaded profile."""
    return n * SCALE
