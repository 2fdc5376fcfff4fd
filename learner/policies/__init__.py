"""Policies behind one interface (`base.Policy`): our checkpoint, the teacher, a hosted model."""

from learner.policies.base import Policy, PolicyError, Proposal
from learner.policies.registry import load_policy

__all__ = ["Policy", "PolicyError", "Proposal", "load_policy"]
