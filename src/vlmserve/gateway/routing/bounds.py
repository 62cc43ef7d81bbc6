"""A load bound: no replica takes more than `load_factor` × its fair share of requests in flight.

Affinity (a cached prefix, a held image, a pinned session) pulls repeats to one replica; left
alone, a popular prefix or image would pile its traffic there. Consistent hashing with bounded
loads (Mirrokni et al.) keeps affinity and caps the pile: the affinity wins only while its replica
is under the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.pipeline import Filter


def load_bound(candidates: Sequence[Replica], factor: float) -> int:
    """Most in-flight requests one replica may hold after this dispatch: factor × fair share."""
    total = sum(r.in_flight for r in candidates) + 1
    return max(1, math.ceil(factor * total / len(candidates)))


def under_load_bound(load_factor: float, only_with_images: bool = False) -> Filter:
    """A filter keeping the replicas that stay within the bound after taking the request.

    With a factor of at least 1 some replica always does (the least loaded one); should none,
    every candidate is kept rather than none. `only_with_images`: bound only requests with images
    (image affinity leaves text requests to plain least-outstanding-tokens)."""

    def keep(request: RoutedRequest, candidates: Sequence[Replica]) -> Sequence[Replica]:
        if only_with_images and not request.image_digests:
            return candidates
        bound = load_bound(candidates, load_factor)
        return [replica for replica in candidates if replica.in_flight + 1 <= bound] or candidates

    return keep
