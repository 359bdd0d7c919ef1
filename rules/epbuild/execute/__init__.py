"""Where jobs run: child processes with limits, the fork server, the host probe, the Dask executor and worker."""
