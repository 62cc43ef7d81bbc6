"""Counting tokens the way the server will: a local tokenizer, the server's /tokenize, or words.

Exact prompt lengths need the model's own tokenizer. A local one (a path, or a name in
the Hugging Face cache, never downloaded) is fastest; a vLLM server's /tokenize is the
fallback and also counts the chat template. Without either, words stand in and every
output that mentions lengths says they are approximate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import httpx

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject, JSONValue

Messages = list[JSONObject]


class TokenCounter(Protocol):
    """Counts prompt tokens as the server sees them (template included) and answer tokens."""

    exact: bool
    source: str

    def count_prompt(self, api: str, text: str, messages: Messages | None) -> int: ...

    def count_text(self, text: str) -> int: ...


class WordCounter:
    """Approximation used when no tokenizer is reachable: one token per word."""

    exact = False
    source = "words (approximate)"

    def count_prompt(self, api: str, text: str, messages: Messages | None) -> int:
        return max(len(text.split()), 1)

    def count_text(self, text: str) -> int:
        return len(text.split())


class LocalTokenizerCounter:
    """The model's tokenizer loaded from a local path or the local Hugging Face cache."""

    exact = True

    def __init__(self, name_or_path: str) -> None:
        if not _locally_available(name_or_path):
            raise UserError(
                f"--tokenizer {name_or_path}: no such directory and not in the local Hugging Face cache; "
                "give a local model directory"
            )
        try:
            from transformers import AutoTokenizer  # heavy; only when asked for
            from transformers.utils import logging as transformers_logging
        except ImportError:  # pragma: no cover - transformers ships with the cpu extra
            raise UserError("--tokenizer needs the 'transformers' package; pip install transformers") from None
        # Loading a tokenizer builds the model's config too, and some configs (Idefics3's defaults)
        # warn about fields a tokenizer never uses; keep the bench's console for what matters.
        transformers_logging.set_verbosity_error()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        except Exception as err:  # transformers raises many types for a bad path
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UserError(
                f"--tokenizer {name_or_path}: cannot load a tokenizer from it ({first[:160]}); give a local model directory"
            ) from None
        self.source = f"tokenizer {name_or_path}"

    def count_prompt(self, api: str, text: str, messages: Messages | None) -> int:
        if api == "chat" and messages is not None and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(_text_only(messages), tokenize=True, add_generation_prompt=True)
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            return len(ids)
        return len(self.tokenizer.encode(text))

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


class ServerTokenCounter:
    """A vLLM-compatible server's POST /tokenize (counts the chat template too)."""

    exact = True

    def __init__(self, base_url: str, model: str, headers: dict[str, str] | None = None) -> None:
        self.url = f"{base_url}/tokenize"
        self.model = model
        self.client = httpx.Client(timeout=30.0, headers=headers or {})
        self.source = f"server {self.url}"

    def _count(self, body: JSONObject) -> int:
        """One /tokenize call; every failure is a one-line UserError (the server may be gone)."""
        try:
            response = self.client.post(self.url, json={"model": self.model, **body})
        except httpx.HTTPError as err:
            raise UserError(
                f"cannot reach {self.url} ({type(err).__name__}); is the server still running? or pass --tokenizer PATH"
            ) from None
        if response.status_code != 200:
            raise UserError(f"{self.url} answered HTTP {response.status_code}; pass --tokenizer PATH instead")
        try:
            return int(response.json()["count"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{self.url} did not return a token count; pass --tokenizer PATH instead") from None

    def count_prompt(self, api: str, text: str, messages: Messages | None) -> int:
        if api == "chat" and messages is not None:
            cleaned: list[JSONValue] = list(_text_only(messages))
            return self._count({"messages": cleaned, "add_generation_prompt": True})
        return self._count({"prompt": text})

    def count_text(self, text: str) -> int:
        return self._count({"prompt": text, "add_special_tokens": False})

    @classmethod
    def probe(cls, base_url: str, model: str, headers: dict[str, str] | None = None) -> "ServerTokenCounter | None":
        """The server's tokenizer if it offers /tokenize, else None."""
        counter = cls(base_url, model, headers)
        try:
            counter._count({"prompt": "hello"})
        except UserError:
            counter.client.close()
            return None
        return counter


def _locally_available(name_or_path: str) -> bool:
    """A directory, or a model name already in the Hugging Face cache (nothing is downloaded)."""
    if Path(name_or_path).expanduser().is_dir():
        return True
    cache = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    )
    return (cache / f"models--{name_or_path.replace('/', '--')}").is_dir()


def _text_only(messages: Messages) -> Messages:
    """Messages with image parts dropped: prompt fitting sizes the text, images add on top."""
    cleaned: Messages = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            text = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
            )
            cleaned.append({**message, "content": text})
        else:
            cleaned.append(message)
    return cleaned


def choose_counter(tokenizer: str | None, base_url: str, model: str, headers: dict[str, str] | None = None) -> TokenCounter:
    """--tokenizer when given, else the server's /tokenize, else words (approximate)."""
    if tokenizer:
        return LocalTokenizerCounter(tokenizer)
    server = ServerTokenCounter.probe(base_url, model, headers)
    return server if server is not None else WordCounter()
