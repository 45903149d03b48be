"""The network: topologies, topology files, the flow-level network and calibration."""
