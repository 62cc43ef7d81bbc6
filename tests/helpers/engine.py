"""One real embedded vLLM engine for the whole test session (it takes about a minute to start).

Use the `embedded_engine` fixture (tests/conftest.py) rather than starting your own: every
engine costs a minute of the shared CPU and about 3.5 GB of memory. The engine runs under
the real supervisor, so it has passed the same readiness checks `vlmserve up` uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vlmserve.demo.run import demo_spec
from vlmserve.spec import DeploymentSpec
from vlmserve.deploy.supervisor import Supervisor

EMBEDDED_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class EmbeddedEngine:
    """Where the shared engine listens and what it serves."""

    base_url: str
    model: str
    model_path: str
    max_model_len: int
    log_path: Path
    pid: int
    spec: DeploymentSpec


@contextmanager
def start_embedded_engine(
    workdir: Path, *, max_model_len: int = EMBEDDED_MAX_MODEL_LEN, extra_args: tuple[str, ...] = (),
    tool_parser: str | None = "hermes",
) -> Iterator[EmbeddedEngine]:
    """Start the embedded model on free ports; stop it (whole process tree) on exit."""
    # The tests put a gateway in front of this engine (as `vlmserve up` does), and the gateway adds
    # per-request processor kwargs when it downscales images: the engine must accept them.
    # The feature-workload tests send tools with a named tool_choice: vLLM 0.32 loads a tool parser only
    # with --enable-auto-tool-choice, and refuses named and required tool_choice (400) without one.
    # The parser is not free: vLLM builds one per chat request, tools or not (a few ms of frontend
    # time on this machine), so timing tests start their engine with `tool_parser=None`.
    tool_flags = ("--enable-auto-tool-choice", "--tool-call-parser", tool_parser) if tool_parser else ()
    extra_args = ("--trust-request-mm-kwargs", *tool_flags, *extra_args)
    spec = demo_spec(max_model_len=max_model_len, name="test-embedded", extra_args=list(extra_args))
    with Supervisor(spec, state_dir=workdir) as supervisor:
        replica = supervisor.replicas[0]
        assert replica.pid is not None
        yield EmbeddedEngine(
            base_url=replica.plan.url,
            model=supervisor.served_model_name,
            model_path=supervisor.model_path,
            max_model_len=max_model_len,
            log_path=replica.plan.log_path,
            pid=replica.pid,
            spec=spec,
        )
