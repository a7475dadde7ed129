"""Coding tasks for agent RL: the task format, the sandbox an agent works in, and the grader outside it."""
