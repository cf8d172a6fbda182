"""The state store: runs, attempts, the resource journal, events and phases."""
