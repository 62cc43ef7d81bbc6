"""Decide up front the tokens of a request that uses thinking, tools, structured output, logprobs or n>1.

Like `generation.plan_output`, the whole answer is known when the request arrives and the
scheduler only decides when each token comes out; here every token also carries the
*channel* it belongs to, which is what the renderer (`rich_outputs`) needs:
- "reasoning": thinking text (pseudo-words, length drawn from the output-length
  distribution × the reasoning_effort multiplier), before the answer;
- "content": the answer: pseudo-words, or the schema-valid JSON text cut into the sim
  tokenizer's pieces (so its token count is the JSON's count under that tokenizer);
- "tool": the header of a tool call (the function name, counted as one token), then
  "args": the arguments' JSON pieces.

Reasoning tokens are ordinary output tokens: they count against max_tokens, take decode steps
and are billed in completion_tokens. A choice cut by max_tokens ends with finish_reason
"length" wherever it is (in the thinking, or in the middle of the JSON, as vLLM does).

n>1: vLLM runs n sequences that share the prompt; the sim engine models them as ONE
scheduler request whose output is the n choices' tokens interleaved round-robin
(token k belongs to the choice whose turn it is). The token count, KV growth and prompt
reuse are right; the n sequences decode one after another instead of side by side, so an
n>1 request's decode time is about n times vLLM's. Each choice is capped at
(max_model_len − prompt) // n tokens so the one sequence fits the context.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.features import Features, Tool
from vlmserve.engines.sim.generation import OutputPlan
from vlmserve.engines.sim.options import OutputLengthDistribution
from vlmserve.engines.sim.protocol import ParsedRequest

AUTO_TOOL_CALL_SHARE = 0.5
"""With tool_choice "auto", the share of choices that call a tool (drawn from the request's seeded rng)."""


@dataclass(frozen=True)
class Token:
    channel: str
    """'reasoning', 'content', 'tool' (a tool call's header: its name) or 'args'."""
    text: str
    token_id: int


@dataclass
class Choice:
    """One of the n answers."""

    tokens: list[Token]
    finish_reason: str
    """As the API reports it: 'stop', 'length' or 'tool_calls'."""
    tool: Tool | None = None
    tool_call_id: str | None = None

    def text(self, channel: str) -> str:
        return "".join(token.text for token in self.tokens if token.channel == channel)

    def count(self, channel: str) -> int:
        return sum(1 for token in self.tokens if token.channel == channel)


@dataclass
class RichPlan(OutputPlan):
    """An OutputPlan whose tokens are listed explicitly, with their choice and channel."""

    choices: list[Choice] = field(default_factory=list)
    order: list[tuple[int, int]] = field(default_factory=list)
    """Scheduler token k → (choice index, position in that choice)."""

    def token(self, index: int) -> tuple[int, int, Token]:
        choice, position = self.order[index]
        return choice, position, self.choices[choice].tokens[position]

    def piece(self, index: int) -> str:
        return self.token(index)[2].text

    def token_id(self, index: int) -> int:
        return self.token(index)[2].token_id

    @property
    def reasoning_tokens(self) -> int:
        return sum(choice.count("reasoning") for choice in self.choices)


def _text_tokens(channel: str, count: int, rng: random.Random) -> list[Token]:
    """`count` pseudo-word tokens from the shared table (as plain answers are made)."""
    source = OutputPlan(num_tokens=count, finish_reason="stop", offset=rng.getrandbits(16), stride=rng.getrandbits(16) | 1)
    return [Token(channel, source.piece(index), source.token_id(index)) for index in range(count)]


def _json_tokens(channel: str, text: str) -> list[Token]:
    """The sim tokenizer's pieces of `text` (they join back to exactly `text`)."""
    return [Token(channel, piece, tokenizer.encode(piece)[0]) for piece in tokenizer.tokenize_pieces(text)]


def plan_rich_output(
    request: ParsedRequest, features: Features, distribution: OutputLengthDistribution, rng: random.Random, max_model_len: int
) -> RichPlan:
    """Draw every choice's tokens (deterministic for a given rng state)."""
    prompt_len = len(request.prompt_token_ids)
    cap = max(1, min(request.max_tokens, (max_model_len - prompt_len) // features.n))
    choices = [_plan_choice(request, features, distribution, rng, cap) for _ in range(features.n)]
    order = [(index, position) for position in range(max(len(c.tokens) for c in choices))
             for index, c in enumerate(choices) if position < len(c.tokens)]  # fmt: skip
    engine_reason = "length" if any(c.finish_reason == "length" for c in choices) else "stop"
    return RichPlan(num_tokens=len(order), finish_reason=engine_reason, choices=choices, order=order)


def _plan_choice(
    request: ParsedRequest, features: Features, distribution: OutputLengthDistribution, rng: random.Random, cap: int
) -> Choice:
    tokens: list[Token] = []
    if features.thinking:
        reasoning = max(1, round(max(distribution.sample(rng), 1) * features.reasoning_scale))
        tokens += _text_tokens("reasoning", reasoning, rng)
    tool = _pick_tool(features, rng)
    tool_call_id = None
    if tool is not None:
        tool_call_id = f"chatcmpl-tool-{rng.getrandbits(128):032x}"
        tokens.append(Token("tool", tool.name, tokenizer.encode(tool.name)[0]))
        tokens += _json_tokens("args", tool.arguments)
        complete_reason = "tool_calls"
    elif features.json_text is not None:
        tokens += _json_tokens("content", features.json_text)
        complete_reason = "stop"
    else:
        used = len(tokens)
        if request.ignore_eos:
            answer = max(1, cap - used)
        else:
            answer = max(distribution.sample(rng), request.min_tokens - used, 1)
        tokens += _text_tokens("content", min(answer, max(1, cap - used)), rng)
        complete_reason = "length" if request.ignore_eos or used + answer >= cap else "stop"
    if len(tokens) > cap:
        return Choice(tokens[:cap], "length", tool, tool_call_id)
    return Choice(tokens, complete_reason, tool, tool_call_id)


def _pick_tool(features: Features, rng: random.Random) -> Tool | None:
    if features.tool_choice == "named":
        return features.named_tool
    if features.tool_choice == "required":
        return features.tools[rng.randrange(len(features.tools))]
    if features.tool_choice == "auto" and rng.random() < AUTO_TOOL_CALL_SHARE:
        return features.tools[rng.randrange(len(features.tools))]
    return None
