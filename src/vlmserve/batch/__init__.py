"""`vlmserve batch`: OpenAI Batch-format JSONL jobs through any OpenAI-compatible endpoint.

Resumable, streamed (flat memory), and tolerant of bad lines; see `runner.py` for the
guarantees and `docs/batch.md` for when to use Ray Data instead.
"""
