"""The simulated engine's HTTP server: vLLM's OpenAI-compatible surface on aiohttp.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /version, POST /tokenize, GET /metrics, GET /debug/timing (emission timing error;
`?reset=1` clears it), GET /debug/state.

Run it with `vlmserve engine sim ...` (the CLI calls `run_server`), inside an
asyncio program with `start_server`, or in a background thread with `SimEngineThread`
(for in-process tests).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import socket
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable

from aiohttp import web

from vlmserve import __version__
from vlmserve.engines.sim import SIM_ENGINE_NAME
from vlmserve.engines.sim.engine_loop import EngineLoop
from vlmserve.engines.sim.features import check_combinations, parse_features
from vlmserve.engines.sim.generation import OutputPlan, plan_output
from vlmserve.engines.sim.metrics import EngineMetrics
from vlmserve.engines.sim.options import SimEngineConfig, build_engine_core
from vlmserve.engines.sim.outputs import ActiveRequest
from vlmserve.engines.sim.protocol import (
    ApiError,
    ImageValidator,
    ParsedRequest,
    bad_request,
    decode_json_body,
    parse_generation_request,
)
from vlmserve.engines.sim.rich_plan import plan_rich_output
from vlmserve.engines.sim.timing import EmissionTimingRecorder
from vlmserve.engines.sim.trace import EmissionTrace
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.quiet_gc import quiet_garbage_collector
from vlmserve.sched.frontend import Frontend

_STATUS_TYPES = {
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
CRASH_EXIT_CODE = 3


def error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


class SimEngine:
    """One simulated engine: configuration, scheduler loop, metrics and request handlers."""

    def __init__(self, config: SimEngineConfig) -> None:
        config.validate()
        self.config = config
        self.metrics = EngineMetrics(config.model_names[0])
        self.timing = EmissionTimingRecorder() if config.record_timing else None
        self.core = build_engine_core(config)
        self.loop: EngineLoop | None = None
        self.images = ImageValidator(estimator=config.image_estimator())
        self.frontend = Frontend(config.frontend_config())
        self.started_s = time.monotonic()
        self.ready_at_s = self.started_s + config.faults.startup_delay_s
        self.request_counter = 0
        self.answer_keys_in_flight: dict[str, tuple[str | int, int]] = {}
        """Request id → (answer key, prompt length) of every request being served (what
        --swap-answer-rate draws from)."""
        self.api_requests = 0
        self.fault_rng = random.Random(f"faults:{config.seed}")
        self.id_prefix = f"{random.Random(f'ids:{config.seed}').getrandbits(48):012x}"

    # -- app ---------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._api(self.chat_completions))
        app.router.add_post("/v1/completions", self._api(self.completions))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self._api(self.tokenize, count=False))
        app.router.add_get("/metrics", self.prometheus_metrics)
        app.router.add_get("/debug/timing", self.debug_timing)
        app.router.add_get("/debug/state", self.debug_state)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        trace = EmissionTrace(self.config.trace_file) if self.config.trace_file else None
        self.loop = EngineLoop(self.core, self.metrics, self.timing, trace=trace)
        self.loop.lora_modules = frozenset(self.config.lora_modules)
        self.loop.start()
        self.started_s = time.monotonic()
        self.ready_at_s = self.started_s + self.config.faults.startup_delay_s

    async def _on_shutdown(self, _app: web.Application) -> None:
        if self.loop is not None:
            await self.loop.stop()

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at_s

    def _api(
        self, handler: Callable[[web.Request, JSONValue], Awaitable[web.StreamResponse]], count: bool = True
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """Wrap an API handler: readiness, injected faults, JSON parsing, OpenAI-format errors.

        Every answer is JSON: a bug surfacing as an exception is a 500 in OpenAI format
        (its traceback goes to stderr), never aiohttp's plain-text page.
        """

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                if not self.ready:
                    raise ApiError(503, "The engine is starting up; retry shortly.", "ServiceUnavailableError")
                if count:
                    self._count_and_maybe_crash()
                    self._maybe_inject_error()
                raw = await request.read()
                if count:
                    self._maybe_poisoned(raw)
                body = decode_json_body(raw)
                return await handler(request, body)
            except ApiError as err:
                return error_response(err)
            except web.HTTPException:
                raise  # aiohttp's own answers (413 for an oversized body)
            except Exception:  # noqa: BLE001 - a bug; the client still gets OpenAI-format JSON
                traceback.print_exc(file=sys.stderr)
                return error_response(ApiError(500, "internal error in the sim engine; see its log", "InternalServerError"))

        return wrapped

    def _count_and_maybe_crash(self) -> None:
        self.api_requests += 1
        crash_after = self.config.faults.crash_after
        if crash_after is not None and self.api_requests > crash_after:
            print(f"sim engine: injected crash after {crash_after} requests", file=sys.stderr, flush=True)
            os._exit(CRASH_EXIT_CODE)
        freeze_after = self.config.faults.freeze_after
        if freeze_after is not None and self.api_requests == freeze_after + 1 and self.loop is not None:
            print(f"sim engine: injected freeze of the engine loop after {freeze_after} requests", file=sys.stderr, flush=True)
            self.loop.freeze()

    def _maybe_inject_error(self) -> None:
        faults = self.config.faults
        if faults.error_rate > 0 and self.fault_rng.random() < faults.error_rate:
            status = self.fault_rng.choice(faults.error_codes)
            raise ApiError(status, f"injected fault: HTTP {status}", _STATUS_TYPES.get(status, "InternalServerError"))

    def _maybe_poisoned(self, raw: bytes) -> None:
        """A request carrying the poison marker fails on every engine: the request's fault, not the replica's."""
        marker = self.config.faults.poison_marker
        if marker and marker.encode() in raw:
            raise ApiError(500, "injected fault: poisoned request (HTTP 500)", "InternalServerError")

    # -- generation --------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request, body: JSONValue) -> web.StreamResponse:
        return await self._generate(request, body, "chat")

    async def completions(self, request: web.Request, body: JSONValue) -> web.StreamResponse:
        return await self._generate(request, body, "completion")

    def _answer_key(self, parsed: ParsedRequest) -> str | int:
        """What a request's answer is drawn from. With a `seed`, the seed; at temperature 0, the
        model and the prompt's token ids (images included, through their content digests), so a
        greedy answer is a function of the prompt as in vLLM, the same on every replica whatever
        its --seed; otherwise the request's arrival number."""
        if parsed.seed is not None:
            return f"{self.config.seed}:request-seed:{parsed.seed}"
        if parsed.temperature == 0:
            digest = hashlib.blake2b(digest_size=16)
            for token_id in parsed.prompt_token_ids:
                digest.update(token_id.to_bytes(8, "little"))
            return f"greedy:{self.config.model}:{digest.hexdigest()}"
        return self.config.seed * 1_000_003 + self.request_counter

    def _maybe_swap_answer(self, own_key: str | int, prompt_len: int) -> str | int:
        """Fault (--swap-answer-rate): take the answer of another request in flight, as a batching
        or cache bug would; a request alone always gets its own. A request of the same prompt
        length is preferred (rows of one shape get mixed up; so do images of one size, whose
        requests differ only in content)."""
        rate = self.config.faults.swap_answer_rate
        others = [(key, length) for key, length in self.answer_keys_in_flight.values() if key != own_key]
        if rate <= 0 or not others or self.fault_rng.random() >= rate:
            return own_key
        same_shape = [key for key, length in others if length == prompt_len]
        return self.fault_rng.choice(same_shape or [key for key, _ in others])

    async def _generate(self, request: web.Request, body: JSONValue, kind: str) -> web.StreamResponse:
        parsed = parse_generation_request(body, kind, self.config, self.images)
        assert isinstance(body, dict)  # parse_generation_request refused any other body
        features = parse_features(body, kind)
        check_combinations(features, body)
        self.request_counter += 1
        own_key = self._answer_key(parsed)
        rng = random.Random(self._maybe_swap_answer(own_key, len(parsed.prompt_token_ids)))
        plan: OutputPlan
        if features.rich:
            parsed.features = features
            plan = plan_rich_output(parsed, features, self.config.output_len, rng, self.config.max_model_len)
        else:
            plan = plan_output(parsed, self.config.output_len, rng)
        request_id = f"{self.id_prefix}-{self.request_counter}"
        response_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + request_id
        assert self.loop is not None
        active = ActiveRequest(request_id, response_id, parsed, plan, arrival_s=self.loop.clock())
        active.client_request_id = request.headers.get("X-Request-ID")
        self.answer_keys_in_flight[request_id] = (own_key, len(parsed.prompt_token_ids))
        try:
            return await self._run(request, active)
        finally:
            del self.answer_keys_in_flight[request_id]

    async def _run(self, request: web.Request, active: ActiveRequest) -> web.StreamResponse:
        """Preprocess, schedule and answer one planned request (streamed or whole)."""
        parsed, request_id = active.parsed, active.request_id
        assert self.loop is not None
        await self._preprocess(active)
        self._assign_stream_faults(active)
        response: web.StreamResponse | None = None
        if parsed.stream:
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            response.enable_chunked_encoding()
            try:
                await response.prepare(request)
                _send_headers_now(response)
            except ConnectionResetError:  # the client left before we answered
                return response
            transport = request.transport
            if transport is None or transport.is_closing():
                return response
            active.attach_stream(transport)
        try:
            self.loop.submit(active)
        except ValueError as err:
            if response is not None:
                return response
            raise bad_request(str(err)) from None
        try:
            outcome = await active.done
        finally:
            if not active.done.done() or active.finish_reason is None:
                self.loop.abort(request_id)
        if response is None:
            if outcome != "finished":
                raise ApiError(503, "The request was aborted: the engine is shutting down.", "ServiceUnavailableError")
            return web.json_response(active.response_body())
        if outcome == "finished":
            await response.write_eof()
        return response

    async def _preprocess(self, active: ActiveRequest) -> None:
        """The frontend stage (sched.frontend): wait for an API server and preprocess the images not
        in the multimodal cache, before the scheduler sees the request (and before a stream's headers,
        as vLLM sends them once preprocessing is done)."""
        items = active.parsed.image_items
        if not items:
            return
        visit = self.frontend.admit(active.arrival_s, items)
        self.metrics.mm_cache_queries.inc(visit.queries)
        if visit.hits:
            self.metrics.mm_cache_hits.inc(visit.hits)
        active.image_fresh = visit.fresh
        assert self.loop is not None
        delay = visit.ready_s - self.loop.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        active.queued_s = visit.ready_s

    def _assign_stream_faults(self, active: ActiveRequest) -> None:
        faults = self.config.faults
        if not active.parsed.stream:
            return
        if faults.stall_after_tokens is None and faults.drop_after_tokens is None:
            return
        if faults.fault_rate < 1.0 and self.fault_rng.random() >= faults.fault_rate:
            return
        if faults.stall_after_tokens is not None:
            active.stall_after = faults.stall_after_tokens
            active.stall_duration_s = faults.stall_s
            active.stalled_forever = faults.stall_s is None
        if faults.drop_after_tokens is not None:
            active.drop_after = faults.drop_after_tokens

    # -- other routes ------------------------------------------------------------------------
    async def tokenize(self, _request: web.Request, body: JSONValue) -> web.StreamResponse:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        if "messages" in body:
            parsed = parse_generation_request({**body, "stream": False, "max_tokens": None}, "chat", self.config, self.images)
        elif "prompt" in body:
            parsed = parse_generation_request(
                {**body, "stream": False, "max_tokens": None}, "completion", self.config, self.images
            )
        else:
            raise bad_request("'prompt' or 'messages' is required")
        tokens = parsed.prompt_token_ids
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens, "token_strs": None}
        )

    async def models(self, _request: web.Request) -> web.Response:
        created = int(time.time())
        data: list[JSONObject] = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.config.model,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "permission": [],
            }
            for name in self.config.model_names
        ]
        data += [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": name,
                "parent": self.config.model_names[0],
                "max_model_len": self.config.max_model_len,
                "permission": [],
            }
            for name in self.config.lora_modules
        ]  # as vLLM lists its adapters
        return web.json_response({"object": "list", "data": data})

    async def health(self, _request: web.Request) -> web.Response:
        if not self.ready:
            return error_response(ApiError(503, "The engine is starting up.", "ServiceUnavailableError"))
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": f"sim-{__version__}", "engine": SIM_ENGINE_NAME})

    async def prometheus_metrics(self, _request: web.Request) -> web.Response:
        lora_slots = getattr(self.core, "lora_slots", None)
        if lora_slots is not None:  # vLLM's vllm:lora_requests_info, read from the scheduler at scrape time
            self.metrics.set_lora_info(lora_slots.config.max_loras, self.core.running, self.core.waiting)  # type: ignore[attr-defined]
        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def debug_timing(self, request: web.Request) -> web.Response:
        if self.timing is None:
            return web.json_response({"enabled": False})
        summary = {"enabled": True, **self.timing.summary()}
        if request.query.get("reset") in ("1", "true"):
            self.timing.reset()
        return web.json_response(summary)

    async def debug_state(self, _request: web.Request) -> web.Response:
        config = self.config
        return web.json_response(
            {
                "model": config.model,
                "mode": "constant" if config.constant_mode else "scheduler",
                "profile": None if config.constant_mode or config.gpu else (config.profile or "tiny-cpu"),
                "gpu": config.gpu,
                "tp": config.tp,
                "num_running": self.core.num_running,
                "num_waiting": self.core.num_waiting,
                "kv_usage": self.core.kv_usage,
                "num_preemptions": self.core.num_preemptions_total,
                "steps": self.loop.steps if self.loop else 0,
                "requests": self.request_counter,
                "scheduler": vars(config.scheduler_config()),
            }
        )


def _send_headers_now(response: web.StreamResponse) -> None:
    """aiohttp buffers headers until the first body write; SSE clients want them at once."""
    writer = getattr(response, "_payload_writer", None)
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()


# -- running it ----------------------------------------------------------------------------------
async def start_server(config: SimEngineConfig) -> tuple[web.AppRunner, SimEngine, int]:
    """Start the engine on config.host/port (port 0 = any free port); returns (runner, engine, port)."""
    engine = SimEngine(config)
    runner = web.AppRunner(engine.build_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site: web.BaseSite
    try:
        if config.cold_start_s > 0:
            sock = bound_socket(config.host, config.port)  # the port is ours from now on, as vLLM's
            try:
                await cold_start(config.cold_start_s, sock.getsockname()[1])
                site = web.SockSite(runner, sock, backlog=4096)
                await site.start()  # listens only now: connections were refused until here
            except BaseException:
                sock.close()
                raise
        else:
            site = web.TCPSite(runner, config.host, config.port, backlog=4096, reuse_address=True)
            await site.start()
    except OSError as err:
        await runner.cleanup()
        raise UserError(f"cannot listen on {config.host}:{config.port} ({err.strerror or err}); pick another --port") from None
    except BaseException:
        await runner.cleanup()
        raise
    sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
    port = sockets[0].getsockname()[1] if sockets else config.port
    engine.started_s = time.monotonic()  # the start-up fault's delay counts from serving, as before
    engine.ready_at_s = engine.started_s + config.faults.startup_delay_s
    return runner, engine, port


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port but not listening (connections to it are refused)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


COLD_START_WEIGHTS_SHARE = 0.6
"""The share of a sim cold start spent "loading weights"; the rest is "init engine" (profiling,
KV cache, warm-up), the two phases vLLM's own log lines time."""


async def cold_start(seconds: float, port: int) -> None:
    """Wait out a cold start, logging its phases in the words of vLLM 0.32's own log lines
    ("Model loading took ...", "init engine (...) took ..."), stamped as vLLM stamps them, so one log reader
    (deploy.cold_start) times both engines alike."""
    print(f"sim engine cold start: port {port} bound, serving in {seconds:g} s", flush=True)
    weights = seconds * COLD_START_WEIGHTS_SHARE
    await asyncio.sleep(weights)
    print(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim] Model loading took 0.00 GiB memory and {weights:.6f} seconds", flush=True
    )
    await asyncio.sleep(seconds - weights)
    print(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim] init engine (profile, create kv cache, warmup model) took "
        f"{seconds - weights:.2f} s",
        flush=True,
    )


async def serve(config: SimEngineConfig, on_ready: Callable[[int], None] | None = None) -> None:
    """Run until cancelled (SIGINT/SIGTERM in the CLI)."""
    runner, _engine, port = await start_server(config)
    if on_ready is not None:
        on_ready(port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def run_server(config: SimEngineConfig) -> None:
    """Blocking entry point for the CLI: uvloop when available, clean exit on SIGINT/SIGTERM."""
    import signal

    config.validate()

    def announce(port: int) -> None:
        quiet_garbage_collector()  # a stand-in for vLLM, whose API server freezes its start-up heap too
        print(f"sim engine serving {config.model_names[0]!r} on http://{config.host}:{port}", flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        try:
            await serve(config, announce)
        except asyncio.CancelledError:
            pass

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


class SimEngineThread:
    """A sim engine in a background thread of this process (port 0 picks a free port).

    `with SimEngineThread(SimEngineConfig(...)) as engine: httpx.get(engine.base_url + "/health")`
    """

    def __init__(self, config: SimEngineConfig) -> None:
        self.config = config
        self.port: int | None = None
        self.engine: SimEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> "SimEngineThread":
        self._thread = threading.Thread(target=self._main, name="sim-engine", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                runner, self.engine, self.port = await start_server(self.config)
            except BaseException as err:  # reported to the starting thread
                self._error = err
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

        asyncio.run(body())

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)

    def __enter__(self) -> "SimEngineThread":
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
