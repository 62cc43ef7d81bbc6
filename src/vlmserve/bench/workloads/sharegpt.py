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

_TOP = object()
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
            raise UserError(f"{self.path}: a conversation {too_long(DATASET_ITEM)}; "
                            "not a ShareGPT file, or a damaged one: check --dataset-path")
        return data


def _stream_items(path: Path, skips: Counter[str]) -> Iterator[tuple[int, object]]:
    """Each top-level array element, stopping quietly (but counted) at a broken tail.

    Built from ijson's flat event stream with our own depth count, not `ijson.items`: its
    prefix strings made memory grow with the square of the nesting (23.6 GB for a 200 KB file
    of 100,000 brackets). Nesting, values and bytes per conversation are bounded by
    `bounded_read.DATASET_ITEM`; a file over them is one error naming the file and the limit.
    """
    with path.open("rb") as handle:
        head = handle.read(1024).lstrip()
        if not head.startswith(b"["):
            raise UserError(
                f"{path}: not a ShareGPT file (expected a JSON array of conversations); check --dataset-path"
            )
        handle.seek(0)
        metered = _MeteredFile(handle, path)
        index = -1
        values = 0  # events of the conversation being built
        open_values: list[dict[object, object] | list[object]] = []  # the containers being built, outermost first (a conversation's depth)
        keys: list[object] = []  # the pending key of each open object (None for a list)
        item: object = None
        max_values, max_depth = DATASET_ITEM.max_items, DATASET_ITEM.max_depth
        try:
            for event, value in ijson.basic_parse(metered, use_float=True, buf_size=READ_CHUNK):
                values += 1
                if values > max_values:
                    raise UserError(f"{path}: conversation {index + 2} {too_many(values, DATASET_ITEM)}; "
                                    "check --dataset-path")
                if event == "map_key":
                    keys[-1] = value
                    continue
                if event in _END_EVENTS:
                    if not open_values:
                        break  # the end of the top-level array
                    open_values.pop()
                    keys.pop()
                else:
                    if event in _START_EVENTS:
                        if item is None and not keys:  # the top-level array itself (checked by the head above)
                            item, values = _TOP, 0
                            continue
                        value = {} if event == "start_map" else []
                    if open_values:
                        parent = open_values[-1]
                        if isinstance(parent, dict):
                            parent[keys[-1]] = value
                        else:
                            parent.append(value)
                    if event in _START_EVENTS:
                        if len(open_values) >= max_depth:
                            raise UserError(f"{path}: conversation {index + 2} {too_deep(DATASET_ITEM)}; "
                                            "a ShareGPT conversation nests 3 levels: check --dataset-path")
                        if not open_values:
                            finished = value
                        open_values.append(value)
                        keys.append(None)
                        continue
                    if len(open_values) == 0:
                        finished = value  # a scalar conversation (skipped later, counted)
                if not open_values:  # a conversation is complete
                    index += 1
                    values = 0
                    metered.since_item = 0
                    yield index, finished
        except ijson.IncompleteJSONError:
            skips["truncated at end of file"] += 1
        except ijson.JSONError:
            skips[f"unparseable after conversation {index + 1}"] += 1


def read_conversations(path_text: str, limit: int | None = None) -> tuple[list[tuple[str, str | None, list[tuple[str, str | None]]]], Counter[str]]:
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
        raise UserError(f"--dataset-path {load.dataset_path}: no usable conversation in the file ({describe(load.dataset_path, 0, skips)})")
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
