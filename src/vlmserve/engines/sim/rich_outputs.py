"""SSE chunks and response bodies for a RichPlan (thinking, tool calls, JSON, logprobs, n>1), in vLLM's format.

Plain one-choice text keeps the pre-encoded fast path in `outputs`; a rich request is
rendered token by token from dicts here, since what a chunk holds depends on the token's
choice and channel:
- reasoning → `{"reasoning": t, "reasoning_content": t}` deltas (vLLM 0.32 names the field
  `reasoning`; `reasoning_content` is kept for clients written against earlier releases);
- content → `{"content": t}`;
- a tool call → first `{"tool_calls": [{"index": 0, "id", "type": "function", "function":
  {"name", "arguments": ""}}]}`, then `{"tool_calls": [{"index": 0, "function": {"arguments": chunk}}]}`;
- with n>1 every chunk carries one choice, with its `index`; role chunks for every choice
  open the stream, each choice's last token carries its finish_reason, and usage (summed
  over choices, the prompt counted once, as vLLM does) comes once at the end.

Logprobs are deterministic: the sampled token gets log(p) with p in [0.5, 0.99) from a hash
of its id and position (so it is always the most likely), and alternative i (i ≥ 1) gets
log((1 − p) / 2^i), so the probabilities of a position never sum above 1.
"""

from __future__ import annotations

import json
import math
import zlib

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.features import Features
from vlmserve.engines.sim.protocol import ParsedRequest
from vlmserve.engines.sim.rich_plan import Choice, RichPlan, Token
from vlmserve.json_types import JSONObject, JSONValue

_ALTERNATIVES = tokenizer.OUTPUT_PIECES


def _sse(payload: JSONObject) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def token_logprobs(token: Token, position: int, top: int) -> tuple[float, list[tuple[str, float]]]:
    """(logprob of the token, [(token, logprob)] of the `top` most likely ones, best first)."""
    digest = zlib.crc32(b"%d:%d" % (token.token_id, position))
    p = 0.5 + 0.49 * (digest % 10007) / 10007
    chosen = math.log(p)
    ranked = [(token.text, chosen)]
    step = 0
    while len(ranked) < top:
        step += 1
        text = _ALTERNATIVES[(digest + step * 7919) % len(_ALTERNATIVES)]
        if text == token.text or any(text == seen for seen, _ in ranked):
            continue
        ranked.append((text, math.log((1 - p) / 2 ** len(ranked))))
    return chosen, ranked[:top]


def _chat_logprob_entry(token: Token, position: int, top: int) -> JSONObject:
    chosen, ranked = token_logprobs(token, position, top)
    return {
        "token": token.text,
        "logprob": chosen,
        "bytes": list(token.text.encode()),
        "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode())} for text, value in ranked],
    }


class RichRenderer:
    """Renders one rich request's chunks (in scheduler-token order) and its final body."""

    def __init__(self, response_id: str, created: int, parsed: ParsedRequest, plan: RichPlan, features: Features) -> None:
        self.response_id = response_id
        self.created = created
        self.parsed = parsed
        self.plan = plan
        self.features = features
        self.chat = parsed.kind == "chat"
        self.object = "chat.completion.chunk" if self.chat else "text_completion"
        self._text_offsets = [len(parsed.echo_prompt or "")] * len(plan.choices)

    # -- usage -------------------------------------------------------------------------------
    def usage(self, completion_tokens: int) -> JSONObject:
        prompt_tokens = len(self.parsed.prompt_token_ids)
        usage: JSONObject = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }
        if self.features.thinking:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.plan.reasoning_tokens}
        return usage

    # -- streaming ---------------------------------------------------------------------------
    def chunk(self, index: int) -> bytes:
        """The SSE bytes that scheduler token `index` releases (possibly none)."""
        plan = self.plan
        choice_index, position, token = plan.token(index)
        choice = plan.choices[choice_index]
        events: list[bytes] = []
        if index == 0 and self.chat:
            for number in range(len(plan.choices)):
                events.append(_sse(self._payload(number, {"role": "assistant", "content": ""}, None, None)))
        last = position == len(choice.tokens) - 1
        finish = choice.finish_reason if last else None
        delta: JSONValue = self._delta(choice, token) if self.chat else token.text
        if delta is not None or finish is not None:
            if delta is None:
                delta = {}
            logprobs = self._chunk_logprobs(choice_index, token, position) if self.features.logprobs else None
            payload = self._payload(choice_index, delta, logprobs, finish)
            if self.parsed.continuous_usage:
                payload["usage"] = self.usage(index + 1)
            events.append(_sse(payload))
        if index == plan.num_tokens - 1:
            if self.parsed.include_usage:
                usage: JSONObject = {k: v for k, v in self.usage(plan.num_tokens).items() if v is not None}
                events.append(_sse({"id": self.response_id, "object": self.object, "created": self.created,
                                    "model": self.parsed.model, "choices": [], "usage": usage}))  # fmt: skip
            events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    def _delta(self, choice: Choice, token: Token) -> JSONObject | None:
        channel = token.channel
        if channel == "content":
            return {"content": token.text}
        if channel == "reasoning":
            if not self.features.include_reasoning:
                return None
            return {"reasoning": token.text, "reasoning_content": token.text}
        if channel == "tool":
            return {"tool_calls": [{"index": 0, "id": choice.tool_call_id, "type": "function",
                                    "function": {"name": token.text, "arguments": ""}}]}  # fmt: skip
        return {"tool_calls": [{"index": 0, "function": {"arguments": token.text}}]}

    def _chunk_logprobs(self, choice_index: int, token: Token, position: int) -> JSONObject:
        top = self.features.top_logprobs
        if self.chat:
            return {"content": [_chat_logprob_entry(token, position, top)]}
        chosen, ranked = token_logprobs(token, position, max(top, 1))
        offset = self._text_offsets[choice_index]
        self._text_offsets[choice_index] = offset + len(token.text)
        return {"text_offset": [offset], "token_logprobs": [chosen], "tokens": [token.text], "top_logprobs": [dict(ranked)]}

    def _payload(self, choice_index: int, delta: JSONValue, logprobs: JSONValue, finish: str | None) -> JSONObject:
        choice: JSONObject = {"index": choice_index}
        choice["delta" if self.chat else "text"] = delta
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        if finish is not None or not self.chat:
            choice["stop_reason"] = None
        return {"id": self.response_id, "object": self.object, "created": self.created, "model": self.parsed.model,
                "choices": [choice]}  # fmt: skip

    # -- whole response ----------------------------------------------------------------------
    def body(self) -> JSONObject:
        """The non-streaming JSON body."""
        choices: list[JSONValue] = [self._chat_choice(i, c) if self.chat else self._completion_choice(i, c)
                                    for i, c in enumerate(self.plan.choices)]  # fmt: skip
        return {
            "id": self.response_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.parsed.model,
            "choices": choices,
            "usage": self.usage(self.plan.num_tokens),
        }

    def _chat_choice(self, index: int, choice: Choice) -> JSONObject:
        content = choice.text("content")
        reasoning = choice.text("reasoning") if self.features.include_reasoning and choice.count("reasoning") else None
        tool_calls: list[JSONValue] = []
        if choice.tool is not None and choice.count("tool"):
            tool_calls.append({"id": choice.tool_call_id, "type": "function",
                               "function": {"name": choice.tool.name, "arguments": choice.text("args")}})  # fmt: skip
        has_content = choice.count("content") > 0
        message: JSONObject = {
            "role": "assistant",
            "content": content if has_content or not (tool_calls or self.features.thinking) else None,
            "refusal": None,
            "tool_calls": tool_calls,
            "reasoning": reasoning,
            "reasoning_content": reasoning,
        }
        logprobs: JSONObject | None = None
        if self.features.logprobs:
            top = self.features.top_logprobs
            logprobs = {"content": [_chat_logprob_entry(t, p, top) for p, t in enumerate(choice.tokens)]}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": choice.finish_reason,
                "stop_reason": None}  # fmt: skip

    def _completion_choice(self, index: int, choice: Choice) -> JSONObject:
        text = choice.text("content")
        prefix = self.parsed.echo_prompt or ""
        logprobs: JSONObject | None = None
        if self.features.logprobs:
            top = max(self.features.top_logprobs, 1)
            offsets: list[JSONValue] = []
            chosen_values: list[JSONValue] = []
            tops: list[JSONValue] = []
            offset = len(prefix)
            for position, token in enumerate(choice.tokens):
                chosen, ranked = token_logprobs(token, position, top)
                offsets.append(offset)
                offset += len(token.text)
                chosen_values.append(chosen)
                tops.append({text: value for text, value in ranked})
            logprobs = {"text_offset": offsets, "token_logprobs": chosen_values,
                        "tokens": [t.text for t in choice.tokens], "top_logprobs": tops}  # fmt: skip
        return {"index": index, "text": prefix + text, "logprobs": logprobs, "finish_reason": choice.finish_reason,
                "stop_reason": None}  # fmt: skip
