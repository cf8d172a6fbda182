"""What the user reads: plans, statuses, progress, JSON and CI output."""
