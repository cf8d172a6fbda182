"""The VM side: what runs on a node (the agent and its shim) and the wire format it shares with the CLI."""
