"""Sweeps: deployments × load cells, run with hygiene, resumable; knee detection and ranking."""
