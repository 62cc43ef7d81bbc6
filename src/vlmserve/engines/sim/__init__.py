"""The simulated engine: vLLM's OpenAI API and metrics, timed by the scheduler model in `vlmserve.sched`."""
