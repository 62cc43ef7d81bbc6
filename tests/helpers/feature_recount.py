"""An independent recount of the feature workloads' valid answers from a run's stored records.

Written apart from `vlmserve.bench.features.check` on purpose: it reads only the records file
(the answers as received and the names of the schemas sent), looks the schemas up in the
catalogue and validates with jsonschema's Draft 2020-12 validator directly, so a test can say
the bench's rates agree with a check that shares none of its code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pyarrow.parquet as pq

from vlmserve.bench.features.catalogue import RESPONSE_SCHEMAS, TOOLS


@dataclass
class Recount:
    structured: int = 0
    schema_valid: int = 0
    tools_judged: int = 0
    tools_valid: int = 0


def _valid(text: str, schema: dict) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def recount(records_path: Path) -> Recount:
    """Valid counts over the completed, measured requests of a records Parquet file."""
    counts = Recount()
    for row in pq.read_table(records_path).to_pylist():
        if not row["ok"] or row["warmup"]:
            continue
        if row["response_schema"]:
            counts.structured += 1
            counts.schema_valid += _valid(row["answer_text"] or "", RESPONSE_SCHEMAS[row["response_schema"]])
        if row["offered_tools"]:
            calls = json.loads(row["tool_call_text"]) if row["tool_call_text"] else []
            if not calls and row["tool_choice"] == "auto":
                continue
            counts.tools_judged += 1
            counts.tools_valid += bool(calls) and all(
                call["name"] in row["offered_tools"]
                and (row["tool_choice"] != "named" or call["name"] == row["named_tool"])
                and _valid(call["arguments"], TOOLS[call["name"]]["parameters"])
                for call in calls
            )
    return counts
