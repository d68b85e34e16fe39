"""The Prefect flows. Importing this package, before Prefect is imported, turns off the telemetry of
the temporary server Prefect starts for a command-line run (`python -m flows.pipeline`, as the README
says to run it, without make): it tried to reach Prefect's telemetry endpoint. A value the user set wins."""
import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
