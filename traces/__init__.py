"""traces: the gradient-trace format (schema, writer, reader, validator) and shipped sample traces.

No torch here: the recorder that produces traces lives in ``igrt.trace.recorder``. A trace is a directory
holding ``manifest.json`` and one folder of Parquet parts per table, ``parts/<table>/`` (see
:mod:`traces.schema` for every column's meaning). ``traces.read_trace(DIR)`` loads it into numpy
columns; ``traces.open(DIR)`` validates it the same way and returns one pyarrow dataset per table
(:mod:`traces.tables`).
"""

from traces.reader import StepTimes, Trace, TraceWarning, read_manifest, read_trace
from traces.schema import SCHEMA_VERSION, TABLE_SCHEMAS, TABLES, Manifest, PartName, TraceError, part_files
from traces.tables import TraceTables, open_trace
from traces.writer import TraceWriter, write_manifest

# traces.open(DIR); not in __all__, so that a star import leaves the built-in open alone
open = open_trace

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "TABLE_SCHEMAS",
    "Manifest",
    "PartName",
    "StepTimes",
    "Trace",
    "TraceError",
    "TraceTables",
    "TraceWarning",
    "TraceWriter",
    "open_trace",
    "part_files",
    "read_manifest",
    "read_trace",
    "write_manifest",
]
