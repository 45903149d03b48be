"""The real-network testbed: namespaces and shapers, collective measurements on real processes."""
