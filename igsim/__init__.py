"""igsim: a discrete-event network simulator (simpy + networkx) that costs release and packing policies."""
