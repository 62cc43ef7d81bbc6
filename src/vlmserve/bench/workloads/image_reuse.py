"""Which images each request carries: fresh ones, or repeats of images sent earlier in the run.

Products resend images: a clinic asks several questions about one radiograph, a tutoring app
reuses page photos. An engine's multimodal cache turns a repeat on the same replica into skipped
preprocessing and encoder work, so a benchmark must state how often images repeat, and which
ones: popularity is skewed (a few images get most repeats).

With `repeat_rate` R, each image request repeats earlier images with probability R (all its
images are repeats), else brings new ones. A repeat picks among the images sent so far with a
Zipf weight (rank r, counted from the first image sent, weighs (r+1)^-skew), distinct within a
request. Without R, images are drawn as before (fresh synthetic ones, or at random from a
folder or URL list), and whether a request's images were all seen before is recorded either way:
`Turn.image_repeat` is always what happened in the workload, never just the intent.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class ImagePicker:
    """Hands out each request's image URLs and says whether they were all sent before."""

    def __init__(
        self,
        rng: random.Random,
        fresh: Callable[[], str],
        *,
        repeat_rate: float | None = None,
        skew: float = 1.0,
        pool: list[str] | None = None,
    ) -> None:
        self.rng = rng
        self.fresh = fresh
        self.repeat_rate = repeat_rate
        self.skew = skew
        self.pool = pool
        self._unsent = list(pool) if pool else []
        rng.shuffle(self._unsent)
        self.sent: list[str] = []
        self._sent_set: set[str] = set()
        self._weights: list[float] = []
        self.pool_exhausted = False

    def _new_image(self) -> str:
        if self.pool is None:
            return self.fresh()
        if not self._unsent:
            self.pool_exhausted = True  # a finite folder: "new" images start to repeat
            return self.rng.choice(self.pool)
        return self._unsent.pop()

    def _remember(self, url: str) -> None:
        if url not in self._sent_set:
            self._sent_set.add(url)
            self.sent.append(url)
            self._weights.append((len(self.sent)) ** -self.skew)

    def _repeats(self, count: int) -> list[str]:
        chosen: list[str] = []
        for _ in range(min(count, len(self.sent))):
            while True:
                url = self.rng.choices(self.sent, self._weights)[0]
                if url not in chosen:
                    break
            chosen.append(url)
        return chosen

    def pick(self, count: int) -> tuple[list[str], bool]:
        """`count` image URLs for one request, and whether every one of them was sent before."""
        if self.repeat_rate is not None and self.sent and count <= len(self.sent) and self.rng.random() < self.repeat_rate:
            urls = self._repeats(count)
        elif self.repeat_rate is None and self.pool is not None:
            urls = [self.rng.choice(self.pool) for _ in range(count)]
        else:
            urls = [self._new_image() for _ in range(count)]
        repeat = all(url in self._sent_set for url in urls)
        for url in urls:
            self._remember(url)
        return urls, repeat


def weighted_choice(rng: random.Random, mix: dict[int, float] | None, default: int) -> int:
    """A value from a {value: weight} mix, or `default` without one."""
    if not mix:
        return default
    values = list(mix)
    return rng.choices(values, [mix[value] for value in values])[0]
