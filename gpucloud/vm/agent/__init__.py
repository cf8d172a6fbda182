"""The VM agent: one stdlib-only Python package (Python >= 3.8) that runs a node's whole life
(stack, fetch, setup, run, log pump, heartbeat, watchdog, preemption guard, checkpoints,
artifacts, final status, self-teardown). The CLI ships it through the run's channel."""
