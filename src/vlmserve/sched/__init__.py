"""A model of vLLM V1's continuous-batching scheduler, shared by `engine sim` and `plan`."""
