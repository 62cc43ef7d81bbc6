"""Image-aware routing: which replica holds a request's images, and what a miss costs.

vLLM keeps processed images (and their encoder outputs) per replica, keyed by content hash; a
repeat on the same replica skips preprocessing and the vision encoder. Two scorers use that:
`ImageAwareTokens` (the image-affinity policy) counts an image as work only where it is not held;
`ImagesHeld` (one of the engine-aware policy's scorers) rates the share of the images held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.bounds import load_bound, under_load_bound
from vlmserve.gateway.routing.load import LeastOutstandingTokens, OutstandingTokens
from vlmserve.gateway.routing.pipeline import Scorer
from vlmserve.gateway.routing.policy import Lifecycle
from vlmserve.routing import IMAGE_AFFINITY


class ImageMemory(Lifecycle):
    """Which image digests each replica was recently sent: a stand-in for its multimodal cache.

    An LRU of `images_per_replica` digests approximates what is still cached there. A pipeline
    part placed after the scorers that read it, so a request is charged for the images its replica
    did not hold before it."""

    def __init__(self, images_per_replica: int = 4096) -> None:
        self.images_per_replica = images_per_replica
        self._seen: dict[int, OrderedDict[str, None]] = {}

    def matched(self, request: RoutedRequest, replica: Replica) -> int:
        """How many of the request's images the replica holds."""
        seen = self._seen.get(replica.index)
        return sum(digest in seen for digest in request.image_digests) if seen else 0

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        seen = self._seen.setdefault(replica.index, OrderedDict())
        for digest in request.image_digests:
            seen[digest] = None
            seen.move_to_end(digest)
        while len(seen) > self.images_per_replica:
            seen.popitem(last=False)

    def forget(self, replica: Replica) -> None:
        self._seen.pop(replica.index, None)


class ImageAwareTokens(OutstandingTokens):
    """Outstanding tokens, where an image is work only on a replica that does not hold it.

    Until its first token, a request with a new image costs its replica more than its tokens: the
    frontend decodes and processes the image and the vision tower encodes it. So a request is
    charged its tokens plus `hit_weight` × the tokens of each image the replica does not hold, and
    scored on the replica's count after it; the charge drops to tokens alone at the first token (as
    in OutstandingTokens), because the image work is then done. An image's repeats follow it while
    the replicas are near balance and go elsewhere when its holder is busier than the work is worth."""

    def __init__(self, memory: ImageMemory, hit_weight: float = 2.0) -> None:
        super().__init__()
        self.memory = memory
        self.hit_weight = hit_weight

    def image_work(self, request: RoutedRequest, replica: Replica) -> int:
        """Extra load of the request's images on `replica`: none for the images it holds."""
        if not request.image_digests:
            return 0
        fresh = len(request.image_digests) - self.memory.matched(request, replica)
        return round(self.hit_weight * request.image_tokens * fresh / len(request.image_digests))

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        tokens = self.outstanding.get(replica.index, 0)
        if request.image_digests:
            tokens += self.image_work(request, replica)
        return self.half / (self.half + tokens)

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self._charge(request, replica, request.expected_total_tokens + self.image_work(request, replica))


class ImagesHeld(Scorer):
    """Share of the request's images the replica holds, counted only under the load bound.

    The bound keeps the replica that holds a popular image from taking all its repeats; a
    request without images scores 0 everywhere."""

    def __init__(self, memory: ImageMemory, load_factor: float = 1.25) -> None:
        self.memory = memory
        self.load_factor = load_factor
        self._bound = 0  # this choice's load bound (prepare)

    def prepare(self, request: RoutedRequest, candidates: Sequence[Replica]) -> None:
        self._bound = load_bound(candidates, self.load_factor) if request.image_digests else 0

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        images = len(request.image_digests)
        if images and replica.in_flight + 1 <= self._bound:
            return self.memory.matched(request, replica) / images
        return 0.0


class ImageAffinity(LeastOutstandingTokens):
    """Least outstanding tokens with image-aware counts; requests with images stay under the load bound.

    Text requests are routed exactly as least-outstanding-tokens routes them."""

    name = IMAGE_AFFINITY

    def __init__(self, load_factor: float = 1.25, images_per_replica: int = 4096, hit_weight: float = 2.0) -> None:
        self.memory = ImageMemory(images_per_replica)
        self.load_factor = load_factor
        super().__init__(
            ImageAwareTokens(self.memory, hit_weight),
            filters=(under_load_bound(load_factor, only_with_images=True),),
            parts=(self.memory,),
        )
        self.affinity_hits = 0  # sent where (some of) its images are held
        self.affinity_declined = 0  # a holder existed but was too busy (or over the bound)

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        chosen = super().choose(request, candidates)
        if request.image_digests:
            if self.memory.matched(request, chosen):
                self.affinity_hits += 1
            elif any(self.memory.matched(request, replica) for replica in candidates):
                self.affinity_declined += 1
        return chosen
