"""The job file: loading it, its models and values, and its errors naming file, line and field."""
