"""The simulated engine: vLLM's OpenAI API and metrics, timed by the scheduler model in `vlmserve.sched`."""

SIM_ENGINE_NAME = "vlmserve-sim"
"""What the sim engine answers as `engine` on /version; bench reads it to label runs simulated."""
