"""A per-crawl credit budget that is never exceeded, counting requests still in flight.

Every API call reserves an estimate of its cost before it is sent; the reservation is replaced by
the credits the API reports when the answer comes. A call is only sent while
``spent + reserved + estimate <= budget``.
"""

from __future__ import annotations


class Budget:
    def __init__(self, limit: float) -> None:
        self.limit = float(limit)  # 0: no budget
        self.spent = 0.0
        self.reserved = 0.0
        self.largest_cost = 0.0

    def estimate(self, provider_estimate: float) -> float:
        """The reservation for one call: the provider's estimate, or more if pages cost more."""
        return max(provider_estimate, self.largest_cost)

    def try_reserve(self, amount: float) -> bool:
        if self.limit and self.spent + self.reserved + amount > self.limit + 1e-9:
            return False
        self.reserved += amount
        return True

    def release(self, amount: float) -> None:
        self.reserved = max(0.0, self.reserved - amount)

    def spend(self, credits: float) -> None:
        self.spent += credits
        self.largest_cost = max(self.largest_cost, credits)
