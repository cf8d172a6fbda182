"""The run's object store: code, manifests, logs, status and artifacts, and whose word counts."""
