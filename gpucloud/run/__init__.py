"""One run from launch to teardown, and the commands around runs."""
