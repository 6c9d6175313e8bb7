"""Repair from value evidence: rules induced from pages whose stored value is known and stable.

``induce(field, evidence, clean)`` returns a :class:`Repair` (one rule per template, each
verified on pages it did not learn from) or a :class:`Refusal` saying why nothing can be
verified; ``verify(rules, evidence, clean)`` checks rules already written. No crawl is needed:
the input is HTML and the values the project stored.
"""

from .evidence import Evidence
from .induce import Check, Fitted, Refusal, Repair, induce, verify
from .rules import Rule

__all__ = ["Check", "Evidence", "Fitted", "Refusal", "Repair", "Rule", "induce", "verify"]
