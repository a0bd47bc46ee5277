"""The launcher lives in tests/servers.py; re-exported for modules that import it from here."""

from servers import ServerHandle, free_port, launch_server, radixcluster_command  # noqa: F401
