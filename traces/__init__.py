"""traces: the gradient-trace format (schema, writer, reader, validator) and shipped sample traces.

No torch here: the recorder that produces traces lives in ``igrt.trace.recorder``. A trace is a directory
of Parquet parts plus ``manifest.json`` (see :mod:`traces.schema` for every column's meaning).
"""

from traces.reader import StepTimes, Trace, TraceWarning, read_manifest, read_trace
from traces.schema import SCHEMA_VERSION, TABLE_SCHEMAS, TABLES, Manifest, PartName, TraceError
from traces.writer import TraceWriter, write_manifest

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "TABLE_SCHEMAS",
    "Manifest",
    "PartName",
    "StepTimes",
    "Trace",
    "TraceError",
    "TraceWarning",
    "TraceWriter",
    "read_manifest",
    "read_trace",
    "write_manifest",
]
