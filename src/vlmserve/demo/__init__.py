"""`vlmserve demo`: the embedded model end to end (`run`), closing with a short sweep and report (`sweep`).

It sits above deploy/, sweep/ and report/ because it orchestrates all three.
"""
