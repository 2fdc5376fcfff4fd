"""Reinforcement learning for the policy: rewards and objectives as pure functions of arrays."""
