"""sharegpt: real conversations from a ShareGPT-format JSON file, read as a stream.

Real files are messy, so reading never crashes: every complete conversation is used,
the rest are skipped with a counted reason (empty, no user turn, huge message, a
truncated or unparseable tail), and one line says what happened. Multi-turn modes:
`first` sends only the first user turn; `dataset` and `live` send every turn, with the
dataset's replies or the live answers as history (the worker builds the live history).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import BinaryIO, Iterator

import ijson

from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext, require_dataset_file
from vlmserve.bounded_read import DATASET_ITEM, too_deep, too_long, too_many
from vlmserve.errors import UserError

MAX_MESSAGE_CHARS = 200_000
"""Messages longer than this are skipped: no chat model serves them and they bloat memory."""

READ_CHUNK = 64 << 10
"""Bytes ijson reads at a time."""

_START_EVENTS = frozenset({"start_map", "start_array"})
_END_EVENTS = frozenset({"end_map", "end_array"})

USER_ROLES = {"human", "user"}
ASSISTANT_ROLES = {"gpt", "assistant", "chatgpt", "bard", "model", "bing"}
SYSTEM_ROLES = {"system"}


class SkipConversation(Exception):
    """A conversation that cannot be replayed; the message is the counted reason."""


def _turns_of(item: object) -> tuple[str | None, list[tuple[str, str | None]]]:
    """(system prompt, [(user text, reference reply or None)]) of one ShareGPT item."""
    if not isinstance(item, dict):
        raise SkipConversation("not an object")
    messages = item.get("conversations", item.get("conversation"))
    if not isinstance(messages, list):
        raise SkipConversation("no 'conversations' list")
    if not messages:
        raise SkipConversation("empty conversation")
    system: str | None = None
    pairs: list[tuple[str, str | None]] = []
    pending_user: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise SkipConversation("malformed message")
        role = str(message.get("from", message.get("role", ""))).lower()
        value = message.get("value", message.get("content"))
        if not isinstance(value, str):
            raise SkipConversation("malformed message")
        if len(value) > MAX_MESSAGE_CHARS:
            raise SkipConversation("message too long")
        if role in SYSTEM_ROLES:
            system = value if system is None else f"{system}\n{value}"
        elif role in USER_ROLES:
            pending_user.append(value)
        elif role in ASSISTANT_ROLES:
            if pending_user:  # a reply before any question (odd start) is dropped
                pairs.append(("\n".join(pending_user), value))
                pending_user = []
        else:
            raise SkipConversation("unknown speaker")
    if pending_user:  # odd turn count: a last question without a reference reply
        pairs.append(("\n".join(pending_user), None))
    pairs = [(user, reply) for user, reply in pairs if user.strip()]
    if not pairs:
        raise SkipConversation("no user turn")
    return system, pairs


class _MeteredFile:
    """The dataset file as ijson reads it, counting the bytes read since the last conversation
    ended: one conversation (one huge string included, which the parser holds whole) is refused
    once it passes the per-conversation byte limit, not after memory runs out."""

    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self.handle = handle
        self.path = path
        self.since_item = 0

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.since_item += len(data)
        if self.since_item > DATASET_ITEM.max_bytes + READ_CHUNK:
            raise UserError(
                f"{self.path}: a conversation {too_long(DATASET_ITEM)}; "
                "not a ShareGPT file, or a damaged one: check --dataset-path"
            )
        return data


_MORE = object()
"""`_ConversationBuilder.feed`'s answer while no conversation is complete."""
_END = object()
"""`_ConversationBuilder.feed`'s answer when the top-level array closes."""


class _ConversationBuilder:
    """Rebuilds each top-level array element from ijson's flat events, one container per open level.

    Our own depth count, not `ijson.items`: its prefix strings made memory grow with the square
    of the nesting (23.6 GB for a 200 KB file of 100,000 brackets). Values and depth per
    conversation are bounded by `bounded_read.DATASET_ITEM`.
    """

    __slots__ = ("path", "open_values", "keys", "started", "values", "completed", "max_items")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.open_values: list[dict[object, object] | list[object]] = []
        """The containers being built, outermost first (a conversation's depth)."""
        self.keys: list[object] = []
        """The pending key of each open object (None for a list)."""
        self.started = False
        """Whether the top-level array has opened (the head check guarantees it is an array)."""
        self.values = 0
        """Events of the conversation being built."""
        self.completed = 0
        """Conversations finished so far."""
        self.max_items = DATASET_ITEM.max_items

    def feed(self, event: str, value: object) -> object:
        """Take one parser event: the finished conversation, else `_MORE`, or `_END` at the array's end."""
        self.values += 1
        if self.values > self.max_items:
            raise UserError(
                f"{self.path}: conversation {self.completed + 1} {too_many(self.values, DATASET_ITEM)}; check --dataset-path"
            )
        if event == "map_key":
            self.keys[-1] = value
            return _MORE
        if event in _END_EVENTS:
            if not self.open_values:
                return _END  # the end of the top-level array
            closed = self.open_values.pop()
            self.keys.pop()
            return _MORE if self.open_values else self._complete(closed)
        if event in _START_EVENTS:
            return self._open(event)
        open_values = self.open_values
        if not open_values:
            return self._complete(value)  # a bare scalar: skipped later, counted
        parent = open_values[-1]  # a scalar inside the conversation (most events): attached inline
        if isinstance(parent, dict):
            parent[self.keys[-1]] = value
        else:
            parent.append(value)
        return _MORE

    def _open(self, event: str) -> object:
        """Start a container inside the open one (or a new conversation), refusing one too deep."""
        if not self.started:  # the top-level array itself
            self.started, self.values = True, 0
            return _MORE
        container: dict[object, object] | list[object] = {} if event == "start_map" else []
        self._attach(container)
        if len(self.open_values) >= DATASET_ITEM.max_depth:
            raise UserError(
                f"{self.path}: conversation {self.completed + 1} {too_deep(DATASET_ITEM)}; "
                "a ShareGPT conversation nests 3 levels: check --dataset-path"
            )
        self.open_values.append(container)
        self.keys.append(None)
        return _MORE

    def _attach(self, value: object) -> None:
        """Put a value into the innermost open container (under its pending key for an object)."""
        if self.open_values:
            parent = self.open_values[-1]
            if isinstance(parent, dict):
                parent[self.keys[-1]] = value
            else:
                parent.append(value)

    def _complete(self, conversation: object) -> object:
        """Count a finished conversation and start the next one's value budget."""
        self.completed += 1
        self.values = 0
        return conversation


def _stream_items(path: Path, skips: Counter[str]) -> Iterator[tuple[int, object]]:
    """Each top-level array element, stopping quietly (but counted) at a broken tail.

    A stream (not json.load) so a large file costs one conversation of memory; nesting, values
    and bytes per conversation are bounded by `bounded_read.DATASET_ITEM`, and a file over them
    is one error naming the file and the limit.
    """
    with path.open("rb") as handle:
        head = handle.read(1024).lstrip()
        if not head.startswith(b"["):
            raise UserError(f"{path}: not a ShareGPT file (expected a JSON array of conversations); check --dataset-path")
        handle.seek(0)
        metered = _MeteredFile(handle, path)
        builder = _ConversationBuilder(path)
        feed = builder.feed
        try:
            for event, value in ijson.basic_parse(metered, use_float=True, buf_size=READ_CHUNK):
                conversation = feed(event, value)
                if conversation is _MORE:
                    continue
                if conversation is _END:
                    break
                metered.since_item = 0
                yield builder.completed - 1, conversation
        except ijson.IncompleteJSONError:
            skips["truncated at end of file"] += 1
        except ijson.JSONError:
            skips[f"unparseable after conversation {builder.completed}"] += 1


def read_conversations(
    path_text: str, limit: int | None = None
) -> tuple[list[tuple[str, str | None, list[tuple[str, str | None]]]], Counter[str]]:
    """Up to `limit` replayable conversations (id, system, turns) and the skip counts."""
    path = require_dataset_file(path_text, "sharegpt")
    skips: Counter[str] = Counter()
    loaded: list[tuple[str, str | None, list[tuple[str, str | None]]]] = []
    for index, item in _stream_items(path, skips):
        try:
            system, pairs = _turns_of(item)
        except SkipConversation as reason:
            skips[str(reason)] += 1
            continue
        conversation_id = str(item.get("id", index)) if isinstance(item, dict) else str(index)
        loaded.append((conversation_id, system, pairs))
        if limit is not None and len(loaded) >= limit:
            break
    return loaded, skips


def describe(path: str, loaded: int, skips: Counter[str]) -> str:
    """The one line the user sees about what was read."""
    if not skips:
        return f"sharegpt: loaded {loaded} conversations from {path}"
    reasons = ", ".join(f"{count} {reason}" for reason, count in skips.most_common())
    return f"sharegpt: loaded {loaded} conversations from {path}; skipped {sum(skips.values())} ({reasons})"


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    load = context.load
    assert load.dataset_path is not None  # LoadSpec guarantees it for sharegpt
    loaded, skips = read_conversations(load.dataset_path, limit=count)
    context.notices.append(describe(load.dataset_path, len(loaded), skips))
    if not loaded:
        raise UserError(
            f"--dataset-path {load.dataset_path}: no usable conversation in the file ({describe(load.dataset_path, 0, skips)})"
        )
    conversations: list[Conversation] = []
    for index in range(count):
        conversation_id, system, pairs = loaded[index % len(loaded)]
        if index >= len(loaded):
            conversation_id = f"{conversation_id}#{index // len(loaded) + 1}"
        if load.multi_turn == "first":
            pairs = pairs[:1]
        turns = [_turn(context, user, reply) for user, reply in pairs]
        conversations.append(Conversation(conversation_id, "sharegpt", turns, system=system))
    return conversations


def _turn(context: WorkloadContext, user: str, reply: str | None) -> Turn:
    load = context.load
    if reply is not None and not load.fixed_output_len:
        max_tokens = max(context.counter.count_text(reply), 1)
    else:
        max_tokens = load.output_len
    return Turn(
        content=user,
        max_tokens=max_tokens,
        requested_output_tokens=max_tokens if load.ignore_eos else None,
        reference_reply=reply,
    )
