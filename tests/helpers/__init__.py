"""Helpers shared by tests: start real engines and servers in subprocesses."""
