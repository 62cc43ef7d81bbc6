"""Run history: one DuckDB file of run metadata and summaries, one Parquet of records per run.

Lives at `$VLMSERVE_HOME` (default `~/.local/share/vlmserve`): `runs.duckdb` and
`records/<run_id>.parquet`. Bench, sweep and the planner save here; `vlmserve runs`
and the report read from here. DuckDB allows one writing process at a time, so
opening retries briefly when another vlmserve process holds the file.
"""

from __future__ import annotations

import json
import secrets
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from vlmserve import paths
from vlmserve.errors import UserError
from vlmserve.results.blocks import RunMeta
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.results.summary import read_summary

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    started_at TIMESTAMP,
    label VARCHAR,
    target VARCHAR,
    model VARCHAR,
    server_version VARCHAR,
    simulated BOOLEAN,
    client_limited BOOLEAN,
    completed BIGINT,
    failed BIGINT,
    requests_per_s DOUBLE,
    output_tokens_per_s DOUBLE,
    ttft_p50_ms DOUBLE,
    ttft_p99_ms DOUBLE,
    tpot_p50_ms DOUBLE,
    load_spec JSON,
    deployment JSON,
    summary JSON,
    records_path VARCHAR
)
"""

RECORD_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("scheduled_at_s", pa.float64()),
        ("sent_at_s", pa.float64()),
        ("first_token_at_s", pa.float64()),
        ("finished_at_s", pa.float64()),
        ("chunk_times_s", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int64())),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("requested_prompt_tokens", pa.int64()),
        ("requested_output_tokens", pa.int64()),
        ("tokenizer_output_tokens", pa.int64()),
        ("image_count", pa.int64()),
        ("request_type", pa.string()),
        ("adapter", pa.string()),
        ("image_repeat", pa.bool_()),
        ("request_bytes", pa.int64()),
        ("upload_s", pa.float64()),
        ("trace_id", pa.string()),
        ("engine_ttft_s", pa.float64()),
        ("engine_queue_s", pa.float64()),
        ("engine_prefill_s", pa.float64()),
        ("reasoning_tokens", pa.int64()),
        ("tool_calls", pa.int64()),
        ("finish_reason", pa.string()),
        ("first_reasoning_at_s", pa.float64()),
        ("first_answer_at_s", pa.float64()),
        ("features", pa.list_(pa.string())),
        ("response_schema", pa.string()),
        ("offered_tools", pa.list_(pa.string())),
        ("tool_choice", pa.string()),
        ("named_tool", pa.string()),
        ("answer_text", pa.string()),
        ("tool_call_text", pa.string()),
        ("schema_valid", pa.bool_()),
        ("schema_error", pa.string()),
        ("tool_call_valid", pa.bool_()),
        ("tool_call_error", pa.string()),
        ("ok", pa.bool_()),
        ("error_kind", pa.string()),
        ("error_message", pa.string()),
        ("http_status", pa.int64()),
        ("workload", pa.string()),
        ("turn_index", pa.int64()),
        ("conversation_id", pa.string()),
        ("warmup", pa.bool_()),
        ("simulated", pa.bool_()),
        ("worker", pa.int64()),
    ]
)
"""Parquet columns of a records file: exactly the RequestRecord fields."""


def home_dir() -> Path:
    """The data root; the one rule is vlmserve.paths.home_dir."""
    return paths.home_dir()


def database_path() -> Path:
    return paths.runs_database()


def records_dir() -> Path:
    return paths.records_dir()


def new_run_id(started_at: datetime | None = None) -> str:
    """Sortable and unique: 20261121-143100-3fa9c2."""
    moment = started_at or datetime.now(timezone.utc)
    return f"{moment.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@contextmanager
def _connect(read_only: bool = False, wait_s: float = 15.0) -> Iterator[duckdb.DuckDBPyConnection]:
    path = database_path()
    if read_only and not path.exists():
        raise UserError(f"no run history yet at {path}; run `vlmserve bench` first")
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            connection = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as err:
            if "lock" not in str(err).lower() or time.monotonic() > deadline:
                raise UserError(f"cannot open run history {path}: {str(err).splitlines()[0]}") from None
            time.sleep(0.1)
    try:
        if not read_only:
            connection.execute(_SCHEMA)
        yield connection
    finally:
        connection.close()


def write_records_parquet(records: list[RequestRecord], path: str | Path, meta: RunMeta | None = None) -> Path:
    """One row per request; the `--records-out` format and the store's format.

    The run's id and its `client_limited` / `simulated` marks ride along as Parquet
    metadata, so a records file on its own still says whether its figures can be trusted.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = [record.to_row() for record in records]
    table = pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    if meta is not None:
        marks = {
            "vlmserve.run_id": meta.run_id or "",
            "vlmserve.client_limited": json.dumps(bool(meta.client_limited)),
            "vlmserve.simulated": json.dumps(meta.simulated),
        }
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **marks})
    pq.write_table(table, target)
    return target


def read_records_parquet(path: str | Path) -> list[RequestRecord]:
    table = pq.read_table(path)
    return [RequestRecord.from_row(row) for row in table.to_pylist()]


def _started_at(meta: RunMeta) -> datetime:
    text = meta.started_at
    if text:
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            pass
    return datetime.now(timezone.utc)


def save_run(result: RunResult) -> str:
    """Store a RunResult (records to Parquet, metadata and summary to DuckDB); returns its run_id."""
    summary = result.summary
    meta = summary.meta
    started = _started_at(meta)
    run_id = meta.run_id or new_run_id(started)
    meta.run_id = run_id
    if "client_limited" not in meta.model_fields_set:
        meta.client_limited = summary.client_limited
    records_path = write_records_parquet(result.records, records_dir() / f"{run_id}.parquet", meta)
    row = (
        run_id,
        started.astimezone(timezone.utc).replace(tzinfo=None),
        meta.label,
        meta.target,
        meta.model,
        meta.server_version,
        meta.simulated,
        summary.client_limited,
        summary.requests.completed,
        summary.requests.failed,
        summary.throughput.requests_per_s,
        summary.throughput.output_tokens_per_s,
        summary.ttft_ms.p50,
        summary.ttft_ms.p99,
        summary.tpot_ms.p50,
        json.dumps(meta.load_spec),
        json.dumps(meta.deployment),
        json.dumps(summary.to_dict(), default=str),
        str(records_path),
    )
    with _connect() as connection:
        placeholders = ",".join("?" * len(row))
        connection.execute(f"INSERT OR REPLACE INTO runs VALUES ({placeholders})", list(row))  # noqa: S608 - "?" only
    return run_id


def list_runs(limit: int | None = None, label: str | None = None) -> list[dict[str, object]]:
    """Newest first: one dict per run with the headline columns (not the full summary)."""
    if not database_path().exists():
        return []
    query = (
        "SELECT run_id, started_at, label, target, model, server_version, simulated, client_limited,"
        " completed, failed, requests_per_s, output_tokens_per_s, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms,"
        " coalesce(json_extract_string(summary, '$.meta.interrupted') = 'true', false) AS interrupted,"
        " json_extract_string(summary, '$.meta.tool') AS tool"
        " FROM runs"
    )
    params: list[str] = []
    if label is not None:
        query += " WHERE label = ?"
        params.append(label)
    query += " ORDER BY started_at DESC, run_id DESC"
    if limit is not None:
        query += f" LIMIT {int(limit)}"
    with _connect(read_only=True) as connection:
        cursor = connection.execute(query, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def load_run(run_id: str) -> RunResult:
    """The RunResult saved under `run_id` (a unique prefix is enough)."""
    with _connect(read_only=True) as connection:
        rows = connection.execute(
            "SELECT run_id, summary, records_path FROM runs WHERE run_id LIKE ? ORDER BY run_id", [f"{run_id}%"]
        ).fetchall()
    if not rows:
        raise UserError(f"no run '{run_id}' in {database_path()}; see `vlmserve runs list`")
    if len(rows) > 1 and rows[0][0] != run_id:
        raise UserError(f"run id '{run_id}' is ambiguous ({len(rows)} runs); give more of it")
    found_id, summary_text, records_path = rows[0]
    records = read_records_parquet(records_path) if records_path and Path(records_path).exists() else []
    summary = read_summary(json.loads(summary_text), f"run '{found_id}' in {database_path()}")
    summary.meta.run_id = found_id
    return RunResult(records=records, summary=summary)
