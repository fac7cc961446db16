"""Typed jobs the agent runs for the control plane (artifact acquisition first)."""
