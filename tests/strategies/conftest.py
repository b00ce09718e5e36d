"""Fixtures for the strategies tests: hand-made profiles (tests/strategies/profiles.py)."""

from __future__ import annotations

import pytest

from profilers.profile_record import Profile
from strategies.cost import CostModel, cost_model_from_profile
from tests.strategies.profiles import hand_profile


@pytest.fixture
def profile() -> Profile:
    return hand_profile()


@pytest.fixture
def model(profile: Profile) -> CostModel:
    return cost_model_from_profile(profile, memory_budget=0.9)
