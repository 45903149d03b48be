"""traces: the gradient-trace format (schema, writer, reader, validator) and shipped sample traces.

No torch here: the recorder that produces traces lives in ``igrt.recorder``.
"""
