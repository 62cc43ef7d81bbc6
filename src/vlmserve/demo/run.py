"""`vlmserve demo`: the main job on the embedded default, end to end, in a few minutes.

Make (or reuse) the embedded tiny VLM, start it under the supervisor, send one text and one
image request (streamed, so time to first token is real), print answers with their timings
and token counts, and stop everything. It proves the whole path works on this machine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.table import Table

from vlmserve.deploy.processes import free_port_block
from vlmserve.deploy.readiness import image_message, tiny_png_data_url
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.spec import EMBEDDED_MODEL, DeploymentSpec, EngineArgs

TEXT_PROMPT = "Write one sentence about a dental clinic."
IMAGE_PROMPT = "What is in this picture?"


@dataclass
class DemoAnswer:
    """One request's outcome, with the timings the demo prints."""

    kind: str
    answer: str
    time_to_first_token_s: float | None
    end_to_end_s: float
    prompt_tokens: int | None
    completion_tokens: int | None


def stream_chat(base_url: str, model: str, messages: list[JSONObject], max_tokens: int, kind: str) -> DemoAnswer:
    """Send one streamed chat request; time the first content chunk and the last byte."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    pieces: list[str] = []
    usage: JSONObject = {}
    first_token_at: float | None = None
    sent_at = time.perf_counter()
    with httpx.Client(timeout=120, trust_env=False) as client:
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                reply.read()
                raise RuntimeError(f"{kind} request answered {reply.status_code}: {reply.text[:300]}")
            for line in reply.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if first_token_at is None:
                            first_token_at = time.perf_counter()
                        pieces.append(text)
    done_at = time.perf_counter()
    return DemoAnswer(
        kind=kind,
        answer="".join(pieces),
        time_to_first_token_s=(first_token_at - sent_at) if first_token_at else None,
        end_to_end_s=done_at - sent_at,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
    )


def demo_spec(
    model: str = EMBEDDED_MODEL, max_model_len: int = 2048, replicas: int = 1, *, name: str = "demo", **engine_args: JSONValue
) -> DeploymentSpec:
    """Replicas on free ports (behind the gateway when more than one): the smallest deployment that proves the path.

    The demo, the engine tests and the engine benchmarks all start it; `engine_args` adds
    vLLM flags (e.g. `enforce_eager=False`, `enable_prefix_caching=False`).
    """
    base = free_port_block(replicas + 1)
    return DeploymentSpec(
        name=name,
        model=model,
        replicas=replicas,
        port=base,
        gateway=replicas > 1,
        kv_cache_space_gb=1,
        engine_args=EngineArgs(max_model_len=max_model_len, **engine_args),
    )


def run_demo(console: Console, model: str = EMBEDDED_MODEL, max_tokens: int = 32, report: bool = False) -> list[DemoAnswer]:
    """Start, ask, print, stop. Returns the answers (the CLI prints them).

    With `report`, two replicas start behind the gateway and a short sweep (vlmserve.demo.sweep)
    runs against them before they stop; the HTML report's path is printed last.
    """
    spec = demo_spec(model, replicas=2 if report else 1)
    started = time.perf_counter()
    report_path = None
    console.print(
        f"[bold]vlmserve demo[/bold]: model [cyan]{model}[/cyan], {spec.replicas} replica(s) (vLLM), port {spec.port if report else spec.replica_ports()[0]}"
    )
    with Supervisor(spec, on_event=lambda line: console.print(f"  {line}")) as supervisor:
        ready_s = time.perf_counter() - started
        url = supervisor.endpoint
        name = supervisor.served_model_name
        answers = [
            stream_chat(url, name, [{"role": "user", "content": TEXT_PROMPT}], max_tokens, "text"),
            stream_chat(url, name, [image_message(IMAGE_PROMPT, tiny_png_data_url(seed=7))], max_tokens, "image"),
        ]
        served = supervisor.replicas[0].served
        if report:
            console.print(answers_table(answers))
            from vlmserve.demo.sweep import sweep_running_deployment

            report_path = sweep_running_deployment(url, name, spec, console, tokenizer=supervisor.model_path)
    if not report:
        console.print(answers_table(answers))
    if model == EMBEDDED_MODEL:
        console.print(
            "[dim]The embedded model has random weights: its words are gibberish by design; "
            "timings, token counts and the image path are real.[/dim]"
        )
    engine = f"vLLM {served.engine_version}" if served and served.engine_version else "vLLM"
    console.print(
        f"{engine}, max_model_len {served.max_model_len if served else '?'}; ready after {ready_s:.0f} s; "
        f"all processes stopped; total {time.perf_counter() - started:.0f} s"
    )
    if report_path is not None:
        console.print(f"HTML report: {report_path}")
    return answers


def answers_table(answers: list[DemoAnswer]) -> Table:
    table = Table(title="Answers (streamed; TTFT = first content chunk, E2E = last byte)")
    table.add_column("request")
    table.add_column("answer", max_width=48, overflow="fold")
    table.add_column("TTFT ms", justify="right")
    table.add_column("E2E ms", justify="right")
    table.add_column("prompt tok", justify="right")
    table.add_column("completion tok", justify="right")
    for answer in answers:
        table.add_row(
            answer.kind,
            _shorten(answer.answer.replace("\n", " ").strip(), 90),
            f"{answer.time_to_first_token_s * 1000:.0f}" if answer.time_to_first_token_s is not None else "-",
            f"{answer.end_to_end_s * 1000:.0f}",
            str(answer.prompt_tokens if answer.prompt_tokens is not None else "-"),
            str(answer.completion_tokens if answer.completion_tokens is not None else "-"),
        )
    return table


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _count(value: JSONValue) -> int | None:
    """A token count from the usage block; None when the server sent none (or not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
