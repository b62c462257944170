"""Servers in front of the engine."""
