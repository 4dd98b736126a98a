"""The Python job API: `Client` talks to the coordinator, `Job` and `jobfile` describe jobs."""
