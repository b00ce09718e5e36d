"""Errors of the strategies: a search or a prediction that cannot be made, with the fix.

They are ``ValueError``s (bad input, not bugs): the CLI reports them as bad usage (one line,
exit 2). The message is one sentence that names the problem and the knob that would help.
"""

from __future__ import annotations

# The head of recommend's error when nothing could be priced (advisor.run adds its way on).
UNPRICED = "no candidate could be predicted from this profile"


class StrategyError(ValueError):
    """A prediction or search the inputs do not allow; the message names the fix."""


class Unpredictable(StrategyError):
    """The profile lacks a measurement this config needs (a fit, a world size, a precision)."""


class NothingFits(StrategyError):
    """No candidate of the search space fits the memory budget.

    ``smallest_bytes`` is the least memory any candidate needs (what the budget is compared
    with: per device on a GPU, all ranks together on a CPU host); ``budget_bytes`` the budget.
    """

    def __init__(self, message: str, *, smallest_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.smallest_bytes = smallest_bytes
        self.budget_bytes = budget_bytes
