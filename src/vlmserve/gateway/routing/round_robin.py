"""Round robin: the pipeline with no scorer, so every replica ties and the rotation decides."""

from __future__ import annotations

from vlmserve.gateway.routing.pipeline import Pipeline
from vlmserve.routing import ROUND_ROBIN


class RoundRobin(Pipeline):
    """Each choice takes the next replica in the list; blind to load, so a baseline and a way to
    spread requests that carry no request details (the app's /version and the like)."""

    name = ROUND_ROBIN
