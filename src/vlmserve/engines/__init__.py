"""Engines vlmserve starts: vLLM (GPU or CPU build) and the simulated engine."""
